// `fitllm bench` on a written tiny Llama: the pp and tg tests, KV options, -np's batched tg test.
#include <gtest/gtest.h>

#include <string>

#include "model/tiny_llama.h"
#include "test_support.h"

namespace fitllm {
namespace {

std::string fitllm_exe() {
    return std::string(FITLLM_BINARY_DIR) + "/fitllm";
}

TEST(BenchCommand, RunsWithKvOptionsAndParallelSequences) {
    const test::TempDir dir;
    const std::filesystem::path path = dir / "tiny-llama.gguf";
    test::write_file(path, test::tiny_llama_bytes({.rope_freqs = true}));
    const test::CommandResult r = test::run_command(fitllm_exe() + " bench -m '" + path.string() +
                                                    "' -p 8 -n 6 -r 1 -t 1 -np 3 -ctk bf16 -ctv f32 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* want : {"KV cache: K BF16, V F32", "| pp8 |", "| tg6 |", "| tg6 x3 |"}) {
        EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
    }
    const test::CommandResult bad = test::run_command(fitllm_exe() + " bench -m x.gguf -np 0 2>&1");
    EXPECT_EQ(bad.status, 2) << bad.output;
}

}  // namespace
}  // namespace fitllm
