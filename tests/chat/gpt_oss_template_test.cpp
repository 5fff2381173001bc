// gpt-oss's chat template (OpenAI's "harmony" format: channels, a developer message, reasoning
// effort, TypeScript-like tool namespaces, tool calls) rendered by fitllm's Jinja engine byte for
// byte as jinja2 through Hugging Face transformers renders it (tools/gen_gpt_oss_template_goldens.py
// wrote tests/chat/fixtures/gpt-oss/goldens.json), the template's own raise_exception included.
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "chat/chat_template.h"
#include "test_support.h"

namespace fitllm::chat {
namespace {

using Json = nlohmann::ordered_json;

std::string read(const std::string& name) {
    std::ifstream in(test::source_dir() / "tests" / "chat" / "fixtures" / "gpt-oss" / name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(GptOssChatTemplate, RendersAsJinja2) {
    const std::string source = read("openai-gpt-oss.jinja");
    const std::string goldens_text = read("goldens.json");
    ASSERT_FALSE(source.empty());
    ASSERT_FALSE(goldens_text.empty());
    const Json goldens = Json::parse(goldens_text);
    std::tm now{};
    std::sscanf(goldens["now"].get<std::string>().c_str(), "%d-%d-%dT%d:%d:%d", &now.tm_year, &now.tm_mon, &now.tm_mday,
                &now.tm_hour, &now.tm_min, &now.tm_sec);
    now.tm_year -= 1900;
    now.tm_mon -= 1;
    const std::time_t seconds = timegm(&now);
    gmtime_r(&seconds, &now);
    const ChatTemplate tmpl = ChatTemplate::parse(source, "gpt-oss");
    int rendered = 0, raised = 0;
    for (const Json& c : goldens["cases"]) {
        SCOPED_TRACE(c["conversation"].get<std::string>() +
                     (c["add_generation_prompt"].get<bool>() ? " (generation prompt)" : ""));
        RenderOptions options;
        options.add_generation_prompt = c["add_generation_prompt"];
        options.bos_token = goldens["bos_token"];
        options.eos_token = goldens["eos_token"];
        options.extra_context = c["extra_context"];
        options.now = now;
        if (c.contains("output")) {
            EXPECT_EQ(tmpl.render(c["messages"], options), c["output"].get<std::string>());
            ++rendered;
        } else {
            try {
                tmpl.render(c["messages"], options);
                ADD_FAILURE() << "jinja2 raised, fitllm rendered";
            } catch (const TemplateError& e) {
                EXPECT_EQ(e.kind(), TemplateError::Kind::raised) << e.what();
                EXPECT_EQ(e.detail(), c["error"]["message"].get<std::string>());
            }
            ++raised;
        }
    }
    EXPECT_EQ(rendered, 12);
    EXPECT_EQ(raised, 4);
}

}  // namespace
}  // namespace fitllm::chat
