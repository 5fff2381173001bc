#include "server/request.h"

#include <cmath>
#include <limits>

#include "sampling/sampling_params.h"
#include "server/api_error.h"

namespace fitllm::server {
namespace {

using nlohmann::json;

std::string type_name(const json& v) {
    if (v.is_number_integer()) return "an integer";
    if (v.is_number()) return "a number";
    if (v.is_string()) return "a string";
    if (v.is_boolean()) return "a boolean";
    if (v.is_array()) return "an array";
    if (v.is_object()) return "an object";
    return "null";
}

[[noreturn]] void wrong_type(const std::string& field, const char* expected, const json& v) {
    throw ApiError::invalid(std::string(field) + ": expected " + expected + ", got " + type_name(v), "invalid_type");
}

// The field when present and not null.
const json* field(const json& body, const char* name) {
    const auto it = body.find(name);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
}

std::optional<double> number_field(const json& body, const char* name, double lo, double hi) {
    const json* v = field(body, name);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(name, "a number", *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) {
        throw ApiError::invalid(std::string(name) + ": " + v->dump() + " is out of range [" + json(lo).dump() + ", " +
                                    json(hi).dump() + "]",
                                "invalid_value");
    }
    return x;
}

std::optional<int64_t> integer_field(const json& body, const char* name, int64_t lo, int64_t hi) {
    const json* v = field(body, name);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) {
        if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
            std::abs(v->get<double>()) < 9e15) {
            // 64.0 is an integer in JSON's eyes (and Python's json sends ints as such anyway).
        } else {
            wrong_type(name, "an integer", *v);
        }
    }
    const double x = v->get<double>();
    if (x < static_cast<double>(lo) || x > static_cast<double>(hi)) {
        throw ApiError::invalid(std::string(name) + ": " + v->dump() + " is out of range [" + std::to_string(lo) +
                                    ", " + std::to_string(hi) + "]",
                                "invalid_value");
    }
    return v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
}

std::optional<bool> bool_field(const json& body, const char* name) {
    const json* v = field(body, name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
    return v->get<bool>();
}

// A message's content: a string, or an array of parts {"type": "text", "text": ...} joined.
std::string message_content(const json& content, const std::string& where) {
    if (content.is_string()) return content.get<std::string>();
    if (content.is_null()) return {};
    if (!content.is_array()) wrong_type(where, "a string or an array of text parts", content);
    std::string text;
    for (size_t i = 0; i < content.size(); ++i) {
        const json& part = content[i];
        const std::string at = where + "[" + std::to_string(i) + "]";
        if (!part.is_object()) wrong_type(at, "an object", part);
        const json* type = field(part, "type");
        if (!type || !type->is_string() || type->get<std::string>() != "text") {
            throw ApiError::invalid(at + ".type: only \"text\" parts are supported", "unsupported_content");
        }
        const json* t = field(part, "text");
        if (!t || !t->is_string()) wrong_type(at + ".text", "a string", t ? *t : json());
        text += t->get<std::string>();
    }
    return text;
}

}  // namespace

std::string model_field(const json& body) {
    if (!body.is_object()) return {};
    const json* v = field(body, "model");
    if (!v) return {};
    if (!v->is_string()) wrong_type("model", "a string", *v);
    return v->get<std::string>();
}

