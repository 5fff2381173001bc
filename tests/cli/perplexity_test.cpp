// fitllm perplexity --kl-divergence-base FILE [--kl-divergence]: the base run writes FILE (and
// nothing else), the compare run prints llama-perplexity's statistics, a bad or mismatched FILE
// fails naming it (exit 1), and --help documents both flags.
#include <gtest/gtest.h>

#include <filesystem>
#include <span>
#include <string>

#include "test_support.h"

namespace fitllm {
namespace {

std::filesystem::path tiny_llama() {
    return test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf";
}
bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

class PerplexityCli : public ::testing::Test {
protected:
    void SetUp() override {
        if (!std::filesystem::exists(tiny_llama())) GTEST_SKIP() << "tiny model absent (tools/gen_test_models.py)";
        std::string text;
        for (int i = 0; i < 200; ++i) text += "a b c d e f g ";
        test::write_file(dir_ / "text.txt", std::as_bytes(std::span(text.data(), text.size())));
    }
    std::string ppl(const std::string& options) const {
        return test::fitllm_exe() + " perplexity -m " + tiny_llama().string() + " -f " + (dir_ / "text.txt").string() +
               " -c 64 -t 1 " + options + " 2>&1";
    }
    std::string base() const { return (dir_ / "f16.kld").string(); }

    test::TempDir dir_;
};

TEST_F(PerplexityCli, BaseThenCompare) {
    const auto written = test::run_command(ppl("--chunks 3 --kl-divergence-base " + base()));
    ASSERT_EQ(written.status, 0) << written.output;
    EXPECT_TRUE(has(written.output, "Final estimate: PPL = ")) << written.output;
    EXPECT_TRUE(has(written.output, "KL base: 93 scored tokens' top 64 written to " + base())) << written.output;
    EXPECT_TRUE(std::filesystem::exists(base()));
    EXPECT_FALSE(std::filesystem::exists(base() + ".tmp"));

    const auto same = test::run_command(ppl("--chunks 3 -np 2 --kl-divergence-base " + base() + " --kl-divergence"));
    ASSERT_EQ(same.status, 0) << same.output;
    for (const char* part : {"Mean ln(PPL(Q)/PPL(base))     :   0.000000", "Mean PPL(Q)/PPL(base)         :   1.000000",
                             "Mean    KLD:   0.000000", "Maximum KLD:   0.000000", "Same top p: 100.000"}) {
        EXPECT_TRUE(has(same.output, part)) << "missing '" << part << "' in:\n" << same.output;
    }

    const auto q8 =
        test::run_command(ppl("--chunks 3 -ctk q8_0 -ctv q8_0 --kl-divergence-base " + base() + " --kl-divergence"));
    ASSERT_EQ(q8.status, 0) << q8.output;
    EXPECT_TRUE(has(q8.output, "Mean    KLD:")) << q8.output;
    EXPECT_FALSE(has(q8.output, "Maximum KLD:   0.000000")) << q8.output;
}

TEST_F(PerplexityCli, AMismatchedOrBrokenBaseFailsNamingIt) {
    ASSERT_EQ(test::run_command(ppl("--chunks 3 --kl-divergence-base " + base())).status, 0);
    const auto chunks = test::run_command(ppl("--chunks 2 --kl-divergence-base " + base() + " --kl-divergence"));
    EXPECT_EQ(chunks.status, 1) << chunks.output;
    EXPECT_TRUE(has(chunks.output, "fitllm perplexity: error: KL base '" + base() +
                                       "' does not match this run: made over 3 chunks, this run evaluates 2"))
        << chunks.output;
    EXPECT_FALSE(has(chunks.output, "Final estimate")) << chunks.output;  // refused before evaluating

    std::filesystem::resize_file(base(), std::filesystem::file_size(base()) - 100);
    const auto cut = test::run_command(ppl("--chunks 3 --kl-divergence-base " + base() + " --kl-divergence"));
    EXPECT_EQ(cut.status, 1) << cut.output;
    EXPECT_TRUE(has(cut.output, "KL base '" + base() + "': truncated")) << cut.output;

    const auto missing = test::run_command(ppl("--kl-divergence-base " + base() + ".none --kl-divergence"));
    EXPECT_EQ(missing.status, 1) << missing.output;
    EXPECT_TRUE(has(missing.output, "KL base '" + base() + ".none': cannot open")) << missing.output;

    const auto no_base = test::run_command(ppl("--kl-divergence"));
    EXPECT_EQ(no_base.status, 2) << no_base.output;
    EXPECT_TRUE(has(no_base.output, "--kl-divergence needs --kl-divergence-base FILE")) << no_base.output;

    // A base run that fails (here: a directory that does not exist) leaves no file behind.
    const std::string nowhere = (dir_ / "none" / "f16.kld").string();
    const auto unwritable = test::run_command(ppl("--chunks 3 --kl-divergence-base " + nowhere));
    EXPECT_EQ(unwritable.status, 1) << unwritable.output;
    EXPECT_TRUE(has(unwritable.output, "cannot create '" + nowhere + ".tmp'")) << unwritable.output;
}

TEST(PerplexityCliHelp, DocumentsTheKlFlags) {
    const auto r = test::run_command(test::fitllm_exe() + " perplexity --help");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(has(r.output, "--kl-divergence-base FILE")) << r.output;
    EXPECT_TRUE(has(r.output, "--kl-divergence ")) << r.output;
}

}  // namespace
}  // namespace fitllm
