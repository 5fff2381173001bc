// The chat request's fields for tools and reasoning (server/chat_request.h): read into the
// shape templates want, and every wrong one refused by name; Ollama's shapes mapped to them.
#include "server/chat_request.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/chat_template.h"
#include "sampling/grammar.h"
#include "sampling/json_schema.h"
#include "server/api_error.h"
#include "server/chat_output.h"
#include "server/request.h"

namespace fitllm::server {
namespace {

using nlohmann::json;

ApiError refused(const json& body) {
    try {
        parse_completion_request(body, /*chat=*/true);
    } catch (const ApiError& e) {
        return e;
    }
    ADD_FAILURE() << "accepted: " << body.dump();
    return ApiError::unsupported("-", "-");
}

TEST(ChatRequestTools, ToolsAndToolMessagesRead) {
    const json tool = {{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
    const json body = {{"messages",
                        {{{"role", "user"}, {"content", "Weather in Paris?"}},
                         {{"role", "assistant"},
                          {"content", nullptr},
                          {"tool_calls",
                           {{{"id", "call_1"},
                             {"type", "function"},
                             {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}},
                         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18C"}}}},
                       {"tools", {tool}},
                       {"tool_choice", "auto"},
                       {"parallel_tool_calls", false},
                       {"chat_template_kwargs", {{"enable_thinking", false}}},
                       {"reasoning_format", "none"}};
    const CompletionRequest r = parse_completion_request(body, true);
    EXPECT_EQ(r.tools, json::array({tool}));
    EXPECT_FALSE(r.parallel_tool_calls);
    EXPECT_FALSE(r.split_reasoning);
    EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
    // The arguments as an object, as templates print them with tojson.
    EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"], json({{"city", "Paris"}}));
    EXPECT_EQ(r.messages[1]["tool_calls"][0]["id"], "call_1");
    EXPECT_EQ(r.messages[2]["tool_call_id"], "call_1");
    EXPECT_EQ(r.messages[2]["role"], "tool");

    // tool_choice none: the tools are not offered.
    json none = body;
    none["tool_choice"] = "none";
    EXPECT_TRUE(parse_completion_request(none, true).tools.is_null());
}

TEST(ChatRequestTools, BadToolFieldsNamed) {
    const json user = {{"role", "user"}, {"content", "hi"}};
    const auto with = [&user](json extra) {
        json b = {{"messages", {user}}};
        b.update(extra);
        return b;
    };
    EXPECT_EQ(refused(with({{"tool_choice", "required"}, {"tools", json::array()}})).param(), "tool_choice");
    EXPECT_EQ(refused(with({{"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}})).param(),
              "tool_choice");
    EXPECT_EQ(refused(with({{"tool_choice", "sometimes"}})).param(), "tool_choice");
    EXPECT_EQ(refused(with({{"tools", "x"}})).param(), "tools");
    EXPECT_EQ(refused(with({{"tools", {{{"type", "function"}, {"function", {{"description", "d"}}}}}}})).param(),
              "tools[0].function.name");
    EXPECT_EQ(refused(with({{"tools", {{{"type", "retrieval"}}}}})).param(), "tools[0].type");
    EXPECT_EQ(refused(with({{"functions", {{{"name", "f"}}}}})).param(), "functions");
    EXPECT_EQ(refused(with({{"chat_template_kwargs", 3}})).param(), "chat_template_kwargs");
    EXPECT_EQ(refused(with({{"chat_template_kwargs", {{"messages", 1}}}})).param(), "chat_template_kwargs.messages");
    EXPECT_EQ(refused(with({{"reasoning_format", "xml"}})).param(), "reasoning_format");
    const json bad_args = {
        {"messages",
         {user,
          {{"role", "assistant"},
           {"tool_calls", {{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{oops"}}}}}}}}}};
    EXPECT_EQ(refused(bad_args).param(), "messages[1].tool_calls[0].function.arguments");
    // Arguments nested deeper than a body may be: refused before they are built.
    json deep = bad_args;
    deep["messages"][1]["tool_calls"][0]["function"]["arguments"] = std::string(100000, '[') + std::string(100000, ']');
    EXPECT_EQ(refused(deep).param(), "messages[1].tool_calls[0].function.arguments");
    const json user_calls = {{"messages", {{{"role", "user"}, {"tool_calls", {{{"function", {{"name", "f"}}}}}}}}}};
    EXPECT_EQ(refused(user_calls).param(), "messages[0].tool_calls");
}

TEST(ChatRequestTools, OllamaShapes) {
    const json body = {{"model", "m"},
                       {"messages",
                        {{{"role", "user"}, {"content", "hi"}},
                         {{"role", "assistant"},
                          {"content", ""},
                          {"thinking", "hmm"},
                          {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", {{"x", 1}}}}}}}}},
                         {{"role", "tool"}, {"content", "42"}, {"tool_name", "f"}}}},
                       {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
                       {"think", false}};
    const OllamaRequest r = parse_ollama_request(body, /*chat=*/true);
    EXPECT_EQ(r.completion.tools.size(), 1u);
    EXPECT_EQ(r.completion.template_kwargs["enable_thinking"], false);
    EXPECT_EQ(r.completion.messages[1]["tool_calls"][0]["function"]["arguments"], json({{"x", 1}}));
    EXPECT_EQ(r.completion.messages[1]["reasoning_content"], "hmm");
    EXPECT_EQ(r.completion.messages[2]["name"], "f");
    json levels = body;
    levels["think"] = "high";
    EXPECT_THROW(parse_ollama_request(levels, true), ApiError);
}

}  // namespace
}  // namespace fitllm::server

namespace fitllm::server {
namespace {

// The forced call's grammar, per format: the text each format's parser reads as the call is a
// sentence of it, and the grammar holds the arguments to the parameters' schema.
TEST(ChatRequestTools, ForcedCallGrammarPerFormat) {
    const json tools = {
        {{"type", "function"},
         {"function",
          {{"name", "get_weather"},
           {"parameters",
            {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}}}},
        {{"type", "function"}, {"function", {{"name", "get_time"}}}}};
    // Every byte a token, so the matcher checks texts byte by byte.
    std::vector<std::string> texts;
    for (int b = 1; b < 256; ++b) texts.emplace_back(1, static_cast<char>(b));
    const auto vocab = std::make_shared<const sampling::GrammarVocab>(texts, std::vector<int32_t>{});
    struct Case {
        ToolCallFormat format;
        std::string call, wrong;
    };
    const Case cases[] = {
        {ToolCallFormat::hermes,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Oslo\"}}\n</tool_call>"},
        {ToolCallFormat::llama3, "{\"name\": \"get_time\", \"parameters\": {}}",
         "{\"name\": \"get_time\", \"arguments\": {}}"},
        {ToolCallFormat::mistral, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]",
         "[{\"name\": \"get_date\", \"arguments\": {}}]"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(tool_call_format_name(c.format));
        json body = {
            {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", tools}, {"tool_choice", "required"}};
        CompletionRequest r = parse_completion_request(body, /*chat=*/true);
        TemplateTraits traits;
        traits.takes_tools = true;
        traits.tools = c.format;
        force_tool_call(r, traits);
        ASSERT_TRUE(r.params.sampling.grammar);
        sampling::GrammarMatcher m(r.params.sampling.grammar, vocab);
        EXPECT_TRUE(m.allows_text(c.call));
        m.accept_text(c.call);
        EXPECT_TRUE(m.can_end());
        m.reset();
        EXPECT_FALSE(m.allows_text(c.wrong));
        const ParsedCalls parsed = parse_tool_calls(c.call, c.format);
        ASSERT_EQ(parsed.calls.size(), 1u);
        EXPECT_TRUE(parsed.rest.empty()) << parsed.rest;
    }
    // A named function: only its calls.
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                 {"tools", tools},
                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}};
    CompletionRequest r = parse_completion_request(body, /*chat=*/true);
    TemplateTraits traits;
    traits.tools = ToolCallFormat::llama3;
    force_tool_call(r, traits);
    sampling::GrammarMatcher m(r.params.sampling.grammar, vocab);
    EXPECT_FALSE(m.allows_text("{\"name\": \"get_weather\""));
    EXPECT_TRUE(m.allows_text("{\"name\": \"get_time\", \"parameters\": {}}"));
    // No call to force without tools; a name not offered; a second constraint.
    EXPECT_EQ(refused({{"messages", body["messages"]}, {"tool_choice", "required"}}).param(), "tool_choice");
    json unknown = body;
    unknown["tool_choice"]["function"]["name"] = "nope";
    EXPECT_EQ(refused(unknown).param(), "tool_choice");
    json both = body;
    both["response_format"] = {{"type", "json_object"}};
    CompletionRequest r2 = parse_completion_request(both, /*chat=*/true);
    try {
        force_tool_call(r2, traits);
        ADD_FAILURE() << "a forced call with response_format was accepted";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.param(), "tool_choice");
    }
}

chat::ChatTemplate fixture_template(const std::string& name) {
    std::ifstream f(std::string(FITLLM_SOURCE_DIR) + "/tests/chat/fixtures/templates/" + name + ".jinja");
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_FALSE(ss.str().empty()) << name;
    return chat::ChatTemplate::parse(ss.str(), name);
}

// A template that shows no tools (Gemma 3's) gets them in a system prompt, calls asked for and
// parsed in Hermes's format; the conversation's calls and results become text its roles allow.
TEST(ChatRequestTools, ATemplateWithoutToolsGetsThemInTheSystemPrompt) {
    const json tool = {{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"description", "The weather in a city"},
                         {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
    const chat::ChatTemplate gemma = fixture_template("gemma-3-it");
    ASSERT_FALSE(template_traits(gemma.source()).takes_tools);
    json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}, {"tools", {tool}}};
    CompletionRequest r = parse_completion_request(body, /*chat=*/true);
    chat::RenderOptions options;
    const TemplateTraits traits = prepare_render(r, gemma, options);
    EXPECT_EQ(traits.tools, ToolCallFormat::hermes);
    EXPECT_FALSE(options.extra_context.contains("tools"));
    ASSERT_EQ(r.messages.size(), 2u);
    EXPECT_EQ(r.messages[0]["role"], "system");
    const std::string system = r.messages[0]["content"];
    EXPECT_NE(system.find("<tools>\n" + tool["function"].dump() + "\n</tools>"), std::string::npos) << system;
    EXPECT_NE(system.find("<tool_call>"), std::string::npos) << system;
    const std::string prompt = gemma.render(r.messages, options);
    EXPECT_NE(prompt.find("\"get_weather\""), std::string::npos) << prompt;
    EXPECT_NE(prompt.find("Weather in Paris?"), std::string::npos) << prompt;
    // Forced: the grammar is Hermes's.
    body["tool_choice"] = "required";
    CompletionRequest forced = parse_completion_request(body, /*chat=*/true);
    chat::RenderOptions forced_options;
    force_tool_call(forced, prepare_render(forced, gemma, forced_options));
    ASSERT_TRUE(forced.params.sampling.grammar);
    std::vector<std::string> texts;
    for (int b = 1; b < 256; ++b) texts.emplace_back(1, static_cast<char>(b));
    sampling::GrammarMatcher m(forced.params.sampling.grammar,
                               std::make_shared<const sampling::GrammarVocab>(texts, std::vector<int32_t>{}));
    EXPECT_TRUE(m.allows_text("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"));

    // The request's own system message: the tools go after its text, one system message.
    json with_system = body;
    with_system.erase("tool_choice");
    with_system["messages"] = {{{"role", "system"}, {"content", "Be brief."}},
                               {{"role", "user"}, {"content", "Weather in Paris?"}},
                               {{"role", "assistant"},
                                {"content", nullptr},
                                {"tool_calls",
                                 {{{"id", "a"},
                                   {"type", "function"},
                                   {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}},
                                  {{"id", "b"},
                                   {"type", "function"},
                                   {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Lyon\"}"}}}}}}},
                               {{"role", "tool"}, {"tool_call_id", "a"}, {"content", "18C"}},
                               {{"role", "tool"}, {"tool_call_id", "b"}, {"content", "20C"}}};
    CompletionRequest conversation = parse_completion_request(with_system, /*chat=*/true);
    chat::RenderOptions conversation_options;
    prepare_render(conversation, gemma, conversation_options);
    ASSERT_EQ(conversation.messages.size(), 4u) << conversation.messages.dump();
    EXPECT_EQ(conversation.messages[0]["content"].get<std::string>().rfind("Be brief.\n\nYou may call", 0), 0u);
    EXPECT_EQ(conversation.messages[2]["role"], "assistant");
    EXPECT_EQ(conversation.messages[2]["content"],
              "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>\n"
              "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Lyon\"}}\n</tool_call>");
    EXPECT_FALSE(conversation.messages[2].contains("tool_calls"));
    EXPECT_EQ(conversation.messages[3],
              nlohmann::ordered_json(
                  {{"role", "user"},
                   {"content", "<tool_response>\n18C\n</tool_response>\n<tool_response>\n20C\n</tool_response>"}}));
    // Gemma 3's template, which refuses roles out of turn, renders it.
    const std::string text = gemma.render(conversation.messages, conversation_options);
    EXPECT_NE(text.find("<tool_response>\n20C\n</tool_response>"), std::string::npos) << text;

    // A template with tools keeps the messages as they are and gets the tools as its variable.
    const chat::ChatTemplate qwen = fixture_template("qwen2.5-instruct");
    CompletionRequest native = parse_completion_request(with_system, /*chat=*/true);
    chat::RenderOptions native_options;
    EXPECT_EQ(prepare_render(native, qwen, native_options).tools, ToolCallFormat::hermes);
    EXPECT_EQ(native.messages.size(), 5u);
    EXPECT_EQ(native_options.extra_context["tools"], json::array({tool}));
    // One that reads tools but writes calls in no format fitllm knows is refused.
    const chat::ChatTemplate odd =
        chat::ChatTemplate::parse("{% for t in tools %}{{ t }}{% endfor %}{{ messages[0].content }}", "odd");
    CompletionRequest refused_request = parse_completion_request(body, /*chat=*/true);
    chat::RenderOptions odd_options;
    try {
        prepare_render(refused_request, odd, odd_options);
        ADD_FAILURE() << "tools accepted by a template whose calls fitllm cannot parse";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.param(), "tools");
    }
}

// The harmony vocabulary as the grammar sees it: every byte a token (ids 0..254), then gpt-oss's
// structure tokens, user-defined (their text shown) but <|call|> (a control token that ends the
// generation: no text).
struct HarmonyVocab {
    std::shared_ptr<const sampling::GrammarVocab> vocab;
    std::map<std::string, int32_t> special;
};
HarmonyVocab harmony_vocab() {
    HarmonyVocab h;
    std::vector<std::string> texts;
    for (int b = 1; b < 256; ++b) texts.emplace_back(1, static_cast<char>(b));
    std::vector<std::pair<std::string, int32_t>> specials;
    for (const char* t : {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>"}) {
        const auto id = static_cast<int32_t>(texts.size());
        h.special[t] = id;
        specials.emplace_back(t, id);
        texts.emplace_back(std::string(t) == "<|call|>" ? "" : t);
    }
    h.vocab = std::make_shared<const sampling::GrammarVocab>(texts, std::vector<int32_t>{h.special["<|call|>"]},
                                                             std::move(specials));
    return h;
}

// Feeds a harmony output to the matcher a structure token or a byte at a time; false when the
// grammar refuses a step. The text as the detokenizer shows it (no <|call|>) goes to *shown.
bool feed_harmony(sampling::GrammarMatcher& m, const HarmonyVocab& h, const std::string& text, std::string* shown) {
    for (size_t i = 0; i < text.size();) {
        int32_t id = -1;
        size_t n = 1;
        for (const auto& [t, tid] : h.special) {
            if (text.compare(i, t.size(), t) == 0) id = tid, n = t.size();
        }
        if (id < 0) id = static_cast<uint8_t>(text[i]) - 1;
        if (!m.allows_token(id)) return false;
        m.accept_token(id);
        if (shown && id != h.special.at("<|call|>")) *shown += text.substr(i, n);
        i += n;
    }
    return true;
}

// gpt-oss (harmony): a forced call is a commentary message to one of the functions (or the named
// one), an analysis message before it optional, its body the arguments in the parameters' schema,
// ended by <|call|>; the structure tokens must be the tokens themselves, never spelled.
TEST(ChatRequestTools, HarmonyForcedCallGrammar) {
    const chat::ChatTemplate tmpl = []() {
        std::ifstream f(std::string(FITLLM_SOURCE_DIR) + "/tests/chat/fixtures/gpt-oss/openai-gpt-oss.jinja");
        std::stringstream ss;
        ss << f.rdbuf();
        return chat::ChatTemplate::parse(ss.str(), "gpt-oss");
    }();
    const json tools = {{{"type", "function"},
                         {"function",
                          {{"name", "get_weather"},
                           {"parameters",
                            {{"type", "object"},
                             {"properties",
                              {{"city", {{"type", "string"}, {"maxLength", 20}}},
                               {"unit", {{"enum", {"celsius", "fahrenheit"}}}},
                               {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 7}}}}},
                             {"required", {"city", "unit"}},
                             {"additionalProperties", false}}}}}},
                        {{"type", "function"}, {"function", {{"name", "get_time"}}}}};
    const HarmonyVocab h = harmony_vocab();
    auto forced = [&](const json& choice) {
        json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Oslo?"}}}},
                     {"tools", tools},
                     {"tool_choice", choice}};
        CompletionRequest r = parse_completion_request(body, /*chat=*/true);
        chat::RenderOptions options;
        const TemplateTraits traits = prepare_render(r, tmpl, options);
        EXPECT_EQ(traits.tools, ToolCallFormat::harmony);
        force_tool_call(r, traits);
        EXPECT_TRUE(r.params.sampling.grammar);
        return std::make_pair(r, traits);
    };
    const auto [r, traits] = forced("required");
    const std::string call =
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        "{\"city\": \"Oslo\", \"days\": 3, \"unit\": \"celsius\"}<|call|>";
    const std::string analysis = "<|channel|>analysis<|message|>The user wants 1<2 and a <b>.<|end|><|start|>assistant";
    for (const std::string& text : {call, analysis + call,
                                    std::string("<|channel|>commentary to=functions.get_time <|constrain|>json"
                                                "<|message|>{}<|call|>")}) {
        SCOPED_TRACE(text);
        sampling::GrammarMatcher m(r.params.sampling.grammar, h.vocab);
        std::string shown;
        EXPECT_TRUE(feed_harmony(m, h, text, &shown));
        EXPECT_TRUE(m.must_end());
        // What the output splitter makes of it: the call, and the analysis as reasoning.
        const std::optional<OutputOptions> o = output_options(r, traits, "");
        ASSERT_TRUE(o);
        const ParsedOutput out = split_output(shown, *o);
        ASSERT_EQ(out.calls.size(), 1u) << shown;
        EXPECT_TRUE(out.content.empty()) << out.content;
        EXPECT_EQ(out.reasoning.empty(), text.find("analysis") == std::string::npos);
    }
    // Not a call: wrong arguments, a function not offered, no <|call|>, the final channel, a marker
    // spelled with other tokens, "<|" in the analysis, a second message after the call.
    for (const std::string& text :
         {std::string("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": 1"),
          std::string("<|channel|>commentary to=functions.get_date"), std::string("<|channel|>final<|message|>"),
          std::string("<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|end|>"),
          std::string("<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>x"),
          std::string("<|channel|>analysis<|message|>a <|end|")}) {
        SCOPED_TRACE(text);
        sampling::GrammarMatcher m(r.params.sampling.grammar, h.vocab);
        EXPECT_FALSE(feed_harmony(m, h, text, nullptr));
    }
    sampling::GrammarMatcher spelled(r.params.sampling.grammar, h.vocab);
    EXPECT_FALSE(spelled.allows_token('<' - 1));  // "<|channel|>" spelled from "<", "|", ...
    // A named function: only its calls.
    const auto [named, named_traits] = forced({{"type", "function"}, {"function", {{"name", "get_time"}}}});
    sampling::GrammarMatcher m(named.params.sampling.grammar, h.vocab);
    EXPECT_FALSE(feed_harmony(m, h, "<|channel|>commentary to=functions.get_w", nullptr));
    m.reset();
    EXPECT_TRUE(feed_harmony(m, h, "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>",
                             nullptr));
}

// Rule names of each function's schema grammar get a prefix of their own, and nothing else does.
TEST(ChatRequestTools, HarmonyGrammarsOfSeveralFunctionsDoNotCollide) {
    const std::string gbnf = sampling::json_schema_to_gbnf(nlohmann::ordered_json::parse(
        R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}, "maxItems": 3}}})"));
    json tools = json::array();
    for (const char* name : {"f", "g"}) {
        tools.push_back(
            {{"type", "function"},
             {"function",
              {{"name", name}, {"parameters", json::parse(R"({"type": "object", "properties": {"a": {"type": "array",
                               "items": {"type": "number"}, "maxItems": 3}}, "required": ["a"]})")}}}});
    }
    CompletionRequest r = parse_completion_request(
        {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", tools}, {"tool_choice", "required"}},
        /*chat=*/true);
    TemplateTraits traits;
    traits.takes_tools = true;
    traits.tools = ToolCallFormat::harmony;
    traits.harmony = true;
    ASSERT_NO_THROW(force_tool_call(r, traits)) << gbnf;
    const HarmonyVocab h = harmony_vocab();
    for (const char* name : {"f", "g"}) {
        sampling::GrammarMatcher m(r.params.sampling.grammar, h.vocab);
        EXPECT_TRUE(feed_harmony(m, h,
                                 std::string("<|channel|>commentary to=functions.") + name +
                                     " <|constrain|>json<|message|>{\"a\": [1.5, -2, 30]}<|call|>",
                                 nullptr));
    }
    // A name the harmony header cannot hold.
    tools[0]["function"]["name"] = "get weather";
    CompletionRequest bad = parse_completion_request(
        {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", tools}, {"tool_choice", "required"}},
        /*chat=*/true);
    try {
        force_tool_call(bad, traits);
        ADD_FAILURE() << "a name with a space was accepted";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.param(), "tool_choice");
    }
}

}  // namespace
}  // namespace fitllm::server
