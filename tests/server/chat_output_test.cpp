// Tool calls and reasoning split out of a chat model's text (server/chat_output.h): each format,
// malformed and hostile calls, and the streamed split against the whole at every cut.
#include "server/chat_output.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace fitllm::server {
namespace {

using nlohmann::json;

OutputOptions tools(ToolCallFormat f) {
    OutputOptions o;
    o.tools = f;
    return o;
}

OutputOptions thinking(bool starts_in = false) {
    OutputOptions o;
    o.reasoning = true;
    o.starts_in_reasoning = starts_in;
    return o;
}

// The split of text fed in pieces cut at the given positions, the deltas joined.
ParsedOutput streamed(std::string_view text, const OutputOptions& o, const std::vector<size_t>& cuts) {
    OutputSplitter s(o);
    ParsedOutput out;
    const auto take = [&out](OutputDelta d) {
        out.reasoning += d.reasoning;
        out.content += d.content;
        for (ToolCall& c : d.calls) out.calls.push_back(std::move(c));
    };
    size_t at = 0;
    for (size_t cut : cuts) {
        take(s.feed(text.substr(at, cut - at)));
        at = cut;
    }
    take(s.feed(text.substr(at)));
    take(s.finish());
    return out;
}

void expect_same(const ParsedOutput& a, const ParsedOutput& b, const std::string& where) {
    EXPECT_EQ(a.reasoning, b.reasoning) << where;
    EXPECT_EQ(a.content, b.content) << where;
    EXPECT_EQ(a.calls, b.calls) << where;
}

// Every split of the text into two and three pieces gives what the whole text gives.
void expect_stream_agrees(std::string_view text, const OutputOptions& o) {
    const ParsedOutput whole = split_output(text, o);
    for (size_t i = 0; i <= text.size(); ++i) {
        expect_same(streamed(text, o, {i}), whole, "cut at " + std::to_string(i));
    }
    for (size_t i = 0; i <= text.size(); i += 3) {
        for (size_t j = i; j <= text.size(); j += 2) {
            expect_same(streamed(text, o, {i, j}), whole, "cuts at " + std::to_string(i) + "," + std::to_string(j));
        }
    }
    // A byte at a time.
    std::vector<size_t> every;
    for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
    expect_same(streamed(text, o, every), whole, "a byte at a time");
}

TEST(ToolCallParse, HermesOneCall) {
    const ParsedOutput p =
        split_output("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                     tools(ToolCallFormat::hermes));
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"city", "Paris"}}));
    EXPECT_EQ(p.content, "");
}

TEST(ToolCallParse, HermesSeveralCallsAfterText) {
    const std::string text =
        "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"y\\\": [1, 2]}\"}\n</tool_call>";
    const ParsedOutput p = split_output(text, tools(ToolCallFormat::hermes));
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].name, "a");
    EXPECT_EQ(p.calls[0].arguments, "{\"x\":1}");
    EXPECT_EQ(p.calls[1].name, "b");
    EXPECT_EQ(p.calls[1].arguments, "{\"y\":[1,2]}");  // arguments given as text: kept as an object's text
    EXPECT_EQ(p.content, "Let me look.\n");
    expect_stream_agrees(text, tools(ToolCallFormat::hermes));
}

TEST(ToolCallParse, HermesUnclosedLastCallCountsAtTheEnd) {
    const ParsedOutput p =
        split_output("<tool_call>{\"name\": \"f\", \"arguments\": {}}  \n", tools(ToolCallFormat::hermes));
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments, "{}");
}

TEST(ToolCallParse, MalformedOrPartialCallsStayText) {
    for (const std::string text : {
             "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": </tool_call>",  // cut JSON
             "<tool_call>{\"arguments\": {}}</tool_call>",                        // no name
             "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",           // name not a string
             "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",      // arguments not an object
             "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",
             "<tool_call>{\"name\": \"f\"",                  // cut off
             "<tool_call>{\"name\": \"f\"} trailing words",  // not closed, more text
             "<tool_call>not json</tool_call>",
         }) {
        const ParsedOutput p = split_output(text, tools(ToolCallFormat::hermes));
        EXPECT_TRUE(p.calls.empty()) << text;
        EXPECT_EQ(p.content, text);
        expect_stream_agrees(text, tools(ToolCallFormat::hermes));
    }
    // A good call, then a broken one: the good one is a call, the rest text.
    const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\":";
    const ParsedOutput p = split_output(text, tools(ToolCallFormat::hermes));
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.content, "\n<tool_call>{\"name\":");
}

