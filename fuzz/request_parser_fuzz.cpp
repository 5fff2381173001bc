// libFuzzer target: the body of a completion request, as it comes off the wire, through what the
// server does before it touches a model: JsonBody (malformed text, nesting, the memory bound)
// and parse_completion_request for a chat and for a text completion, parse_ollama_request for
// Ollama's chat and generate. Every input must be taken or refused with an ApiError (400, naming
// the field); any other exception, a crash, a leak or undefined behaviour is a finding. What is
// taken must hold the parser's promises.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "server/api_error.h"
#include "server/json_body.h"
#include "server/request.h"

using fitllm::server::ApiError;

namespace {

[[noreturn]] void broken(const char* what) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
}

void check_refusal(const ApiError& e) {
    if (e.status() != 400) broken("a refusal that is not a 400");
    if (std::string_view(e.what()).empty() || e.code().empty()) broken("a refusal without a message or a code");
}

void check_request(const fitllm::server::CompletionRequest& r, bool chat) {
    if (r.chat != chat) broken("chat flag");
    if (chat && (!r.messages.is_array() || r.messages.empty())) broken("a chat without messages");
    if (chat) {
        for (const auto& m : r.messages) {
            if (!m.is_object() || !m["role"].is_string() || !m["content"].is_string()) broken("a message's shape");
        }
    }
    if (!chat && r.prompt_is_tokens && r.prompt_tokens.empty()) broken("an empty token prompt");
    for (const int32_t id : r.prompt_tokens) {
        if (id < 0) broken("a negative token id");
    }
    if (r.max_tokens && *r.max_tokens < 1) broken("max_tokens below 1");
    if (r.params.stop.size() > 16) broken("more than 16 stop strings");
    for (const auto& s : r.params.stop) {
        if (s.empty()) broken("an empty stop string");
    }
    const auto& sp = r.params.sampling;
    if (!(sp.temperature >= 0.0f && sp.temperature <= 2.0f)) broken("temperature out of range");
    if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f)) broken("top_p out of range");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    nlohmann::json value;
    try {
        const fitllm::server::JsonBody body(text);
        if (body.depth() > fitllm::server::kMaxJsonDepth) broken("nesting past the limit let through");
        value = body.parse();
    } catch (const ApiError& e) {
        check_refusal(e);
        return 0;
    }
    for (const bool chat : {true, false}) {
        try {
            check_request(fitllm::server::parse_completion_request(value, chat), chat);
        } catch (const ApiError& e) {
            check_refusal(e);
        }
    }
    for (const bool chat : {true, false}) {  // Ollama's /api/chat and /api/generate
        try {
            const fitllm::server::OllamaRequest r = fitllm::server::parse_ollama_request(value, chat);
            if (chat && !r.completion.chat) broken("an Ollama chat that is not a chat");
            if (!r.load_only) check_request(r.completion, r.completion.chat);
        } catch (const ApiError& e) {
            check_refusal(e);
        }
    }
    try {
        (void)fitllm::server::model_field(value);
    } catch (const ApiError& e) {
        check_refusal(e);
    }
    return 0;
}
