// `fitllm chat`: a conversation piped through stdin on the demo model, /exit, and usage errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "test_support.h"

namespace fitllm {
namespace {

// How many prompt markers stdout holds: the one it starts with and each after a newline.
int count_markers(const std::string& out) {
    int n = out.rfind("> ", 0) == 0 ? 1 : 0;
    for (size_t at = out.find("\n> "); at != std::string::npos; at = out.find("\n> ", at + 1)) ++n;
    return n;
}

TEST(ChatCommand, TwoTurnsThenEndOfInput) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    const test::CommandResult r =
        test::run_command("printf 'Hi\\nWhat is 2+2?\\n' | " + test::fitllm_exe() + " chat -m '" + model->string() +
                          "' --temp 0 -n 16 -t 2 2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.output;
    // The first prompt, one after each of the two replies.
    EXPECT_EQ(count_markers(r.output), 3) << r.output;
    EXPECT_GT(r.output.size(), std::string("> \n> \n> \n").size()) << r.output;
}

// --lookup (speculative decoding by prompt lookup): the same greedy replies, over two turns, the
// second one fed after the first reply's cells (with drafts taken back). Draft passes run in the
// one-token arithmetic (model::Batch::token_order): before they did, the batch kernels a pass of 4
// or more drafts took turned a near-tie of the demo model on this prompt the other way.
TEST(ChatCommand, LookupGivesTheSameGreedyReplies) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    const std::string input =
        "printf 'Repeat after me: the cat sat on the mat, the dog sat on the log.\\nAnd once more, the same.\\n' | ";
    const std::string args = " chat -m '" + model->string() + "' --temp 0 -n 48 -t 2 2>/dev/null";
    const test::CommandResult plain = test::run_command(input + test::fitllm_exe() + args);
    const test::CommandResult spec = test::run_command(input + test::fitllm_exe() + args + " --lookup --draft-max 6");
    ASSERT_EQ(plain.status, 0) << plain.output;
    ASSERT_EQ(spec.status, 0) << spec.output;
    EXPECT_EQ(count_markers(spec.output), 3) << spec.output;
    EXPECT_EQ(spec.output, plain.output);
}

// -j SCHEMA: every reply (sampled, two turns) is JSON valid for the schema, the grammar started
// over for each one.
TEST(ChatCommand, EachReplyFollowsTheJsonSchema) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    const std::string schema =
        R"({"type":"object","properties":{"answer":{"type":"integer","minimum":0,"maximum":99}},)"
        R"("required":["answer"]})";
    const test::CommandResult r =
        test::run_command("printf 'What is 2+2?\nAnd 3+5?\n' | " + test::fitllm_exe() + " chat -m '" + model->string() +
                          "' --temp 1 --seed 7 -n 64 -t 2 -j '" + schema + "' 2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.output;
    ASSERT_EQ(count_markers(r.output), 3) << r.output;
    // "> REPLY\n> REPLY\n> \n" (a reply may span lines: the grammar allows JSON's whitespace): each
    // reply is {"answer": N} with 0 <= N <= 99.
    size_t at = 0;
    for (int turn = 0; turn < 2; ++turn) {
        ASSERT_EQ(r.output.compare(at, 2, "> "), 0) << r.output;
        const size_t end = r.output.find("\n> ", at);
        ASSERT_NE(end, std::string::npos) << r.output;
        const nlohmann::json reply = nlohmann::json::parse(r.output.substr(at + 2, end - at - 2));
        ASSERT_TRUE(reply.is_object()) << reply;
        ASSERT_EQ(reply.size(), 1u) << reply;
        ASSERT_TRUE(reply.at("answer").is_number_integer()) << reply;
        EXPECT_GE(reply.at("answer").get<int>(), 0);
        EXPECT_LE(reply.at("answer").get<int>(), 99);
        at = end + 1;
    }
    // A schema that is not one is a usage error naming the option.
    const test::CommandResult bad =
        test::run_command(test::fitllm_exe() + " chat -m '" + model->string() + "' -j '{\"type\": 5}' 2>&1 </dev/null");
    EXPECT_EQ(bad.status, 2) << bad.output;
    EXPECT_NE(bad.output.find("--json-schema"), std::string::npos) << bad.output;
}

TEST(ChatCommand, ExitCommandEndsTheConversation) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    const test::CommandResult r = test::run_command("printf 'Hi\\n/exit\\nStill here?\\n' | " + test::fitllm_exe() +
                                                    " chat -m '" + model->string() + "' --temp 0 -n 8 -t 2 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("/exit or Ctrl-D to quit"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("template:"), std::string::npos) << r.output;
    EXPECT_EQ(count_markers(r.output), 2) << r.output;  // no turn after /exit
}

TEST(ChatCommand, AFullContextEndsTheConversationCleanly) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    const test::CommandResult r =
        test::run_command("printf 'Hi\\nAgain\\nAnd again\\n' | " + test::fitllm_exe() + " chat -m '" +
                          model->string() + "' --temp 0 -n 64 -c 24 -t 2 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("context is full"), std::string::npos) << r.output;
}

TEST(ChatCommand, UsageErrorsExitWithStatus2) {
    const test::CommandResult no_model = test::run_command(test::fitllm_exe() + " chat 2>&1 </dev/null");
    EXPECT_EQ(no_model.status, 2) << no_model.output;
    EXPECT_NE(no_model.output.find("-m MODEL is required"), std::string::npos) << no_model.output;
    const test::CommandResult bad_top_p =
        test::run_command(test::fitllm_exe() + " chat -m x.gguf --top-p lots 2>&1 </dev/null");
    EXPECT_EQ(bad_top_p.status, 2) << bad_top_p.output;
    EXPECT_NE(bad_top_p.output.find("--top-p"), std::string::npos) << bad_top_p.output;
}

TEST(ChatCommand, HelpListsTheOptions) {
    const test::CommandResult r = test::run_command(test::fitllm_exe() + " chat --help");
    EXPECT_EQ(r.status, 0);
    for (const char* option : {"--model", "--ctx-size", "--threads", "--n-predict", "--system", "--temp", "--top-k",
                               "--top-p", "--min-p", "--seed"}) {
        EXPECT_NE(r.output.find(option), std::string::npos) << option;
    }
}

}  // namespace
}  // namespace fitllm