TEST(ToolCallParse, Llama3Json) {
    const std::string text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}";
    const ParsedOutput p = split_output(text, tools(ToolCallFormat::llama3));
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"city", "Oslo"}, {"days", 2}}));
    EXPECT_EQ(p.content, "");
    expect_stream_agrees(text, tools(ToolCallFormat::llama3));
    // After <|python_tag|>, several split by ';'.
    const std::string tagged =
        "<|python_tag|>{\"type\": \"function\", \"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", "
        "\"arguments\": {\"q\": \"x;y\"}}";
    const ParsedOutput q = split_output(tagged, tools(ToolCallFormat::llama3));
    ASSERT_EQ(q.calls.size(), 2u);
    EXPECT_EQ(q.calls[1].name, "b");
    EXPECT_EQ(q.calls[1].arguments, "{\"q\":\"x;y\"}");
    expect_stream_agrees(tagged, tools(ToolCallFormat::llama3));
    // Some JSON answer with a "name" but no parameters is an answer, not a call.
    const ParsedOutput answer = split_output("{\"name\": \"Bob\", \"age\": 3}", tools(ToolCallFormat::llama3));
    EXPECT_TRUE(answer.calls.empty());
    EXPECT_EQ(answer.content, "{\"name\": \"Bob\", \"age\": 3}");
    // Prose that mentions braces later is streamed as content.
    const ParsedOutput prose = split_output("Use {x} here.", tools(ToolCallFormat::llama3));
    EXPECT_EQ(prose.content, "Use {x} here.");
}

TEST(ToolCallParse, MistralArrayAndArgsForms) {
    const std::string text =
        "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"n\": 1}, \"id\": \"abcDEF123\"}, {\"name\": \"b\", "
        "\"arguments\": {}}]";
    const ParsedOutput p = split_output(text, tools(ToolCallFormat::mistral));
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].id, "abcDEF123");
    EXPECT_EQ(p.calls[1].name, "b");
    expect_stream_agrees(text, tools(ToolCallFormat::mistral));
    // The marker is a control token the text may not show.
    const ParsedOutput hidden =
        split_output(" [{\"name\": \"a\", \"arguments\": {\"n\": 1}}]", tools(ToolCallFormat::mistral));
    ASSERT_EQ(hidden.calls.size(), 1u);
    // Newer Mistral: NAME[ARGS]{...}.
    const std::string args_form = "[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}[TOOL_CALLS]f[ARGS]{}";
    const ParsedOutput q = split_output(args_form, tools(ToolCallFormat::mistral));
    ASSERT_EQ(q.calls.size(), 2u);
    EXPECT_EQ(q.calls[0].name, "get_time");
    EXPECT_EQ(q.calls[0].arguments, "{\"tz\":\"UTC\"}");
    expect_stream_agrees(args_form, tools(ToolCallFormat::mistral));
    // A markdown link that opens the answer is text.
    const ParsedOutput link = split_output("[the docs](http://x) say so", tools(ToolCallFormat::mistral));
    EXPECT_TRUE(link.calls.empty());
    EXPECT_EQ(link.content, "[the docs](http://x) say so");
}

TEST(ToolCallParse, ParallelOffKeepsTheFirstCall) {
    OutputOptions o = tools(ToolCallFormat::hermes);
    o.max_calls = 1;
    const ParsedOutput p = split_output(
        "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": "
        "{}}</tool_call>",
        o);
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, "a");
}

TEST(ToolCallParse, HostileJsonIsBounded) {
    // Nested deeper than the limit: text, no crash (the scan is iterative, the parse never sees it).
    std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": ";
    for (int i = 0; i < 100000; ++i) deep += "[";
    for (int i = 0; i < 100000; ++i) deep += "]";
    deep += "}</tool_call>";
    ParsedOutput p = split_output(deep, tools(ToolCallFormat::hermes));
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.content.size(), deep.size());
    // Just under the limit: a call.
    std::string ok = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ";
    for (int i = 0; i < kMaxCallJsonDepth - 2; ++i) ok += "[";
    for (int i = 0; i < kMaxCallJsonDepth - 2; ++i) ok += "]";
    ok += "}}</tool_call>";
    EXPECT_EQ(split_output(ok, tools(ToolCallFormat::hermes)).calls.size(), 1u);
    // Unclosed openers and a huge string: text.
    std::string open = "<tool_call>" + std::string(1 << 20, '{');
    EXPECT_TRUE(split_output(open, tools(ToolCallFormat::hermes)).calls.empty());
    std::string big =
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"" + std::string(4 << 20, 'x') + "\"}}</tool_call>";
    p = split_output(big, tools(ToolCallFormat::hermes));
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments.size(), (4u << 20) + 8);
    // Many tiny calls: all parsed, then bounded by max_calls.
    std::string many;
    for (int i = 0; i < 1000; ++i) many += "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    EXPECT_EQ(split_output(many, tools(ToolCallFormat::hermes)).calls.size(), 128u);
    // Escaped quotes and braces in strings do not end the scan; invalid UTF-8 is text.
    const std::string escaped = "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\\\"}\\\\{\"}}</tool_call>";
    ASSERT_EQ(split_output(escaped, tools(ToolCallFormat::hermes)).calls.size(), 1u);
    const std::string odd = "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\xff\xfe\"}}</tool_call>";
    p = split_output(odd, tools(ToolCallFormat::hermes));
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.content, odd);
}

