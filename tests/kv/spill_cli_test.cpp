// `fitllm run --kv-spill-dir DIR --kv-resident SIZE` (issue 6): the same text as without spill on a
// tiny Llama, also across context shifts (which rewrite K of spilled layers), and clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "kv/cache_test_support.h"
#include "model/tiny_llama.h"
#include "test_support.h"

namespace fitllm {
namespace {

namespace fs = std::filesystem;

TEST(KvSpillCli, RunGivesTheSameTextAndErrorsNameTheProblem) {
    const test::TempDir tmp;
    const fs::path model = tmp / "tiny-llama.gguf";
    test::write_file(model, test::tiny_llama_bytes({.rope_freqs = true, .with_vocab = true}));
    std::string why_not;
    const fs::path dir = kv::test::spill_test_dir("cli", why_not);
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    // -c 16 with --context-shift: 48 cells; a layer's K+V is 48 x 2 x 2 heads x 8 x 2 bytes = 3 KiB,
    // so 4K keeps one of the two layers in memory at a time.
    const std::string base = test::fitllm_exe() + " run -m '" + model.string() +
                             "' -p 'a b c' -n 30 --temp 0 -t 1 -c 16 --context-shift --keep 1";
    const test::CommandResult plain = test::run_command(base + " 2>/dev/null");
    ASSERT_EQ(plain.status, 0) << plain.output;
    ASSERT_FALSE(plain.output.empty());
    const test::CommandResult spilled =
        test::run_command(base + " --kv-spill-dir '" + dir.string() + "' --kv-resident 4K 2>/dev/null");
    ASSERT_EQ(spilled.status, 0) << spilled.output;
    EXPECT_EQ(spilled.output, plain.output);
    EXPECT_TRUE(fs::is_empty(dir)) << "the spill file has no name";

    const test::CommandResult missing =
        test::run_command(base + " --kv-spill-dir '" + (dir / "missing").string() + "' --kv-resident 4K 2>&1");
    EXPECT_NE(missing.status, 0);
    EXPECT_NE(missing.output.find("KV spill directory '" + (dir / "missing").string() + "'"), std::string::npos)
        << missing.output;
    const test::CommandResult bad_size = test::run_command(base + " --kv-spill-dir /tmp --kv-resident lots 2>&1");
    EXPECT_EQ(bad_size.status, 2) << bad_size.output;
    EXPECT_NE(bad_size.output.find("--kv-resident"), std::string::npos) << bad_size.output;
}

}  // namespace
}  // namespace fitllm
