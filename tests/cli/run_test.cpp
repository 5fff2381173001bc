// `fitllm run`: the executable end to end on the demo model, and its usage errors.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "model/tiny_llama.h"
#include "test_support.h"

namespace fitllm {
namespace {

TEST(RunCommand, GreedyGenerationStreamsTextAndASummary) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    const test::CommandResult r = test::run_command(test::fitllm_exe() + " run -m '" + model->string() +
                                                    "' -p 'The capital of France is' -n 8 --temp 0 -t 2 -c 64 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    // llama.cpp's greedy continuation of this prompt (tests/model/goldens/gemma3-270m.json).
    EXPECT_EQ(r.output.rfind("The capital of France is the capital of the country of France.", 0), 0u) << r.output;
    EXPECT_NE(r.output.find("prompt: 6 tokens"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("generated: 8 tokens"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("peak RSS"), std::string::npos) << r.output;
}

// --lookup: the same greedy text on stdout, a summary line with the drafts, the draft rows of
// logits in the plan's logits pool (11 x 262144 floats = 11 MiB), and its usage errors.
TEST(RunCommand, LookupGivesTheSameGreedyTextAndReportsItsDrafts) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    const std::string base = test::fitllm_exe() + " run -m '" + model->string() +
                             "' -p 'one two three four five six seven, one two three four five six seven, one two' "
                             "-n 24 --temp 0 -t 2 -c 128";
    const test::CommandResult plain = test::run_command(base + " 2>/dev/null");
    const test::CommandResult spec = test::run_command(base + " --lookup 2>/dev/null");
    const test::CommandResult stats = test::run_command(base + " --lookup 2>&1 >/dev/null");
    ASSERT_EQ(plain.status, 0) << plain.output;
    ASSERT_EQ(spec.status, 0) << spec.output;
    EXPECT_EQ(spec.output, plain.output);
    EXPECT_NE(stats.output.find("lookup: "), std::string::npos) << stats.output;
    EXPECT_EQ(stats.output.find(" 0 accepted"), std::string::npos) << stats.output;
    EXPECT_NE(stats.output.find("logits 11.0 MiB"), std::string::npos) << stats.output;
    const test::CommandResult np = test::run_command(base + " --lookup -np 2 2>&1");
    EXPECT_EQ(np.status, 2) << np.output;
    EXPECT_NE(np.output.find("--lookup works with one sequence only"), std::string::npos) << np.output;
    const test::CommandResult ngram = test::run_command(base + " --lookup-ngram-min 3 --lookup-ngram-max 2 2>&1");
    EXPECT_EQ(ngram.status, 2) << ngram.output;
    EXPECT_NE(ngram.output.find("--lookup-ngram-max 2"), std::string::npos) << ngram.output;
    // A drafter's flag without its drafter is refused by name, not accepted and ignored.
    for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
             {" --lookup-ngram-min 2", "--lookup-ngram-min works with --lookup only"},
             {" --lookup --draft-p-min 0.5", "--draft-p-min works with -md (a draft model) only"},
             {" --draft-vocab 100", "--draft-vocab works with -md (a draft model) only"},
             {" --draft-max 4", "--draft-max works with --lookup or -md only"}}) {
        const test::CommandResult r = test::run_command(base + flags + " 2>&1");
        EXPECT_EQ(r.status, 2) << flags << ": " << r.output;
        EXPECT_NE(r.output.find(says), std::string::npos) << flags << ": " << r.output;
    }
}

// A written tiny random Llama (with an SPM vocabulary) runs end to end: load, prompt, decode.
TEST(RunCommand, RunsATinyLlamaFile) {
    const test::TempDir dir;
    const std::filesystem::path path = dir / "tiny-llama.gguf";
    test::write_file(path, test::tiny_llama_bytes({.rope_freqs = true, .with_vocab = true}));
    const test::CommandResult r = test::run_command(test::fitllm_exe() + " run -m '" + path.string() +
                                                    "' -p 'a b c' -n 4 --temp 0 -t 1 -c 32 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("prompt: 4 tokens"), std::string::npos) << r.output;  // <s> ▁a ▁b ▁c
    EXPECT_NE(r.output.find("generated: "), std::string::npos) << r.output;
}

// A full context stops generation with a message by default; --context-shift drops the oldest
// tokens after --keep and goes on (tiny Llama, -c 16).
TEST(RunCommand, ContextFullStopsOrShiftsWithContextShift) {
    const test::TempDir dir;
    const std::filesystem::path path = dir / "tiny-llama.gguf";
    test::write_file(path, test::tiny_llama_bytes({.rope_freqs = true, .with_vocab = true}));
    const std::string base =
        test::fitllm_exe() + " run -m '" + path.string() + "' -p 'a b c' -n 40 --temp 0 -t 1 -c 16";
    const test::CommandResult stop = test::run_command(base + " 2>&1");
    ASSERT_EQ(stop.status, 0) << stop.output;
    EXPECT_NE(stop.output.find("the context is full (16 tokens)"), std::string::npos) << stop.output;
    EXPECT_NE(stop.output.find("generated: 13 tokens"), std::string::npos) << stop.output;  // 4 prompt + 12 fed

    const test::CommandResult shift = test::run_command(base + " --context-shift --keep 1 2>&1");
    ASSERT_EQ(shift.status, 0) << shift.output;
    // Past the 13 tokens that fit (the random model may sample its end-of-text token before 40).
    const size_t at = shift.output.find("generated: ");
    ASSERT_NE(at, std::string::npos) << shift.output;
    EXPECT_GT(std::stoi(shift.output.substr(at + 11)), 13) << shift.output;
    EXPECT_NE(shift.output.find("context shifts: "), std::string::npos) << shift.output;
    EXPECT_EQ(shift.output.find("context is full"), std::string::npos) << shift.output;

    const test::CommandResult f32 = test::run_command(base + " -ctk f32 -ctv bf16 -n 4 2>&1");
    EXPECT_EQ(f32.status, 0) << f32.output;
}

// -np 3: three continuations decoded together, printed one after the other.
TEST(RunCommand, ParallelSequences) {
    const test::TempDir dir;
    const std::filesystem::path path = dir / "tiny-llama.gguf";
    test::write_file(path, test::tiny_llama_bytes({.rope_freqs = true, .with_vocab = true}));
    const test::CommandResult r = test::run_command(test::fitllm_exe() + " run -m '" + path.string() +
                                                    "' -p 'a b c' -n 6 --seed 5 -t 1 -c 64 -np 3 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* label : {"--- sequence 0 ---", "--- sequence 1 ---", "--- sequence 2 ---", "in 3 sequences"}) {
        EXPECT_NE(r.output.find(label), std::string::npos) << label << "\n" << r.output;
    }
    const test::CommandResult both =
        test::run_command(test::fitllm_exe() + " run -m '" + path.string() + "' -p 'a' -np 2 --context-shift 2>&1");
    EXPECT_EQ(both.status, 2) << both.output;
}

TEST(RunCommand, UsageErrorsExitWithStatus2) {
    const test::CommandResult bad_type = test::run_command(test::fitllm_exe() + " run -m x.gguf -p hi -ctk q3_k 2>&1");
    EXPECT_EQ(bad_type.status, 2) << bad_type.output;
    EXPECT_NE(bad_type.output.find("iq4_nl"), std::string::npos) << bad_type.output;  // lists the accepted types
    const test::CommandResult bad_keep =
        test::run_command(test::fitllm_exe() + " run -m x.gguf -p hi -c 8 --context-shift --keep 8 2>&1");
    EXPECT_EQ(bad_keep.status, 2) << bad_keep.output;
    const test::CommandResult no_model = test::run_command(test::fitllm_exe() + " run -p hi 2>&1");
    EXPECT_EQ(no_model.status, 2) << no_model.output;
    EXPECT_NE(no_model.output.find("-m MODEL is required"), std::string::npos) << no_model.output;
    const test::CommandResult bad_temp =
        test::run_command(test::fitllm_exe() + " run -m x.gguf -p hi --temp warm 2>&1");
    EXPECT_EQ(bad_temp.status, 2) << bad_temp.output;
    EXPECT_NE(bad_temp.output.find("--temp"), std::string::npos) << bad_temp.output;
    const test::CommandResult missing = test::run_command(test::fitllm_exe() + " run -m /nonexistent.gguf -p hi 2>&1");
    EXPECT_EQ(missing.status, 1) << missing.output;
    EXPECT_NE(missing.output.find("/nonexistent.gguf"), std::string::npos) << missing.output;
}

TEST(RunCommand, HelpListsTheOptions) {
    const test::CommandResult r = test::run_command(test::fitllm_exe() + " run --help");
    EXPECT_EQ(r.status, 0);
    for (const char* option : {"--model", "--prompt", "--n-predict", "--ctx-size", "--threads", "--temp", "--top-k",
                               "--top-p", "--min-p", "--seed", "--repeat-penalty", "--cache-type-k", "--cache-type-v",
                               "--no-kv-rotation", "--context-shift", "--keep", "--parallel"}) {
        EXPECT_NE(r.output.find(option), std::string::npos) << option;
    }
}

}  // namespace
}  // namespace fitllm