TEST(Reasoning, ThinkBlockSplitOut) {
    const std::string text = "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.";
    const ParsedOutput p = split_output(text, thinking());
    EXPECT_EQ(p.reasoning, "The user wants 2+2.");
    EXPECT_EQ(p.content, "It is 4.");
    expect_stream_agrees(text, thinking());
    // Without a think block: all content.
    const ParsedOutput q = split_output("Just 4.", thinking());
    EXPECT_EQ(q.reasoning, "");
    EXPECT_EQ(q.content, "Just 4.");
    expect_stream_agrees("Just 4.", thinking());
    // A <think> later in the answer is content.
    EXPECT_EQ(split_output("x <think>y</think>", thinking()).content, "x <think>y</think>");
    // Not closed (max_tokens hit): all reasoning.
    EXPECT_EQ(split_output("<think>still going  ", thinking()).reasoning, "still going");
    // Qwen 3 with thinking off: an empty block.
    const ParsedOutput empty = split_output("<think>\n\n</think>\n\nHi", thinking());
    EXPECT_EQ(empty.reasoning, "");
    EXPECT_EQ(empty.content, "Hi");
}

TEST(Reasoning, PromptOpenedTheBlock) {
    EXPECT_TRUE(prompt_opens_reasoning("<|Assistant|><think>\n"));
    EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
    const std::string text = "Let me see.\n</think>\n\n4";
    const ParsedOutput p = split_output(text, thinking(/*starts_in=*/true));
    EXPECT_EQ(p.reasoning, "Let me see.");
    EXPECT_EQ(p.content, "4");
    expect_stream_agrees(text, thinking(true));
}

TEST(Reasoning, ThenToolCall) {
    OutputOptions o = tools(ToolCallFormat::hermes);
    o.reasoning = true;
    const std::string text =
        "<think>\nNeed the weather; <tool_call> is how.\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": "
        "{\"c\": \"</think>\"}}\n</tool_call>";
    const ParsedOutput p = split_output(text, o);
    EXPECT_EQ(p.reasoning, "Need the weather; <tool_call> is how.");
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].arguments, "{\"c\":\"</think>\"}");
    expect_stream_agrees(text, o);
}

// The text fed a byte at a time: no '<' (markup) ever reaches content or reasoning; returns the
// whole split.
ParsedOutput fed_bytewise_without_markup(std::string_view text, const OutputOptions& o) {
    OutputSplitter s(o);
    ParsedOutput out;
    for (char ch : text) {
        OutputDelta d = s.feed(std::string(1, ch));
        out.content += d.content;
        out.reasoning += d.reasoning;
        for (ToolCall& c : d.calls) out.calls.push_back(std::move(c));
        EXPECT_EQ(out.content.find('<'), std::string::npos) << out.content;
        EXPECT_EQ(out.reasoning.find('<'), std::string::npos) << out.reasoning;
    }
    OutputDelta last = s.finish();
    out.content += last.content;
    out.reasoning += last.reasoning;
    for (ToolCall& c : last.calls) out.calls.push_back(std::move(c));
    return out;
}

TEST(Reasoning, MarkupIsNeverStreamedAsContent) {
    OutputOptions o = tools(ToolCallFormat::hermes);
    o.reasoning = true;
    const ParsedOutput p = fed_bytewise_without_markup(
        "<think>a</think>Sure.<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", o);
    EXPECT_EQ(p.content, "Sure.");
    EXPECT_EQ(p.calls.size(), 1u);
}

// gpt-oss's harmony format: channels split into reasoning, content and calls, markers never in
// the text, the same streamed at every cut as whole.
OutputOptions harmony(bool with_tools, bool reasoning = true) {
    OutputOptions o;
    o.harmony = true;
    o.reasoning = reasoning;
    if (with_tools) o.tools = ToolCallFormat::harmony;
    return o;
}

TEST(Harmony, AnalysisIsReasoningAndFinalIsContent) {
    const std::string text =
        "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>"
        "It is 4.";
    const ParsedOutput p = split_output(text, harmony(false));
    EXPECT_EQ(p.reasoning, "User asks 2+2. Easy.");
    EXPECT_EQ(p.content, "It is 4.");
    EXPECT_TRUE(p.calls.empty());
    expect_stream_agrees(text, harmony(false));
    // Without the split (reasoning_format none), the analysis is content, still without markers.
    const ParsedOutput flat = split_output(text, harmony(false, false));
    EXPECT_EQ(flat.reasoning, "");
    EXPECT_EQ(flat.content, "User asks 2+2. Easy.It is 4.");
}

