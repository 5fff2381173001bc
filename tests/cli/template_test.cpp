// `fitllm template`: a conversation rendered through the demo model's (fallback) template.
#include <gtest/gtest.h>

#include "test_support.h"

namespace fitllm::cli {
namespace {

TEST(TemplateCommand, RendersTheDemoModelsConversation) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model not found (run scripts/setup.sh)";
    const std::string m = " -m '" + model->string() + "'";
    auto r = test::run_command(test::fitllm_exe() + " template" + m +
                               " --user 'Hi' --assistant 'Hello!' --user 'Bye' 2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output,
              "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
              "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    r = test::run_command(test::fitllm_exe() + " template" + m +
                          " --user 'Hi' --no-generation-prompt --ids 2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, "[2, 105, 2364, 107, 10979, 106, 107]\n");  // <bos><start_of_turn>user\nHi<end_of_turn>\n
    r = test::run_command(test::fitllm_exe() + " template" + m + " --user 'Hi' 2>&1 >/dev/null");
    EXPECT_NE(r.output.find("built-in Gemma template"), std::string::npos) << r.output;

    test::TempDir dir;
    const std::string messages = R"([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])";
    test::write_file(dir / "m.json", std::as_bytes(std::span(messages)));
    r = test::run_command(test::fitllm_exe() + " template" + m + " -f '" + (dir / "m.json").string() + "' 2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, "<bos><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n");

    // Bad input: clear errors, usage status 2.
    r = test::run_command(test::fitllm_exe() + " template" + m + " 2>&1");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.output.find("no messages"), std::string::npos) << r.output;
    const std::string bad = "[{\"role\": ";
    test::write_file(dir / "bad.json", std::as_bytes(std::span(bad)));
    r = test::run_command(test::fitllm_exe() + " template" + m + " -f '" + (dir / "bad.json").string() + "' 2>&1");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.output.find("not valid JSON"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace fitllm::cli
