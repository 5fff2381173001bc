// Forced tool calls in gpt-oss's harmony format on the tiny gpt-oss model (random weights: the
// grammar does all the work): with tool_choice "required" or a named function, every sampled
// output, at several seeds, is a harmony call of the right function whose arguments validate
// against its parameters' schema (a nested object, enums, bounded numbers), as the server reads it
// (output_options, split_output).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "sampling/grammar.h"
#include "sampling/sampler.h"
#include "server/chat_output.h"
#include "server/chat_request.h"
#include "server/request.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::server {
namespace {

using nlohmann::json;

// "" when value validates against schema, else what does not and where. The keywords the tools
// below use: type, properties, required, additionalProperties false, enum, minimum, maximum,
// maxLength (code points), items, maxItems.
std::string invalid_against(const json& value, const json& schema, const std::string& at) {
    if (const auto e = schema.find("enum"); e != schema.end()) {
        for (const json& option : *e)
            if (option == value) return "";
        return at + ": " + value.dump() + " is not one of " + e->dump();
    }
    const std::string type = schema.value("type", "");
    if (type == "object") {
        if (!value.is_object()) return at + ": not an object";
        const json props = schema.value("properties", json::object());
        for (const json& r : schema.value("required", json::array()))
            if (!value.contains(r.get<std::string>())) return at + ": lacks " + r.dump();
        for (const auto& [k, v] : value.items()) {
            if (!props.contains(k)) {
                if (schema.value("additionalProperties", true) == false) return at + ": " + k + " is not a property";
                continue;
            }
            if (std::string e = invalid_against(v, props[k], at + "." + k); !e.empty()) return e;
        }
        return "";
    }
    if (type == "array") {
        if (!value.is_array()) return at + ": not an array";
        if (value.size() > schema.value("maxItems", size_t(-1))) return at + ": too many items";
        for (size_t i = 0; i < value.size(); ++i)
            if (std::string e = invalid_against(value[i], schema["items"], at + "[" + std::to_string(i) + "]");
                !e.empty())
                return e;
        return "";
    }
    if (type == "string") {
        if (!value.is_string()) return at + ": not a string";
        size_t n = 0;
        for (const char c : value.get<std::string>()) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
        return n <= schema.value("maxLength", size_t(-1)) ? "" : at + ": longer than maxLength";
    }
    if (type == "integer" || type == "number") {
        if (type == "integer" ? !value.is_number_integer() : !value.is_number()) return at + ": not a " + type;
        const double x = value.get<double>();
        if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return at + ": under the minimum";
        if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return at + ": over the maximum";
        return "";
    }
    if (type == "boolean") return value.is_boolean() ? "" : at + ": not a boolean";
    return at + ": the test's validator knows no type '" + type + "'";
}

const json& tools() {
    static const json t = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "The weather somewhere",
        "parameters": {"type": "object", "properties": {
          "location": {"type": "object", "properties": {
              "city": {"type": "string", "maxLength": 12},
              "country": {"enum": ["NO", "FR", "JP"]}},
            "required": ["city", "country"], "additionalProperties": false},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
          "days": {"type": "integer", "minimum": 1, "maximum": 7},
          "threshold": {"type": "number", "minimum": -10, "maximum": 40},
          "hours": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 23}, "maxItems": 3}},
          "required": ["location", "unit", "threshold"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "get_time", "description": "The time now"}},
      {"type": "function", "function": {"name": "set_alarm", "description": "An alarm", "parameters": {"type": "object", "properties": {
          "at": {"type": "string", "maxLength": 5}, "loud": {"type": "boolean"}},
          "required": ["at", "loud"], "additionalProperties": false}}}
    ])");
    return t;
}

struct Fixture {
    gguf::GgufFile file;
    tokenizer::Tokenizer tok;
    std::unique_ptr<model::Model> model;
    ops::ThreadPool pool{2};
    std::shared_ptr<const sampling::GrammarVocab> vocab;
    chat::ChatTemplate tmpl;

    static Fixture& get() {
        static Fixture f((test::source_dir() / "tests" / "model" / "data" / "tiny-gpt-oss-q8_0.gguf").string());
        return f;
    }
    explicit Fixture(const std::string& path)
        : file(gguf::GgufFile::open(path)),
          tok(tokenizer::Tokenizer::from_gguf(file)),
          model(model::Model::load(file)),
          vocab(sampling::GrammarVocab::from_tokenizer(tok)),
          tmpl(chat::ChatTemplate::parse(std::string(file.find("tokenizer.chat_template")->get<std::string_view>()),
                                         "gpt-oss")) {}
};

struct Generated {
    std::string text;  // as the server's detokenizer shows it
    bool ended = false;
    int analysis_tokens = 0;
};

