#pragma once
// The body of POST /v1/chat/completions and /v1/completions, read and checked: every field of
// the wrong type or out of range is an ApiError (400) naming the field.
//
//   CompletionRequest r = parse_completion_request(nlohmann::json::parse(body), /*chat=*/true);
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/scheduler.h"

namespace fitllm::server {

using engine::GenerationParams;

struct CompletionRequest {
    bool chat = false;
    std::string model;                   // "" when the request names none
    nlohmann::ordered_json messages;     // chat: [{"role", "content": string}], parts joined
    std::string prompt;                  // completions: the text
    std::vector<int32_t> prompt_tokens;  // completions: a prompt given as token ids
    bool prompt_is_tokens = false;
    std::optional<int> max_tokens;  // unset: up to the end of the context
    GenerationParams params;        // max_tokens left 0 until the prompt's length is known
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
    // Choices: n sequences of the prompt, computed once (engine::Scheduler::submit_group); with
    // a seed, choice i samples with seed + i. The endpoint refuses more than the slots (-np).
    int n = 1;
    // Chat only (server/chat_request.h): the tools offered to the template (null: none, or
    // tool_choice "none"), the calls parsed at most one when parallel_tool_calls is false,
    // chat_template_kwargs as template variables, and reasoning_format "none" (keep <think> in
    // the content).
    nlohmann::json tools;
    bool parallel_tool_calls = true;
    // tool_choice "required" (an empty name: any of the tools) or a named function: the answer is
    // constrained to a call (force_tool_call()).
    std::optional<std::string> forced_tool;
    nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
    bool split_reasoning = true;
    // Structured output from a JSON schema: where the schema is in the body, as a JSON pointer
    // ("/response_format/json_schema/schema"); "" when none. The parsed body has its keys sorted,
    // so order_schema_grammar() builds the grammar again from the body's text, in its order.
    std::string schema_pointer;
};

// Throws ApiError (400) for a body that is not an object, a missing messages / prompt, or any
// field of the wrong type or out of range; the message names the field and what was expected.
CompletionRequest parse_completion_request(const nlohmann::json& body, bool chat);

// Rebuilds request.params.sampling.grammar from the schema at request.schema_pointer in the
// body's text, so that properties are generated in the order the schema lists them (nothing to do
// without a schema). body: the text parse_completion_request's JSON came from. Throws ApiError as
// parse_completion_request does for the schema.
void order_schema_grammar(CompletionRequest& request, std::string_view body);

// The "model" field of a body when it is a string; "" when absent. Throws ApiError when it is
// there with another type.
std::string model_field(const nlohmann::json& body);

// The body of Ollama's POST /api/chat (chat) or /api/generate, as the completion it asks for:
// /api/chat and /api/generate through the chat template ("system", then "prompt" as the user's
// message), /api/generate with "raw": true as a text completion. "options" maps to the sampling
// fields (num_predict to max_tokens, temperature, top_k, top_p, min_p, typical_p, seed, stop,
// repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty); "stream" defaults to true;
// a trailing ":latest" of the model is dropped; "keep_alive" is read as Ollama reads it (seconds
// as a number, a Go duration string such as "5m" or "1h30m", "0"; negative: forever); "tools"
// and the messages' tool_calls (arguments as objects), tool_name and thinking map to the OpenAI
// fields, "think" (a boolean) to chat_template_kwargs.enable_thinking, "format" ("json" or a JSON
// schema) to the sampler's grammar. What fitllm does not implement (images, template, context,
// suffix, think levels, options it has no sampler for) is an ApiError 400 unsupported_parameter
// naming it, as for the OpenAI endpoints.
struct OllamaRequest {
    CompletionRequest completion;
    bool load_only = false;          // /api/generate without a prompt: load the model, answer done
    std::optional<int64_t> num_ctx;  // options.num_ctx: refused when over the model's context
    // keep_alive in seconds (0: unload when done, < 0: never); std::nullopt when absent, null or
    // "" (the server's --ttl).
    std::optional<double> keep_alive;
};

// Ollama's keep_alive value in seconds (< 0: forever): a number of seconds, or a Go duration
// string ("5m", "1h30m", "90s", "500ms", "-1m", "0"). Throws ApiError 400 naming keep_alive for
// anything else.
double parse_keep_alive(const nlohmann::json& value);
OllamaRequest parse_ollama_request(const nlohmann::json& body, bool chat);

}  // namespace fitllm::server
