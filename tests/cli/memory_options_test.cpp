// --mem, --fit, --mlock and --stream-layers on the generating commands (run, chat, bench,
// perplexity): a plan over the budget is refused before loading (exit 3) with the pool that does
// not fit and the plan; --fit picks settings and says why; the summary shows each pool's peak.
#include <gtest/gtest.h>

#include <span>
#include <string>

#include "test_support.h"

namespace fitllm {
namespace {

std::string tiny_llama() {
    return (test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string();
}
bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

TEST(MemoryOptions, RunOverTheBudgetIsRefusedNamingThePool) {
    const auto r =
        test::run_command(test::fitllm_exe() + " run -m " + tiny_llama() + " -p 'a b' -n 4 -t 1 --mem 1M 2>&1");
    EXPECT_EQ(r.status, 3) << r.output;
    for (const char* part : {"the plan does not fit the memory budget", "pool 'overhead' asked for",
                             "device 'host' has 1.00 MiB free of its 1.00 MiB", "weights resident", "KV cache",
                             "fits               no", "use --fit"}) {
        EXPECT_TRUE(has(r.output, part)) << "missing '" << part << "' in:\n" << r.output;
    }
    EXPECT_FALSE(has(r.output, "prompt:")) << r.output;  // refused before loading anything

    // Room for the overhead but not the weights: the message names the weights pool.
    const auto w =
        test::run_command(test::fitllm_exe() + " run -m " + tiny_llama() + " -p 'a b' -n 4 -t 1 --mem 8.5M 2>&1");
    EXPECT_EQ(w.status, 3) << w.output;
    EXPECT_TRUE(has(w.output, "pool 'weights' asked for")) << w.output;
    EXPECT_TRUE(has(w.output, "in use: overhead")) << w.output;
}

TEST(MemoryOptions, RunSummaryShowsThePeakOfEachPool) {
    const auto r = test::run_command(test::fitllm_exe() + " run -m " + tiny_llama() +
                                     " -p 'a b c' -n 4 --temp 0 -t 1 -c 256 --mem 64M 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* part :
         {"peak RSS", "pools (peak): overhead", "weights", "scratch", "kv", "logits", "of the 64.0 MiB budget, plan"}) {
        EXPECT_TRUE(has(r.output, part)) << "missing '" << part << "' in:\n" << r.output;
    }
}

// The tiny model at -c 4096: 13.6 MiB with an f16 cache, 11.8 MiB with q8_0, 10.8 MiB with q4_0.
TEST(MemoryOptions, FitQuantizesTheCacheAndSaysWhy) {
    const std::string base =
        test::fitllm_exe() + " run -m " + tiny_llama() + " -p 'a b c' -n 4 --temp 0 -t 1 -c 4096 -b 64 --mem 12.5M";
    const auto refused = test::run_command(base + " 2>&1");
    EXPECT_EQ(refused.status, 3) << refused.output;

    const auto r = test::run_command(base + " --fit 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* part : {"fitllm run --fit: KV cache f16/f16 -> q8_0/q8_0", "why: over budget by",
                             "-c 4096 -ctk q8_0 -ctv q8_0, 0 of 2 layers streamed", "generated: 4 tokens"}) {
        EXPECT_TRUE(has(r.output, part)) << "missing '" << part << "' in:\n" << r.output;
    }

    // Already fits: --fit changes nothing and says so.
    const auto same = test::run_command(test::fitllm_exe() + " run -m " + tiny_llama() +
                                        " -p 'a b c' -n 2 -t 1 -c 256 --mem 1G --fit 2>&1");
    ASSERT_EQ(same.status, 0) << same.output;
    EXPECT_TRUE(has(same.output, "fits as asked, -c 256 -ctk f16 -ctv f16")) << same.output;
}

// Nothing fits even with --fit: refused, exit 3, saying so.
TEST(MemoryOptions, FitThatCannotFitIsRefused) {
    const auto r =
        test::run_command(test::fitllm_exe() + " run -m " + tiny_llama() + " -p 'a b' -n 2 -t 1 --mem 2M --fit 2>&1");
    EXPECT_EQ(r.status, 3) << r.output;
    EXPECT_TRUE(has(r.output, "nothing fits even with --fit")) << r.output;
}

TEST(MemoryOptions, BenchChatAndPerplexityTakeTheBudgetToo) {
    const auto bench =
        test::run_command(test::fitllm_exe() + " bench -m " + tiny_llama() + " -p 8 -n 4 -r 1 -t 1 --mem 1M 2>&1");
    EXPECT_EQ(bench.status, 3) << bench.output;
    EXPECT_TRUE(has(bench.output, "fitllm bench: the plan does not fit")) << bench.output;
    const auto bench_ok =
        test::run_command(test::fitllm_exe() + " bench -m " + tiny_llama() + " -p 8 -n 4 -r 1 -t 1 --mem 64M 2>&1");
    ASSERT_EQ(bench_ok.status, 0) << bench_ok.output;
    EXPECT_TRUE(has(bench_ok.output, "pools (peak): overhead")) << bench_ok.output;

    const auto chat = test::run_command("printf 'hi\\n' | " + test::fitllm_exe() + " chat -m " + tiny_llama() +
                                        " -t 1 --mem 1M 2>&1");
    EXPECT_EQ(chat.status, 3) << chat.output;
    EXPECT_TRUE(has(chat.output, "fitllm chat: the plan does not fit")) << chat.output;

    const test::TempDir dir;
    std::string text;
    for (int i = 0; i < 200; ++i) text += "a b c d e f g ";
    test::write_file(dir / "text.txt", std::as_bytes(std::span(text.data(), text.size())));
    const std::string ppl = test::fitllm_exe() + " perplexity -m " + tiny_llama() + " -f " +
                            (dir / "text.txt").string() + " -c 64 --chunks 2 -t 1";
    const auto ppl_refused = test::run_command(ppl + " --mem 1M 2>&1");
    EXPECT_EQ(ppl_refused.status, 3) << ppl_refused.output;
    const auto ppl_ok = test::run_command(ppl + " --mem 64M 2>&1");
    ASSERT_EQ(ppl_ok.status, 0) << ppl_ok.output;
    EXPECT_TRUE(has(ppl_ok.output, "Final estimate")) << ppl_ok.output;
    EXPECT_TRUE(has(ppl_ok.output, "pools (peak): overhead")) << ppl_ok.output;
}

// The plan is no smaller than what the run charges: a budget of exactly the plan's total runs,
// a batch of the full -b included (the model's scratch grows to it).
TEST(MemoryOptions, ABudgetOfExactlyThePlanRuns) {
    std::string prompt = "a";
    for (int i = 0; i < 80; ++i) prompt += " b c";
    for (const char* kv : {"f16", "q4_0"}) {
        const std::string settings = " -m " + tiny_llama() + " -c 300 -b 64 -t 1 -ctk " + kv + " -ctv " + kv;
        const auto plan = test::run_command(test::fitllm_exe() + " plan --json" + settings);
        ASSERT_EQ(plan.status, 0) << plan.output;
        const size_t at = plan.output.find("\"total\": ");
        ASSERT_NE(at, std::string::npos) << plan.output;
        const std::string total = std::to_string(std::stoull(plan.output.substr(at + 9)));
        const auto r = test::run_command(test::fitllm_exe() + " run" + settings + " -p '" + prompt +
                                         "' -n 4 --temp 0 --mem " + total + " 2>&1");
        ASSERT_EQ(r.status, 0) << r.output;
        EXPECT_TRUE(has(r.output, "prompt: 162 tokens")) << r.output;
        const auto less = test::run_command(test::fitllm_exe() + " run" + settings + " -p 'a b' -n 1 --mem " +
                                            std::to_string(std::stoull(total) - 1) + " 2>&1");
        EXPECT_EQ(less.status, 3) << less.output;
    }
}

// --stream-layers streams the last layers from the file: the same text, the buffers in "staging".
TEST(MemoryOptions, StreamedLayersGiveTheSameText) {
    const std::string run = test::fitllm_exe() + " run -m " + tiny_llama() + " -p 'a b c' -n 6 --temp 0 -t 1 -c 64";
    const auto resident = test::run_command(run + " 2>/dev/null");
    const auto streamed = test::run_command(run + " --stream-layers 1 2>/dev/null");
    ASSERT_EQ(resident.status, 0);
    ASSERT_EQ(streamed.status, 0);
    EXPECT_EQ(streamed.output, resident.output);
    const auto summary = test::run_command(run + " --stream-layers 2 2>&1 >/dev/null");
    ASSERT_EQ(summary.status, 0) << summary.output;
    EXPECT_TRUE(has(summary.output, "staging")) << summary.output;
}

// A charge over the budget while running (bench's -np test makes a cache of its own after the
// planned session: 64 sequences x 416 cells here) ends the command with the BudgetError's
// message: the pool, the bytes asked for, what each pool holds. No crash.
// bench's -np test is planned with the rest (it used to be left out of the plan and end the run
// half-way with a budget error, exit status 1): refused before loading, naming the pool.
TEST(MemoryOptions, BenchParallelTestIsPlannedAndRefusedNamingThePool) {
    const auto r = test::run_command(test::fitllm_exe() + " bench -m " + tiny_llama() +
                                     " -p 8 -n 400 -b 8 -r 1 -t 1 -np 64 --mem 13M 2>&1");
    EXPECT_EQ(r.status, 3) << r.output;
    for (const char* part : {"fitllm bench: the plan does not fit the memory budget: out of memory budget: pool 'kv' "
                             "asked for 26.8 MiB (28134912 bytes)",
                             "26624 cells", "free of its 13.0 MiB", "in use: overhead 8.42 MiB, weights"}) {
        EXPECT_TRUE(has(r.output, part)) << "missing '" << part << "' in:\n" << r.output;
    }
}

TEST(MemoryOptions, BadValuesAreUsageErrors) {
    const std::string base = test::fitllm_exe() + " run -m " + tiny_llama() + " -p 'a' -n 1";
    const auto size = test::run_command(base + " --mem lots 2>&1");
    EXPECT_EQ(size.status, 2) << size.output;
    EXPECT_TRUE(has(size.output, "--mem")) << size.output;
    const auto layers = test::run_command(base + " --stream-layers -1 2>&1");
    EXPECT_EQ(layers.status, 2) << layers.output;
    EXPECT_TRUE(has(layers.output, "--stream-layers")) << layers.output;
}

// --mlock locks the resident weights within RLIMIT_MEMLOCK, or refuses with the numbers and
// locks nothing (ulimit -l lowered in the child's shell).
// (Raising it needs privileges; the locking case runs under the limit this process has.)
TEST(MemoryOptions, MlockWithinTheLimitOrRefusedWithNumbers) {
    const std::string run =
        test::fitllm_exe() + " run -m " + tiny_llama() + " -p 'a b' -n 2 --temp 0 -t 1 -c 64 --mlock";
    const auto refused = test::run_command("ulimit -l 64 && " + run + " 2>&1");
    EXPECT_NE(refused.status, 0) << refused.output;
    for (const char* part : {"--mlock: locking the resident weights",
                             "RLIMIT_MEMLOCK soft limit of 64.0 KiB (65536 "
                             "bytes",
                             "nothing locked"}) {
        EXPECT_TRUE(has(refused.output, part)) << "missing '" << part << "' in:\n" << refused.output;
    }
    const auto locked = test::run_command(run + " 2>&1");  // the tiny model's 1.04 MiB under this limit
    if (locked.status != 0 && has(locked.output, "RLIMIT_MEMLOCK")) {
        GTEST_SKIP() << "RLIMIT_MEMLOCK here is below the tiny model's weights: " << locked.output;
    }
    ASSERT_EQ(locked.status, 0) << locked.output;
    EXPECT_TRUE(has(locked.output, "mlock: ")) << locked.output;
    EXPECT_TRUE(has(locked.output, "of resident weights locked")) << locked.output;
}

}  // namespace
}  // namespace fitllm