CompletionRequest parse_completion_request(const json& body, bool chat) {
    if (!body.is_object()) wrong_type("the request body", "a JSON object", body);
    CompletionRequest r;
    r.chat = chat;
    r.model = model_field(body);

    if (chat) {
        const json* messages = field(body, "messages");
        if (!messages) throw ApiError::invalid("messages: required", "missing_field");
        if (!messages->is_array()) wrong_type("messages", "an array", *messages);
        if (messages->empty()) throw ApiError::invalid("messages: at least one message is required", "invalid_value");
        r.messages = nlohmann::ordered_json::array();
        for (size_t i = 0; i < messages->size(); ++i) {
            const json& m = (*messages)[i];
            const std::string at = "messages[" + std::to_string(i) + "]";
            if (!m.is_object()) wrong_type(at, "an object", m);
            const json* role = field(m, "role");
            if (!role) throw ApiError::invalid(at + ".role: required", "missing_field");
            if (!role->is_string()) wrong_type(at + ".role", "a string", *role);
            const auto content = m.find("content");
            const std::string text = message_content(content == m.end() ? json() : *content, at + ".content");
            r.messages.push_back({{"role", role->get<std::string>()}, {"content", text}});
        }
    } else {
        const json* prompt = field(body, "prompt");
        if (!prompt) throw ApiError::invalid("prompt: required", "missing_field");
        const json* p = prompt;
        if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
        if (p->is_string()) {
            r.prompt = p->get<std::string>();
        } else if (p->is_array() && !p->empty() &&
                   std::all_of(p->begin(), p->end(), [](const json& t) { return t.is_number_integer(); })) {
            r.prompt_is_tokens = true;
            for (const json& t : *p) {
                const int64_t id = t.get<int64_t>();
                if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
                    throw ApiError::invalid("prompt: token id " + std::to_string(id) + " is out of range",
                                            "invalid_value");
                }
                r.prompt_tokens.push_back(static_cast<int32_t>(id));
            }
        } else if (p->is_array()) {
            throw ApiError::invalid(
                "prompt: one string or an array of token ids (batches of prompts are not supported)", "invalid_type");
        } else {
            wrong_type("prompt", "a string or an array of token ids", *p);
        }
    }

    if (const auto n = integer_field(body, "n", 1, 1)) (void)n;  // one choice per request
    if (const json* lp = field(body, "logprobs"); lp && !(lp->is_boolean() && !lp->get<bool>())) {
        throw ApiError::invalid("logprobs: not supported", "unsupported_parameter");
    }
    r.stream = bool_field(body, "stream").value_or(false);
    if (const json* so = field(body, "stream_options")) {
        if (!so->is_object()) wrong_type("stream_options", "an object", *so);
        r.include_usage = bool_field(*so, "include_usage").value_or(false);
    }
    const int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
    std::optional<int64_t> max_tokens = integer_field(body, "max_completion_tokens", 1, kMaxTokens);
    if (!max_tokens) max_tokens = integer_field(body, "max_tokens", 1, kMaxTokens);
    if (max_tokens) r.max_tokens = static_cast<int>(*max_tokens);

    sampling::SamplingParams& sp = r.params.sampling;
    if (const auto v = number_field(body, "temperature", 0.0, 2.0)) sp.temperature = static_cast<float>(*v);
    if (const auto v = number_field(body, "top_p", 0.0, 1.0)) sp.top_p = *v == 0.0 ? 1e-6f : static_cast<float>(*v);
    if (const auto v = integer_field(body, "top_k", 0, std::numeric_limits<int32_t>::max()))
        sp.top_k = static_cast<int32_t>(*v);
    if (const auto v = number_field(body, "min_p", 0.0, 1.0)) sp.min_p = static_cast<float>(*v);
    if (const auto v = number_field(body, "presence_penalty", -2.0, 2.0)) sp.presence_penalty = static_cast<float>(*v);
    if (const auto v = number_field(body, "frequency_penalty", -2.0, 2.0))
        sp.frequency_penalty = static_cast<float>(*v);
    if (const auto v = number_field(body, "repeat_penalty", 0.0, 10.0)) {
        if (*v <= 0.0) throw ApiError::invalid("repeat_penalty: must be > 0 (1 turns it off)", "invalid_value");
        sp.repeat_penalty = static_cast<float>(*v);
    }
    if (const auto v = integer_field(body, "repeat_last_n", 0, 1 << 20)) sp.penalty_last_n = static_cast<int32_t>(*v);
    if (const auto v =
            integer_field(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
        sp.seed = static_cast<uint64_t>(*v);  // -1 asks for a random seed, as in llama.cpp
    }
    try {
        sampling::validate_sampling_params(sp);
    } catch (const sampling::SamplingError& e) {
        throw ApiError::invalid(e.what(), "invalid_value");
    }

    if (const json* stop = field(body, "stop")) {
        if (stop->is_string()) {
            r.params.stop.push_back(stop->get<std::string>());
        } else if (stop->is_array()) {
            if (stop->size() > 16) throw ApiError::invalid("stop: at most 16 strings", "invalid_value");
            for (size_t i = 0; i < stop->size(); ++i) {
                if (!(*stop)[i].is_string()) wrong_type("stop[" + std::to_string(i) + "]", "a string", (*stop)[i]);
                r.params.stop.push_back((*stop)[i].get<std::string>());
            }
        } else {
            wrong_type("stop", "a string or an array of strings", *stop);
        }
        for (const std::string& s : r.params.stop) {
            if (s.empty()) throw ApiError::invalid("stop: an empty string would stop before anything", "invalid_value");
        }
    }
    return r;
}

}  // namespace fitllm::server
