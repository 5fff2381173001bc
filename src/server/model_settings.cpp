#include "server/model_settings.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "server/api_error.h"

namespace fitllm::server {

using nlohmann::json;

namespace {

// Ollama's option names and the OpenAI fields of the same meaning (num_predict apart).
constexpr const char* kSamplingOptions[] = {"temperature",
                                            "top_k",
                                            "top_p",
                                            "min_p",
                                            "typical_p",
                                            "seed",
                                            "stop",
                                            "repeat_penalty",
                                            "repeat_last_n",
                                            "presence_penalty",
                                            "frequency_penalty"};

bool unset(const json& body, const char* field) {
    const auto it = body.find(field);
    return it == body.end() || it->is_null();
}

bool has_system_message(const json& messages) {
    return std::any_of(messages.begin(), messages.end(), [](const json& m) {
        return m.is_object() && m.contains("role") && (m["role"] == "system" || m["role"] == "developer");
    });
}

}  // namespace

json read_settings(const std::filesystem::path& gguf) {
    const std::filesystem::path path = ModelRegistry::settings_file(gguf);
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) return json::object();
    constexpr uintmax_t kMaxSettings = 1 << 20;
    if (size > kMaxSettings) {
        throw ApiError(
            500, "server_error", "model_settings_unreadable",
            path.string() + ": " + std::to_string(size) + " bytes, more than the 1 MiB a model's settings may have");
    }
    std::string text(static_cast<size_t>(size), '\0');
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return json::object();  // gone meanwhile
    const size_t n = std::fread(text.data(), 1, text.size(), f);
    std::fclose(f);
    text.resize(n);
    json settings = json::parse(text, nullptr, false);
    if (!settings.is_object()) {
        throw ApiError(500, "server_error", "model_settings_unreadable",
                       path.string() + ": not a JSON object (a model's settings, written by /api/create)");
    }
    return settings;
}

void apply_created_settings(const ModelRegistry& registry, json& body, Api api) {
    if (registry.options().models_dir.empty() || !body.is_object()) return;
    const bool ollama = api == Api::OllamaChat || api == Api::OllamaGenerate;
    const bool chat = api == Api::OllamaChat || api == Api::OpenAiChat;
    const auto model = body.find("model");
    std::string name = model != body.end() && model->is_string() ? model->get<std::string>() : "";
    if (ollama && name.size() > 7 && name.compare(name.size() - 7, 7, ":latest") == 0) name.resize(name.size() - 7);
    if (name.empty() || !ModelRegistry::name_problem(name, false).empty()) return;
    std::filesystem::path path;
    try {
        path = registry.find(name).path;
    } catch (const ApiError&) {
        return;  // the request's acquire() says why
    }
    const json settings = read_settings(path);
    if (const auto system = settings.find("system"); system != settings.end() && system->is_string()) {
        if (chat) {
            json* messages = body.contains("messages") ? &body["messages"] : nullptr;
            if (messages && messages->is_array() && !has_system_message(*messages)) {
                messages->insert(messages->begin(), json{{"role", "system"}, {"content", *system}});
            }
        } else if (api == Api::OllamaGenerate && !body.contains("system") &&
                   !(body.contains("raw") && body["raw"] == true)) {
            body["system"] = *system;
        }
    }
    const auto parameters = settings.find("parameters");
    if (parameters == settings.end() || !parameters->is_object() || parameters->empty()) return;
    if (ollama) {
        if (!body.contains("options") || body["options"].is_null()) body["options"] = json::object();
        json& options = body["options"];
        if (!options.is_object()) return;  // parse_ollama_request says why
        for (const auto& [key, value] : parameters->items()) {
            if (!options.contains(key) || options[key].is_null()) options[key] = value;
        }
        return;
    }
    // The OpenAI fields: the request's own win.
    for (const auto& [key, value] : parameters->items()) {
        if (value.is_null()) continue;
        if (key == "num_predict") {
            if (value.is_number_integer() && value.get<int64_t>() < 0) continue;  // no limit
            if (unset(body, "max_tokens") && unset(body, "max_completion_tokens")) body["max_tokens"] = value;
        } else if (std::any_of(std::begin(kSamplingOptions), std::end(kSamplingOptions),
                               [&key](const char* o) { return key == o; })) {
            if (unset(body, key.c_str())) body[key] = value;
        }
        // num_ctx, mirostat 0 and tfs_z 1: no OpenAI field (the context is the server's -c).
    }
}

}  // namespace fitllm::server