// One answer to the request, sampled at temperature 1 under its grammar (if any).
Generated generate(Fixture& f, const CompletionRequest& r, const std::string& prompt, uint64_t seed, int max_tokens) {
    sampling::SamplingParams sp = r.params.sampling;
    sp.temperature = 1.0f;
    sp.seed = seed;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.grammar_vocab = f.vocab;
    sampling::Sampler sampler(sp, f.model->n_vocab());
    engine::Session session(*f.model, {.n_ctx = 2048, .n_batch = 64}, f.pool);
    std::span<const float> logits = session.feed(f.tok.tokenize(prompt, false, true));
    Generated g;
    for (int i = 0; i < max_tokens; ++i) {
        int32_t id = 0;
        try {
            id = sampler.sample(logits);
        } catch (const std::exception& e) {
            ADD_FAILURE() << e.what() << " after: " << g.text;
            return g;
        }
        if (f.tok.vocab().is_eog(id)) {
            g.ended = true;
            break;
        }
        g.text += f.tok.token_to_piece(id, /*special=*/false);
        const int32_t one[] = {id};
        logits = session.feed(one);
    }
    return g;
}

CompletionRequest chat_request(const json& choice, TemplateTraits& traits, std::string& prompt) {
    json body = {{"messages", {{{"role", "user"}, {"content", "What is the weather in Oslo?"}}}},
                 {"tools", tools()},
                 {"tool_choice", choice}};
    CompletionRequest r = parse_completion_request(body, /*chat=*/true);
    chat::RenderOptions options;
    traits = prepare_render(r, Fixture::get().tmpl, options);
    prompt = Fixture::get().tmpl.render(r.messages, options);
    force_tool_call(r, traits);
    return r;
}

TEST(HarmonyForcedCall, TinyGptOssAlwaysCallsWithValidArguments) {
    Fixture& f = Fixture::get();
    // The random model may reason (analysis) as long as it likes before the call; <|end|>, which
    // ends the analysis, is made likelier so that it does within the budget. The grammar alone
    // decides what is a call.
    const int32_t end_id = f.vocab->special_token("<|end|>");
    ASSERT_GE(end_id, 0);
    int n = 0, with_analysis = 0;
    for (const json& choice : {json("required"), json({{"type", "function"}, {"function", {{"name", "get_weather"}}}}),
                               json({{"type", "function"}, {"function", {{"name", "set_alarm"}}}})}) {
        TemplateTraits traits;
        std::string prompt;
        CompletionRequest r = chat_request(choice, traits, prompt);
        ASSERT_EQ(traits.tools, ToolCallFormat::harmony);
        ASSERT_TRUE(r.params.sampling.grammar);
        ASSERT_TRUE(prompt.ends_with("<|start|>assistant")) << prompt;
        r.params.sampling.logit_bias = {{end_id, 4.0f}};
        const std::optional<OutputOptions> o = output_options(r, traits, prompt);
        ASSERT_TRUE(o);
        for (uint64_t seed = 1; seed <= 8; ++seed) {
            SCOPED_TRACE(choice.dump() + " seed " + std::to_string(seed));
            const Generated g = generate(f, r, prompt, seed, 600);
            ASSERT_TRUE(g.ended) << "no <|call|> in 600 tokens: " << g.text;
            const ParsedOutput out = split_output(g.text, *o);
            ASSERT_EQ(out.calls.size(), 1u) << g.text;
            EXPECT_TRUE(out.content.empty()) << g.text;
            with_analysis += !out.reasoning.empty();
            const std::string& name = out.calls[0].name;
            if (choice.is_object()) {
                EXPECT_EQ(name, choice["function"]["name"]) << g.text;
            }
            const json* tool = nullptr;
            for (const json& t : tools())
                if (t["function"]["name"] == name) tool = &t;
            ASSERT_TRUE(tool) << "a call of " << name << ", not a tool: " << g.text;
            json args;
            ASSERT_NO_THROW(args = json::parse(out.calls[0].arguments)) << g.text;
            const json schema = (*tool)["function"].value("parameters", json{{"type", "object"}});
            EXPECT_EQ(invalid_against(args, schema, "$"), "") << g.text;
            ++n;
        }
    }
    EXPECT_EQ(n, 24);
    std::printf("harmony forced calls: %d of %d outputs reasoned (analysis) before the call\n", with_analysis, n);
}

// Without a forced call nothing constrains the output (tool_choice auto: the splitter reads what
// comes).
TEST(HarmonyForcedCall, AutoIsNotConstrained) {
    TemplateTraits traits;
    std::string prompt;
    const CompletionRequest r = chat_request("auto", traits, prompt);
    EXPECT_EQ(traits.tools, ToolCallFormat::harmony);
    EXPECT_FALSE(r.params.sampling.grammar);
    EXPECT_NE(prompt.find("get_weather"), std::string::npos);
}

}  // namespace
}  // namespace fitllm::server
