#pragma once
// What a chat model's generated text holds besides its answer, split out of it: the reasoning
// of a thinking model (<think> ... </think>) and tool calls, in the markup the model's chat
// template taught it. Pure text processing, no model: unit-tested on text.
//
//   OutputOptions o{.tools = ToolCallFormat::hermes, .reasoning = true};
//   OutputSplitter s(o);
//   for (piece : pieces) send(s.feed(piece));   // deltas: reasoning, content, calls
//   send(s.finish());
//   ParsedOutput whole = split_output(text, o);  // the same as feeding it all, then finish()
//
// The format is chosen from the chat template's text (template_traits):
//   - it mentions <tool_call>            -> hermes:  <tool_call>{"name": N, "arguments": {...}}</tool_call>,
//                                                   one or several (Qwen 2.5, Qwen 3, Hermes, ...);
//   - it mentions [TOOL_CALLS]           -> mistral: [TOOL_CALLS][{"name": N, "arguments": {...}}, ...],
//                                                   or [TOOL_CALLS]N[ARGS]{...} (newer Mistral);
//   - it mentions <|python_tag|>, or <|start_header_id|> and "parameters"
//                                        -> llama3:  {"name": N, "parameters": {...}} (or "arguments"),
//                                                   possibly after <|python_tag|>, several split by ';';
//   - it writes <|channel|> and <|message|> -> harmony (gpt-oss): the whole output is messages
//     "[<|start|>assistant][ to=functions.N]<|channel|>C[ to=functions.N][ <|constrain|>json]<|message|>BODY<|end|>",
//     channel analysis = reasoning, final (or commentary without a recipient) = content, a body
//     addressed to functions.N = a call of N with the body as its arguments;
//   - otherwise none: a template that does not show tools to the model in one of these forms.
// A template "thinks" when it mentions <think> (Qwen 3, DeepSeek-R1 distills) or is harmony.
//
// Calls are looked for from a format's start marker (<tool_call>, [TOOL_CALLS], <|python_tag|>)
// anywhere in the content, or, for llama3 and mistral (whose markers are control tokens that
// the generated text may not show), from a '{' / '[' that opens the content. From there the
// text is held to the end and parsed; what does not parse as calls stays text (content).
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace fitllm::server {

enum class ToolCallFormat { none, hermes, llama3, mistral, harmony };
const char* tool_call_format_name(ToolCallFormat format);  // "none", "hermes", ..., "harmony"

struct TemplateTraits {
    bool takes_tools = false;  // the template reads a `tools` variable
    ToolCallFormat tools = ToolCallFormat::none;
    bool thinks = false;   // the template has <think> blocks, or is harmony
    bool harmony = false;  // gpt-oss's harmony messages: every output is split by channel
};
TemplateTraits template_traits(std::string_view source);

// Whether a rendered prompt ends inside an open <think> block (the generation prompt opened it,
// as DeepSeek-R1 distills' templates do): only whitespace after its last <think>.
bool prompt_opens_reasoning(std::string_view prompt);

struct ToolCall {
    std::string id;         // as the model wrote it (Mistral), else "" (the server gives one)
    std::string name;       // the function's name
    std::string arguments;  // a JSON object's text
    bool operator==(const ToolCall&) const = default;
};

// Calls parsed from text that starts where a call may start (a marker or a '{' / '['): the
// calls, then the rest that did not parse as one (text). A call's JSON deeper than
// kMaxCallJsonDepth, or a call that is cut off or malformed, ends the calls: it and what follows
// are the rest. At most max_calls are kept (parallel_tool_calls: false is 1); more are dropped.
constexpr int kMaxCallJsonDepth = 64;
struct ParsedCalls {
    std::vector<ToolCall> calls;
    std::string rest;
};
ParsedCalls parse_tool_calls(std::string_view text, ToolCallFormat format, size_t max_calls = 128);

struct OutputOptions {
    ToolCallFormat tools = ToolCallFormat::none;  // none: no calls looked for
    bool reasoning = false;                       // split <think> ... </think> out
    bool starts_in_reasoning = false;             // the prompt opened a <think> block
    bool harmony = false;                         // harmony messages (tools: harmony or none)
    size_t max_calls = 128;
};

// One step of the split: text for each channel (empty: none this time) and the calls found.
struct OutputDelta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> calls;
    bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

// The split, a piece of text at a time. Reasoning is the text of a <think> block that opens
// the answer (or that the prompt opened), without the whitespace around it; content starts
// after </think> with its leading whitespace dropped. Text that may be the start of a marker is
// held until the next piece tells; from a call's start the text is held to finish().
class OutputSplitter {
public:
    explicit OutputSplitter(OutputOptions options);
    OutputDelta feed(std::string_view piece);
    OutputDelta finish();

private:
    enum class State { start, reasoning, content_start, content, calls, harmony_header, harmony_body };
    enum class Channel { reasoning, content, call };
    OutputDelta step(bool final);
    bool harmony_step(OutputDelta& d, bool final);  // false: wait for more text
    void harmony_emit(OutputDelta& d, std::string_view text);
    void emit_reasoning(OutputDelta& d, std::string_view text, bool last);

    OutputOptions options_;
    State state_;
    std::string pending_;
    bool reasoning_started_ = false;
    bool finished_ = false;
    // harmony: the channel of the message being read, and the call it is (name, arguments so far)
    Channel channel_ = Channel::content;
    std::string call_name_, call_args_;
    size_t n_calls_ = 0;
};

struct ParsedOutput {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> calls;
};
ParsedOutput split_output(std::string_view text, const OutputOptions& options);

// A call's arguments as a JSON object (Ollama's shape); {} when they are not one.
nlohmann::json arguments_object(const ToolCall& call);

}  // namespace fitllm::server
