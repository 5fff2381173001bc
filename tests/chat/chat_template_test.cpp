// The public API: rendering chat messages given as structs or JSON, extra template variables,
// and choosing the template for a model file (its own, or a built-in fallback and why).
#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "test_support.h"

namespace fitllm::chat {
namespace {

using Json = nlohmann::ordered_json;

std::string fixture_text(const std::string& relative) {
    std::ifstream in(test::source_dir() / "tests" / "chat" / "fixtures" / relative, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

const char* kChatML =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

TEST(ChatTemplateApi, RendersMessageStructsAndJsonAlike) {
    const ChatTemplate tmpl = ChatTemplate::parse(kChatML);
    const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hi"}};
    const std::string expected =
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    EXPECT_EQ(tmpl.render(messages, {}), expected);
    const Json json =
        Json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}});
    EXPECT_EQ(tmpl.render(json, {}), expected);
    EXPECT_EQ(tmpl.render(nlohmann::json(json), {}), expected);
    RenderOptions no_prompt;
    no_prompt.add_generation_prompt = false;
    EXPECT_EQ(tmpl.render(messages, no_prompt),
              expected.substr(0, expected.size() - std::string("<|im_start|>assistant\n").size()));
}

TEST(ChatTemplateApi, DefinesWhatHfDefines) {
    RenderOptions options;
    options.bos_token = "<s>";
    options.eos_token = "</s>";
    EXPECT_EQ(
        ChatTemplate::parse("{{ bos_token }}{{ eos_token }} {{ add_generation_prompt }} {{ tools }} {{ documents }} "
                            "{{ tools is defined }} {{ date_string is defined }}")
            .render(std::vector<ChatMessage>{}, options),
        "<s></s> True None None True False");
}

TEST(ChatTemplateApi, ExtraContextAddsAndOverridesVariables) {
    RenderOptions options;
    options.bos_token = "<s>";
    options.extra_context = {{"bos_token", "<BOS>"}, {"tools", Json::array({{{"z", 1}, {"a", 2}}})}};
    const ChatTemplate tmpl = ChatTemplate::parse("{{ bos_token }} {{ tools|tojson }}");
    EXPECT_EQ(tmpl.render(std::vector<ChatMessage>{}, options), "<BOS> [{\"z\": 1, \"a\": 2}]");
    // A plain nlohmann::json sorts keys, which tojson then shows; ordered_json keeps them.
    options.extra_context = nlohmann::json{{"tools", nlohmann::json::array({{{"z", 1}, {"a", 2}}})}};
    EXPECT_EQ(tmpl.render(std::vector<ChatMessage>{}, options), "<s> [{\"a\": 2, \"z\": 1}]");
}

TEST(ChatTemplateApi, MessagesKeepExtraFields) {
    const Json messages =
        Json::array({{{"role", "assistant"},
                      {"content", nullptr},
                      {"tool_calls", Json::array({{{"function", {{"name", "f"}, {"arguments", {{"x", 1}}}}}}})}}});
    EXPECT_EQ(
        ChatTemplate::parse("{% for m in messages %}{{ m.content }} {{ m.tool_calls[0].function.arguments|tojson }}"
                            "{% endfor %}")
            .render(messages, {}),
        "None {\"x\": 1}");
}

TEST(ChatTemplateApi, RejectsMessagesThatAreNotAListOfObjects) {
    const ChatTemplate tmpl = ChatTemplate::parse(kChatML);
    EXPECT_THROW(tmpl.render(Json::object(), {}), Error);
    EXPECT_THROW(tmpl.render(Json::array({"text"}), {}), Error);
}

TEST(ChatTemplateApi, RaiseExceptionReachesTheCaller) {
    const ChatTemplate tmpl = ChatTemplate::parse(fixture_text("templates/gemma-3-it.jinja"), "gemma");
    try {
        tmpl.render(std::vector<ChatMessage>{{"user", "a"}, {"user", "b"}}, {});
        FAIL() << "Gemma's template refuses two user turns in a row";
    } catch (const TemplateError& e) {
        EXPECT_EQ(e.kind(), TemplateError::Kind::raised);
        EXPECT_EQ(e.detail(), "Conversation roles must alternate user/assistant/user/assistant/...");
        EXPECT_EQ(e.line(), 19u);
        EXPECT_EQ(e.column(), 12u);
    }
}

// ---- the template for a model file ----

struct Model {
    std::vector<std::byte> bytes;
    gguf::GgufFile file;
};

Model model(const std::string& arch, const std::vector<std::string>& tokens, const std::string& tokenizer_model = "",
            const std::string& chat_template = "") {
    gguf::GgufWriter w;
    w.add_string("general.architecture", arch);
    if (!tokenizer_model.empty()) w.add_string("tokenizer.ggml.model", tokenizer_model);
    if (!tokens.empty()) w.add_string_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
    if (!chat_template.empty()) w.add_string("tokenizer.chat_template", chat_template);
    std::vector<std::byte> bytes = w.to_bytes();
    gguf::GgufFile file = gguf::GgufFile::parse(bytes, arch + ".gguf");
    return Model{std::move(bytes), std::move(file)};
}

TEST(ChatTemplateFallback, TheFilesOwnTemplateWins) {
    const Model m = model("llama", {"<|start_header_id|>"}, "gpt2", "{{ 'own' }}");
    const ResolvedTemplate r = template_for_model(m.file);
    EXPECT_FALSE(r.is_fallback);
    EXPECT_EQ(r.tmpl.render(std::vector<ChatMessage>{}, {}), "own");
    EXPECT_NE(r.source_description.find("tokenizer.chat_template"), std::string::npos);
}

TEST(ChatTemplateFallback, ABrokenTemplateInTheFileIsAnErrorNotAFallback) {
    const Model m = model("llama", {}, "", "{% if %}");
    try {
        template_for_model(m.file);
        FAIL();
    } catch (const TemplateError& e) {
        EXPECT_EQ(e.template_name(), "llama.gguf:tokenizer.chat_template");
    }
}

TEST(ChatTemplateFallback, ChoosesByArchitectureAndVocabulary) {
    struct Case {
        Model m;
        BuiltinFormat expected;
        const char* reason;
    };
    Case cases[] = {
        {model("gemma3", {"<start_of_turn>"}, "llama"), BuiltinFormat::gemma, "general.architecture is 'gemma3'"},
        {model("gemma2", {}), BuiltinFormat::gemma, "'gemma2'"},
        {model("llama", {"<|begin_of_text|>", "<|start_header_id|>"}, "gpt2"), BuiltinFormat::llama3,
         "<|start_header_id|>"},
        {model("qwen2", {"<|im_start|>", "<|im_end|>"}, "gpt2"), BuiltinFormat::chatml, "<|im_start|>"},
        {model("llama", {"<s>", "[INST]", "[/INST]"}, "llama"), BuiltinFormat::mistral, "[INST]"},
        {model("llama", {"<s>", "</s>"}, "llama"), BuiltinFormat::mistral, "SentencePiece"},
        {model("phi2", {"<|endoftext|>"}, "gpt2"), BuiltinFormat::chatml, "nothing identifies"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.m.file.source());
        const ResolvedTemplate r = template_for_model(c.m.file);
        EXPECT_TRUE(r.is_fallback);
        ASSERT_TRUE(r.builtin.has_value());
        EXPECT_EQ(*r.builtin, c.expected);
        EXPECT_NE(r.source_description.find(c.reason), std::string::npos) << r.source_description;
        EXPECT_NE(r.source_description.find(std::string(builtin_format_name(c.expected))), std::string::npos);
        EXPECT_EQ(r.tmpl.source(), builtin_template_source(c.expected));
    }
}

TEST(ChatTemplateFallback, BuiltinsAreThePublishedFixtureTexts) {
    EXPECT_EQ(builtin_template_source(BuiltinFormat::chatml), fixture_text("templates/chatml.jinja"));
    EXPECT_EQ(builtin_template_source(BuiltinFormat::llama3), fixture_text("templates/llama-3-instruct.jinja"));
    EXPECT_EQ(builtin_template_source(BuiltinFormat::gemma), fixture_text("templates/gemma-3-it.jinja"));
    EXPECT_EQ(builtin_template_source(BuiltinFormat::mistral),
              fixture_text("templates/mistral-7b-instruct-v0.1.jinja"));
}

// The demo model (Gemma 3 270M) carries no tokenizer.chat_template: it gets the Gemma fallback,
// which renders exactly as google/gemma-3's own template does under jinja2.
TEST(ChatTemplateDemoModel, UsesTheGemmaFallbackAndMatchesJinja2) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model not set up (scripts/setup.sh)";
    const gguf::GgufFile file = gguf::GgufFile::open(path->string());
    ASSERT_FALSE(file.has("tokenizer.chat_template"));
    const ResolvedTemplate r = template_for_model(file);
    EXPECT_TRUE(r.is_fallback);
    ASSERT_EQ(r.builtin, BuiltinFormat::gemma);
    EXPECT_NE(r.source_description.find("gemma3"), std::string::npos) << r.source_description;

    std::ifstream in(test::source_dir() / "tests" / "chat" / "fixtures" / "goldens.json");
    const Json goldens = Json::parse(in);
    std::ifstream conv_in(test::source_dir() / "tests" / "chat" / "fixtures" / "conversations.json");
    const Json conversations = Json::parse(conv_in);
    int compared = 0;
    for (const auto& golden : goldens["templates"]) {
        if (golden["template"] != "gemma-3-it" || !golden.contains("output")) continue;
        for (const auto& conv : conversations["conversations"]) {
            if (conv["name"] != golden["conversation"]) continue;
            RenderOptions options;
            options.add_generation_prompt = golden["add_generation_prompt"];
            options.bos_token = "<bos>";
            options.eos_token = "<eos>";
            options.extra_context = conv.value("extra_context", Json::object());
            EXPECT_EQ(r.tmpl.render(conv["messages"], options), golden["output"].get<std::string>())
                << golden["conversation"];
            ++compared;
        }
    }
    EXPECT_GE(compared, 10);
}

}  // namespace
}  // namespace fitllm::chat
