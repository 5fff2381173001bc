// -md / --model-draft in `fitllm run`, `chat` and `plan`: the same greedy text as without it, a
// draft with another vocabulary refused naming both files, the draft in the plan and the budget.
#include <gtest/gtest.h>

#include <string>

#include "test_support.h"

namespace fitllm {
namespace {

std::string data(const char* name) {
    return (test::source_dir() / "tests/model/data" / name).string();
}

TEST(DraftModelCli, RunAndChatGiveTheSameGreedyText) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    const std::string m = "'" + model->string() + "'";
    const std::string run =
        test::fitllm_exe() + " run -m " + m + " -p 'The three primary colours are' -n 40 --temp 0 -t 2";
    const test::CommandResult plain = test::run_command(run + " 2>/dev/null");
    const test::CommandResult spec = test::run_command(run + " -md " + m + " --draft-max 5 2>&1 >/dev/null");
    const test::CommandResult spec_text = test::run_command(run + " -md " + m + " --draft-max 5 2>/dev/null");
    ASSERT_EQ(plain.status, 0) << plain.output;
    ASSERT_EQ(spec.status, 0) << spec.output;
    EXPECT_EQ(spec_text.output, plain.output);
    EXPECT_NE(spec.output.find("draft model: "), std::string::npos) << spec.output;
    EXPECT_NE(spec.output.find("the draft model's"), std::string::npos) << spec.output;  // in the pools line

    // Two turns: the draft model's cache follows the conversation.
    const std::string input = "printf 'Name three fruits.\\nAnd three vegetables.\\n' | ";
    const std::string chat = test::fitllm_exe() + " chat -m " + m + " --temp 0 -n 32 -t 2 2>/dev/null";
    const test::CommandResult chat_plain = test::run_command(input + chat);
    const test::CommandResult chat_spec = test::run_command(input + chat + " -md " + m);
    ASSERT_EQ(chat_plain.status, 0) << chat_plain.output;
    ASSERT_EQ(chat_spec.status, 0) << chat_spec.output;
    EXPECT_EQ(chat_spec.output, chat_plain.output);
}

TEST(DraftModelCli, ADraftWithAnotherVocabularyIsAUsageError) {
    const std::string llama = data("tiny-llama-q8_0.gguf");
    const std::string qwen = data("tiny-qwen2-q8_0.gguf");
    const test::CommandResult r =
        test::run_command(test::fitllm_exe() + " run -m '" + llama + "' -md '" + qwen + "' -p hello -n 4 -t 1 2>&1");
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(llama), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(qwen), std::string::npos) << r.output;
    const test::CommandResult both = test::run_command(test::fitllm_exe() + " run -m '" + llama + "' -md '" + llama +
                                                       "' --lookup -p hello -n 4 -t 1 2>&1");
    EXPECT_EQ(both.status, 2) << both.output;
    EXPECT_NE(both.output.find("--lookup and -md"), std::string::npos) << both.output;
}

TEST(DraftModelCli, PlanShowsTheDraftAndRefusesWhenBothDoNotFit) {
    const std::string target = data("tiny-llama-q8_0.gguf");
    const std::string draft = data("tiny-llama-f16.gguf");
    const std::string plan = test::fitllm_exe() + " plan -m '" + target + "' -md '" + draft + "' -c 256 -t 1";
    const test::CommandResult r = test::run_command(plan + " --mem 256M 2>&1");
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("draft model (-md):"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("less"), std::string::npos) << r.output;
    const test::CommandResult json = test::run_command(plan + " --mem 256M --json 2>&1");
    EXPECT_NE(json.output.find("\"draft\""), std::string::npos) << json.output;
    // 16 MiB hold the model alone (11.5 MiB planned) or the draft alone (12.5 MiB), not both.
    const test::CommandResult alone =
        test::run_command(test::fitllm_exe() + " plan -m '" + target + "' -c 256 -t 1 --mem 16M 2>&1");
    const test::CommandResult tight = test::run_command(plan + " --mem 16M 2>&1");
    EXPECT_EQ(alone.status, 0) << alone.output;
    EXPECT_EQ(tight.status, 3) << tight.output;
    const test::CommandResult run = test::run_command(test::fitllm_exe() + " run -m '" + target + "' -md '" + draft +
                                                      "' -c 256 -t 1 --mem 16M -p hello -n 4 2>&1");
    EXPECT_EQ(run.status, 3) << run.output;
    EXPECT_NE(run.output.find("draft model"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace fitllm