TEST(Harmony, MessagesToAFunctionAreCalls) {
    // The recipient after the channel, and before it (in the assistant header); the output ends
    // at <|call|>, an end-of-generation token the text does not show.
    for (const std::string& text :
         {std::string("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                      "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"),
          std::string("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant "
                      "to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}")}) {
        const ParsedOutput p = split_output(text, harmony(true));
        EXPECT_EQ(p.reasoning, "Need the weather.") << text;
        EXPECT_EQ(p.content, "") << text;
        ASSERT_EQ(p.calls.size(), 1u) << text;
        EXPECT_EQ(p.calls[0].name, "get_weather");
        EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"city", "Paris"}}));
        expect_stream_agrees(text, harmony(true));
    }
    // Two calls (each message ended by <|end|> here), parallel_tool_calls false keeps the first.
    const std::string two =
        "<|channel|>commentary to=functions.a<|message|>{}<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.b<|message|>{\"x\": 1}";
    EXPECT_EQ(split_output(two, harmony(true)).calls.size(), 2u);
    OutputOptions one = harmony(true);
    one.max_calls = 1;
    const ParsedOutput first = split_output(two, one);
    ASSERT_EQ(first.calls.size(), 1u);
    EXPECT_EQ(first.calls[0].name, "a");
    // Without tools in the request a call is not made up: its text is content.
    EXPECT_EQ(split_output(two, harmony(false)).content, "{}{\"x\": 1}");
}

TEST(Harmony, TextOutsideMessagesAndHostileHeadersAreContent) {
    // No header at all: the whole output is the answer.
    EXPECT_EQ(split_output("Just text, no channels.", harmony(true)).content, "Just text, no channels.");
    expect_stream_agrees("Just text, no channels.", harmony(true));
    // A header that never ends, or one longer than any real one, is text; nothing hangs.
    const std::string open_header = "<|channel|>analysis and then nothing";
    EXPECT_EQ(split_output(open_header, harmony(true)).content, open_header);
    const std::string long_header = "<|channel|>" + std::string(400, 'x') + "<|message|>body";
    EXPECT_EQ(split_output(long_header, harmony(true)).content, long_header);
    expect_stream_agrees("<|channel|>" + std::string(300, 'y') + "<|message|>b<|end|>", harmony(true));
    // Markers are never streamed as content or reasoning, a byte at a time.
    const ParsedOutput p = fed_bytewise_without_markup(
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>ok", harmony(true));
    EXPECT_EQ(p.content, "ok");
    EXPECT_EQ(p.reasoning, "hm");
}

TEST(TemplateTraits, ChosenFromTheTemplateText) {
    const auto read = [](const std::string& name) {
        std::ifstream f(std::string(FITLLM_SOURCE_DIR) + "/tests/chat/fixtures/templates/" + name + ".jinja");
        std::stringstream ss;
        ss << f.rdbuf();
        EXPECT_FALSE(ss.str().empty()) << name;
        return ss.str();
    };
    EXPECT_EQ(template_traits(read("qwen2.5-instruct")).tools, ToolCallFormat::hermes);
    EXPECT_FALSE(template_traits(read("qwen2.5-instruct")).thinks);
    EXPECT_EQ(template_traits(read("qwen3")).tools, ToolCallFormat::hermes);
    EXPECT_TRUE(template_traits(read("qwen3")).thinks);
    EXPECT_EQ(template_traits(read("llama-3.1-instruct")).tools, ToolCallFormat::llama3);
    EXPECT_EQ(template_traits(read("llama-3.2-instruct")).tools, ToolCallFormat::llama3);
    EXPECT_EQ(template_traits(read("mistral-7b-instruct-v0.3")).tools, ToolCallFormat::mistral);
    EXPECT_EQ(template_traits(read("gemma-3-it")).tools, ToolCallFormat::none);
    EXPECT_FALSE(template_traits(read("gemma-3-it")).takes_tools);
    EXPECT_EQ(template_traits(read("chatml")).tools, ToolCallFormat::none);
    // gpt-oss's harmony template (a fixture of tests/chat).
    std::ifstream f(std::string(FITLLM_SOURCE_DIR) + "/tests/chat/fixtures/gpt-oss/openai-gpt-oss.jinja");
    std::stringstream gpt_oss;
    gpt_oss << f.rdbuf();
    const TemplateTraits t = template_traits(gpt_oss.str());
    EXPECT_TRUE(t.harmony);
    EXPECT_TRUE(t.thinks);
    EXPECT_EQ(t.tools, ToolCallFormat::harmony);
    EXPECT_FALSE(template_traits(read("qwen3")).harmony);
}

}  // namespace
}  // namespace fitllm::server
