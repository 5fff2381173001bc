#pragma once
// The chat request's fields for tool calling and reasoning models, read and checked (called by
// parse_completion_request): tools, tool_choice, parallel_tool_calls, chat_template_kwargs,
// reasoning_format, and the messages' tool_calls, tool_call_id and reasoning_content. Every
// field of the wrong type or value is an ApiError (400) naming it.
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "chat/chat_template.h"
#include "server/chat_output.h"

namespace fitllm::server {

struct CompletionRequest;

// body: the request as sent; r.messages already holds its messages (role, content, name), to
// which the tool fields are added in the shape templates read: a call's function.arguments as
// a JSON object (Qwen, Llama 3.1 and Mistral templates print it with tojson), not its text.
void read_chat_extensions(const nlohmann::json& body, CompletionRequest& r);

// The request's template variables set on options: tools and chat_template_kwargs. Returns what
// the template's text says about its output. A template that shows no tools to the model (Gemma
// 3's, the built-in fallbacks) gets them in r.messages instead: a system prompt listing each
// function's JSON and asking for Hermes calls (<tool_call>\n{"name", "arguments"}\n</tool_call>),
// merged into the first system message if there is one; assistant tool_calls become that text and
// tool messages <tool_response> user turns (consecutive ones one turn); the traits returned are
// then Hermes's. A template that shows tools but writes calls in no format fitllm parses is
// refused (ApiError 400 naming tools).
TemplateTraits prepare_render(CompletionRequest& r, const chat::ChatTemplate& tmpl, chat::RenderOptions& options);

// tool_choice "required" or a named function: the sampler's grammar (sampling/grammar.h) becomes
// the calls the template's format writes (Hermes <tool_call>{...}</tool_call>, Llama 3.x
// {"name", "parameters"}, Mistral [{"name", "arguments"}], the marker a control token left out),
// each call's arguments following its function's parameters schema, so the answer is always
// a call that parses. Nothing when no call is forced. ApiError 400 with response_format or
// grammar too, or for parameters the schema converter refuses (naming the tool).
void force_tool_call(CompletionRequest& r, const TemplateTraits& traits);

// How to split the answer to the rendered prompt: tool calls when tools were offered,
// reasoning when the template thinks and reasoning_format is not "none" (starting inside it
// when the prompt opened a <think> block); std::nullopt when there is nothing to split.
std::optional<OutputOptions> output_options(const CompletionRequest& r, const TemplateTraits& traits,
                                            std::string_view prompt);

}  // namespace fitllm::server
