#pragma once
// The settings POST /api/create gives a model of a --models-dir server (ModelRegistry::settings_file:
// {"system": "...", "parameters": {...}, "license": "..."} beside its file), read back and applied
// as the defaults of the requests that name it, on Ollama's endpoints and on the OpenAI ones, as
// Ollama does on its /v1 endpoints: the system prompt when a chat has no system message, the
// parameters where the request does not set the field itself.
//
//   json body = JsonBody(text).parse();
//   apply_created_settings(registry, body, Api::OpenAiChat);  // before parse_completion_request()
#include <filesystem>
#include <nlohmann/json.hpp>

#include "server/model_registry.h"

namespace fitllm::server {

// The settings a create gave the model of file `gguf`, or an empty object when it has none.
// Throws ApiError (500) when the settings file is there but is not a JSON object or is over 1 MiB.
nlohmann::json read_settings(const std::filesystem::path& gguf);

enum class Api {
    OllamaChat,      // /api/chat: "messages", parameters into "options"
    OllamaGenerate,  // /api/generate: "system" (not with raw), parameters into "options"
    OpenAiChat,      // /v1/chat/completions: "messages", parameters as the OpenAI fields
    OpenAiText,      // /v1/completions: the prompt runs as it is (no system), parameters as the fields
};

// Applies the settings of the model `body` names (its "model"; on Ollama's endpoints a trailing
// ":latest" dropped) to the body, in place. Nothing without --models-dir, for a name that is no
// model here (the request's own lookup says why), or for a body that is not an object. The
// parameters are Ollama's option names; on the OpenAI endpoints num_predict is max_tokens (unless
// the body has max_tokens or max_completion_tokens; a negative one is no limit), the sampling
// options keep their names (temperature, top_k, top_p, min_p, typical_p, seed, stop,
// repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty), and num_ctx (the server's
// -c is the context) and the options that are off (mirostat 0, tfs_z 1) have no field there.
void apply_created_settings(const ModelRegistry& registry, nlohmann::json& body, Api api);

}  // namespace fitllm::server
