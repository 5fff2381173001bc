#include "server/request.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <utility>

#include "sampling/grammar.h"
#include "sampling/json_schema.h"
#include "sampling/sampling_params.h"
#include "server/api_error.h"
#include "server/chat_request.h"

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
    throw ApiError::invalid(field + ": expected " + expected + ", got " + type_name(v), "invalid_type", field);
}

[[noreturn]] void invalid_value(const std::string& field, const std::string& why) {
    throw ApiError::invalid(field + ": " + why, "invalid_value", field);
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
        invalid_value(name, v->dump() + " is out of range [" + json(lo).dump() + ", " + json(hi).dump() + "]");
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
        invalid_value(name, v->dump() + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
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
            throw ApiError::invalid(at + ".type: only \"text\" parts are supported", "unsupported_content",
                                    at + ".type");
        }
        const json* t = field(part, "text");
        if (!t || !t->is_string()) wrong_type(at + ".text", "a string", t ? *t : json());
        text += t->get<std::string>();
    }
    return text;
}

// Every field a completion request may carry. A field fitllm does not implement is refused
// (400 unsupported_parameter naming it), never ignored: a client that asked for JSON output,
// tool calls or several choices must not get prose and one choice as if it had been honoured.
// Fields whose default value asks for nothing (n: 1, tools: [], response_format {type: text},
// ...) pass; identifiers that change nothing in the output (user, metadata) are accepted.
enum class Fields { common, chat, completions };

constexpr std::pair<const char*, Fields> kKnownFields[] = {
    {"model", Fields::common},
    {"stream", Fields::common},
    {"stream_options", Fields::common},
    {"max_tokens", Fields::common},
    {"temperature", Fields::common},
    {"top_p", Fields::common},
    {"top_k", Fields::common},
    {"min_p", Fields::common},
    {"typical_p", Fields::common},
    {"presence_penalty", Fields::common},
    {"frequency_penalty", Fields::common},
    {"repeat_penalty", Fields::common},
    {"repeat_last_n", Fields::common},
    {"seed", Fields::common},
    {"stop", Fields::common},
    {"logit_bias", Fields::common},
    {"n", Fields::common},
    {"logprobs", Fields::common},
    {"user", Fields::common},
    {"speculative.n_max", Fields::common},
    {"speculative.n_min", Fields::common},
    {"speculative.p_min", Fields::common},
    {"messages", Fields::chat},
    {"chat_template_kwargs", Fields::chat},
    {"reasoning_format", Fields::chat},
    {"max_completion_tokens", Fields::chat},
    {"top_logprobs", Fields::chat},
    {"response_format", Fields::common},
    {"grammar", Fields::common},
    {"tools", Fields::chat},
    {"tool_choice", Fields::chat},
    {"parallel_tool_calls", Fields::chat},
    {"functions", Fields::chat},
    {"function_call", Fields::chat},
    {"store", Fields::chat},
    {"metadata", Fields::chat},
    {"service_tier", Fields::chat},
    {"modalities", Fields::chat},
    {"audio", Fields::chat},
    {"prediction", Fields::chat},
    {"reasoning_effort", Fields::chat},
    {"verbosity", Fields::chat},
    {"web_search_options", Fields::chat},
    {"prompt_cache_key", Fields::chat},
    {"safety_identifier", Fields::chat},
    {"prompt", Fields::completions},
    {"echo", Fields::completions},
    {"best_of", Fields::completions},
    {"suffix", Fields::completions},
};

bool is_empty_value(const json& v) {
    return v.is_null() || (v.is_array() && v.empty()) || (v.is_object() && v.empty());
}

void check_fields(const json& body, bool chat) {
    const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
    for (const auto& item : body.items()) {
        const std::string& key = item.key();  // not a structured binding: lambdas capture it (clang 14)
        const auto known = std::find_if(std::begin(kKnownFields), std::end(kKnownFields),
                                        [&key](const auto& f) { return key == f.first; });
        if (known == std::end(kKnownFields) || known->second == (chat ? Fields::completions : Fields::chat)) {
            throw ApiError::unsupported(key, "not a field of POST " + endpoint + " that fitllm knows");
        }
    }
    // best_of: one completion per choice (n choices: parse_completion_request).
    if (const auto n = integer_field(body, "best_of", 1, std::numeric_limits<int32_t>::max()); n && *n > 1) {
        throw ApiError::unsupported("best_of", "one choice per request (best_of > 1 is not implemented)");
    }
    if (const json* rf = field(body, "response_format")) {
        if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
        const json* type = field(*rf, "type");
        if (!type || !type->is_string()) wrong_type("response_format.type", "a string", type ? *type : json());
        const std::string t = type->get<std::string>();
        if (t != "text" && t != "json_object" && t != "json_schema")
            invalid_value("response_format.type", "\"" + t + "\" is not text, json_object or json_schema");
    }
    // Tool calling: tools and tool_choice are read by read_chat_extensions; the deprecated
    // functions and function_call are not implemented.
    if (const json* v = field(body, "functions"); v && !is_empty_value(*v)) {
        throw ApiError::unsupported("functions", "deprecated; use tools");
    }
    if (const json* v = field(body, "function_call"); v && !(v->is_string() && (*v == "none" || *v == "auto"))) {
        throw ApiError::unsupported("function_call", "deprecated; use tools and tool_choice");
    }
    if (const json* v = field(body, "parallel_tool_calls"); v && !v->is_boolean()) {
        wrong_type("parallel_tool_calls", "a boolean", *v);
    }
    // Identifiers and hints that change nothing in the answer.
    for (const char* name : {"user", "prompt_cache_key", "safety_identifier"}) {
        if (const json* v = field(body, name); v && !v->is_string()) wrong_type(name, "a string", *v);
    }
    if (const json* v = field(body, "metadata"); v && !v->is_object()) wrong_type("metadata", "an object", *v);
    if (const json* v = field(body, "store"); v && *v != false) {
        throw ApiError::unsupported("store", "completions are not stored");
    }
    if (const json* v = field(body, "service_tier"); v && !(*v == "auto" || *v == "default")) {
        throw ApiError::unsupported("service_tier", "one tier (\"auto\" or \"default\")");
    }
    if (const json* v = field(body, "modalities"); v && *v != json::array({"text"})) {
        throw ApiError::unsupported("modalities", "text only ([\"text\"])");
    }
    // Asks for what fitllm does not do.
    for (const char* name : {"audio", "prediction", "reasoning_effort", "verbosity", "web_search_options"}) {
        if (field(body, name)) throw ApiError::unsupported(name, "not implemented");
    }
    if (const json* v = field(body, "echo"); v && *v != false) {
        throw ApiError::unsupported("echo", "echoing the prompt is not implemented");
    }
    if (const json* v = field(body, "suffix"); v && *v != "") {
        throw ApiError::unsupported("suffix", "insertion (a suffix) is not implemented");
    }
}

// A chat message's fields: role, content and name; tool_calls, tool_call_id and
// reasoning_content (read by read_chat_extensions); the deprecated function_call is refused.
void check_message_fields(const json& m, const std::string& at) {
    for (const auto& [key, value] : m.items()) {
        if (key == "role" || key == "content" || key == "name") continue;
        if (key == "tool_calls" || key == "tool_call_id" || key == "reasoning_content") continue;
        if ((key == "refusal" || key == "function_call") && is_empty_value(value)) continue;
        if (key == "function_call") {
            throw ApiError::unsupported(at + "." + key, "deprecated; use tool_calls");
        }
        throw ApiError::unsupported(at + "." + key, "not a message field that fitllm knows");
    }
}

}  // namespace

std::string model_field(const json& body) {
    if (!body.is_object()) return {};
    const json* v = field(body, "model");
    if (!v) return {};
    if (!v->is_string()) wrong_type("model", "a string", *v);
    return v->get<std::string>();
}

namespace {

// Structured output: a grammar (sampling/grammar.h) from GBNF text or a JSON schema; a bad one is
// a 400 naming the field (and, for a schema, the keyword's path in it).
std::shared_ptr<const sampling::Grammar> compile_grammar(const std::string& gbnf, const std::string& param) {
    try {
        return sampling::Grammar::parse(gbnf);
    } catch (const sampling::GrammarError& e) {
        throw ApiError::invalid(param + ": " + e.what(), "invalid_grammar", param);
    }
}

std::shared_ptr<const sampling::Grammar> schema_grammar(const nlohmann::ordered_json& schema,
                                                        const std::string& param) {
    std::string gbnf;
    try {
        gbnf = sampling::json_schema_to_gbnf(schema);
    } catch (const sampling::JsonSchemaError& e) {
        throw ApiError(400, "invalid_request_error", "unsupported_schema", param + ": " + e.what(), param);
    }
    return compile_grammar(gbnf, param);
}

// response_format {type: json_object} (llama-server: with an optional "schema"), {type:
// json_schema, json_schema: {name, schema, strict, description}}, and llama-server's "grammar".
// pointer: where a schema was found ("" when none).
std::shared_ptr<const sampling::Grammar> structured_output(const json& body, std::string& pointer) {
    std::shared_ptr<const sampling::Grammar> grammar;
    if (const json* rf = field(body, "response_format")) {
        const std::string t = (*rf)["type"].get<std::string>();  // checked by check_fields
        for (const auto& item : rf->items()) {
            const std::string& key = item.key();
            if (key != "type" && !(key == "json_schema" && t == "json_schema") &&
                !(key == "schema" && t == "json_object"))
                throw ApiError::unsupported("response_format." + key, "not a field of a " + t + " response_format");
        }
        if (t == "json_object") {
            const json* schema = field(*rf, "schema");
            if (schema) pointer = "/response_format/schema";
            grammar = schema ? schema_grammar(nlohmann::ordered_json::parse(schema->dump()), "response_format.schema")
                             : compile_grammar(sampling::json_object_gbnf(), "response_format");
        } else if (t == "json_schema") {
            const json* js = field(*rf, "json_schema");
            if (!js)
                throw ApiError::invalid("response_format.json_schema: required", "missing_field",
                                        "response_format.json_schema");
            if (!js->is_object()) wrong_type("response_format.json_schema", "an object", *js);
            for (const auto& item : js->items()) {
                const std::string& key = item.key();
                const std::string at = "response_format.json_schema." + key;
                if (key == "name" || key == "description") {
                    if (!item.value().is_string()) wrong_type(at, "a string", item.value());
                } else if (key == "strict") {
                    if (!item.value().is_boolean() && !item.value().is_null())
                        wrong_type(at, "a boolean", item.value());
                } else if (key != "schema") {
                    throw ApiError::unsupported(at, "not a field of json_schema (name, description, schema, strict)");
                }
            }
            const json* schema = field(*js, "schema");
            if (schema) pointer = "/response_format/json_schema/schema";
            grammar = schema ? schema_grammar(nlohmann::ordered_json::parse(schema->dump()),
                                              "response_format.json_schema.schema")
                             : compile_grammar(sampling::json_object_gbnf(), "response_format.json_schema");
        }
    }
    if (const json* g = field(body, "grammar"); g && !g->is_null()) {
        if (!g->is_string()) wrong_type("grammar", "a string", *g);
        if (grammar) invalid_value("grammar", "give a grammar or a JSON response_format, not both");
        if (!g->get_ref<const std::string&>().empty()) grammar = compile_grammar(g->get<std::string>(), "grammar");
    }
    return grammar;
}

}  // namespace

void order_schema_grammar(CompletionRequest& request, std::string_view body) {
    if (request.schema_pointer.empty()) return;
    const auto ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    const nlohmann::ordered_json::json_pointer at(request.schema_pointer);
    if (ordered.is_discarded() || !ordered.contains(at)) return;  // parsed before: not expected
    std::string param = request.schema_pointer.substr(1);
    std::replace(param.begin(), param.end(), '/', '.');
    request.params.sampling.grammar = schema_grammar(ordered[at], param);
}

CompletionRequest parse_completion_request(const json& body, bool chat) {
    if (!body.is_object()) wrong_type("the request body", "a JSON object", body);
    check_fields(body, chat);
    CompletionRequest r;
    r.params.sampling.grammar = structured_output(body, r.schema_pointer);
    r.chat = chat;
    r.model = model_field(body);
    r.n = static_cast<int>(integer_field(body, "n", 1, std::numeric_limits<int32_t>::max()).value_or(1));

    if (chat) {
        const json* messages = field(body, "messages");
        if (!messages) throw ApiError::invalid("messages: required", "missing_field", "messages");
        if (!messages->is_array()) wrong_type("messages", "an array", *messages);
        if (messages->empty()) invalid_value("messages", "at least one message is required");
        r.messages = nlohmann::ordered_json::array();
        for (size_t i = 0; i < messages->size(); ++i) {
            const json& m = (*messages)[i];
            const std::string at = "messages[" + std::to_string(i) + "]";
            if (!m.is_object()) wrong_type(at, "an object", m);
            check_message_fields(m, at);
            const json* role = field(m, "role");
            if (!role) throw ApiError::invalid(at + ".role: required", "missing_field", at + ".role");
            if (!role->is_string()) wrong_type(at + ".role", "a string", *role);
            const auto content = m.find("content");
            const std::string text = message_content(content == m.end() ? json() : *content, at + ".content");
            r.messages.push_back({{"role", role->get<std::string>()}, {"content", text}});
            if (const json* name = field(m, "name")) {  // the template may show it
                if (!name->is_string()) wrong_type(at + ".name", "a string", *name);
                r.messages.back()["name"] = name->get<std::string>();
            }
        }
        read_chat_extensions(body, r);
    } else {
        const json* prompt = field(body, "prompt");
        if (!prompt) throw ApiError::invalid("prompt: required", "missing_field", "prompt");
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
                    invalid_value("prompt", "token id " + std::to_string(id) + " is out of range");
                }
                r.prompt_tokens.push_back(static_cast<int32_t>(id));
            }
        } else if (p->is_array()) {
            throw ApiError::unsupported("prompt",
                                        "one string or an array of token ids (batches of prompts are not supported)");
        } else {
            wrong_type("prompt", "a string or an array of token ids", *p);
        }
    }

    // Log probabilities: chat's logprobs: true with top_logprobs alternatives (0..20), a text
    // completion's logprobs: N alternatives (0..20; OpenAI's legacy limit is 5).
    if (const json* lp = field(body, "logprobs")) {
        if (chat) {
            if (!lp->is_boolean()) wrong_type("logprobs", "a boolean", *lp);
            if (lp->get<bool>()) r.params.top_logprobs = 0;
        } else if (!(lp->is_boolean() && !lp->get<bool>())) {
            if (!lp->is_number_integer()) wrong_type("logprobs", "an integer", *lp);
            r.params.top_logprobs = static_cast<int>(*integer_field(body, "logprobs", 0, 20));
        }
    }
    if (const auto top = integer_field(body, "top_logprobs", 0, 20)) {
        if (r.params.top_logprobs < 0) invalid_value("top_logprobs", "needs \"logprobs\": true");
        r.params.top_logprobs = static_cast<int>(*top);
    }
    r.stream = bool_field(body, "stream").value_or(false);
    if (const json* so = field(body, "stream_options")) {
        if (!so->is_object()) wrong_type("stream_options", "an object", *so);
        for (const auto& [key, value] : so->items()) {
            if (key == "include_usage") continue;
            if (key == "include_obfuscation" && (value.is_null() || value == false)) continue;
            throw ApiError::unsupported("stream_options." + key, "not supported");
        }
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
    if (const auto v = number_field(body, "typical_p", 0.0, 1.0)) {
        if (*v <= 0.0) invalid_value("typical_p", "must be > 0 (1 turns it off)");
        sp.typical_p = static_cast<float>(*v);
    }
    if (const auto v = number_field(body, "presence_penalty", -2.0, 2.0)) sp.presence_penalty = static_cast<float>(*v);
    if (const auto v = number_field(body, "frequency_penalty", -2.0, 2.0))
        sp.frequency_penalty = static_cast<float>(*v);
    if (const auto v = number_field(body, "repeat_penalty", 0.0, 10.0)) {
        if (*v <= 0.0) invalid_value("repeat_penalty", "must be > 0 (1 turns it off)");
        sp.repeat_penalty = static_cast<float>(*v);
    }
    if (const auto v = integer_field(body, "repeat_last_n", 0, 1 << 20)) sp.penalty_last_n = static_cast<int32_t>(*v);
    // OpenAI's presence and frequency penalties look at the generated text; llama.cpp's
    // repeat_penalty (and with it, the others) at the last repeat_last_n tokens, prompt included.
    r.params.penalize_prompt = field(body, "repeat_penalty") != nullptr;
    if (const auto v =
            integer_field(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
        sp.seed = static_cast<uint64_t>(*v);  // -1 asks for a random seed, as in llama.cpp
    }
    if (const json* bias = field(body, "logit_bias")) {
        if (!bias->is_object()) wrong_type("logit_bias", "an object of token ids to numbers", *bias);
        for (const auto& [key, value] : bias->items()) {
            const std::string at = "logit_bias[\"" + key + "\"]";
            char* end = nullptr;
            const long long id = key.empty() || key.size() > 10 ? -1 : std::strtoll(key.c_str(), &end, 10);
            if (id < 0 || id > std::numeric_limits<int32_t>::max() || *end != '\0' || !std::isdigit(key[0])) {
                invalid_value("logit_bias", "the key \"" + key + "\" is not a token id");
            }
            if (!value.is_number()) wrong_type(at, "a number", value);
            const double b = value.get<double>();
            if (!(b >= -100.0 && b <= 100.0)) invalid_value(at, value.dump() + " is out of range [-100, 100]");
            sp.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
        }
    }
    try {
        sampling::validate_sampling_params(sp);
    } catch (const sampling::SamplingError& e) {
        throw ApiError::invalid(e.what(), "invalid_value");
    }
    // llama-server's per-request limits of speculative decoding (serve --lookup): the most tokens
    // drafted per pass (0: none; above --draft-max: --draft-max) and the fewest worth checking.
    // p_min is a draft model's, which serve does not run.
    if (const auto v = integer_field(body, "speculative.n_max", 0, 256)) r.params.draft_max = static_cast<int>(*v);
    if (const auto v = integer_field(body, "speculative.n_min", 0, 256)) r.params.draft_min = static_cast<int>(*v);
    if (r.params.draft_max >= 0 && r.params.draft_min > r.params.draft_max) {
        invalid_value("speculative.n_min", std::to_string(r.params.draft_min) + " is above speculative.n_max (" +
                                               std::to_string(r.params.draft_max) + ")");
    }
    // With a draft model (serve -md): drafting stops at a token it gives less (--draft-p-min's
    // default); prompt lookup has no draft probability and ignores it, as llama-server's.
    if (const auto v = number_field(body, "speculative.p_min", 0.0, 1.0)) r.params.draft_p_min = static_cast<float>(*v);

    if (const json* stop = field(body, "stop")) {
        if (stop->is_string()) {
            r.params.stop.push_back(stop->get<std::string>());
        } else if (stop->is_array()) {
            if (stop->size() > 16) invalid_value("stop", "at most 16 strings");
            for (size_t i = 0; i < stop->size(); ++i) {
                if (!(*stop)[i].is_string()) wrong_type("stop[" + std::to_string(i) + "]", "a string", (*stop)[i]);
                r.params.stop.push_back((*stop)[i].get<std::string>());
            }
        } else {
            wrong_type("stop", "a string or an array of strings", *stop);
        }
        for (const std::string& s : r.params.stop) {
            if (s.empty()) invalid_value("stop", "an empty string would stop before anything");
        }
    }
    return r;
}

namespace {

// Ollama's options that map to a completion field, and what the field is called there.
constexpr std::pair<const char*, const char*> kOllamaOptions[] = {
    {"num_predict", "max_tokens"},
    {"temperature", "temperature"},
    {"top_k", "top_k"},
    {"top_p", "top_p"},
    {"min_p", "min_p"},
    {"typical_p", "typical_p"},
    {"seed", "seed"},
    {"stop", "stop"},
    {"repeat_penalty", "repeat_penalty"},
    {"repeat_last_n", "repeat_last_n"},
    {"presence_penalty", "presence_penalty"},
    {"frequency_penalty", "frequency_penalty"},
};

// A field of the Ollama body that is there and asks for something (not null, "", false, [] or {}).
const json* asked(const json& body, const char* name) {
    const json* v = field(body, name);
    if (!v || (v->is_string() && v->get_ref<const std::string&>().empty()) || (v->is_boolean() && !v->get<bool>()) ||
        is_empty_value(*v)) {
        return nullptr;
    }
    return v;
}

}  // namespace

double parse_keep_alive(const json& value) {
    // Longer than a century is forever (no server runs that long, and time points would overflow).
    constexpr double kForever = 100.0 * 365 * 24 * 3600;
    const auto refuse = [&value](const std::string& why) -> double {
        throw ApiError::invalid("keep_alive: " + value.dump() + " " + why, "invalid_value", "keep_alive");
    };
    if (value.is_number()) {
        const double seconds = value.get<double>();
        if (!std::isfinite(seconds)) return refuse("is not a number of seconds");
        return seconds < 0 || seconds > kForever ? -1 : seconds;
    }
    if (!value.is_string()) return refuse("is not supported: expected seconds or a duration such as \"5m\"");
    const std::string& text = value.get_ref<const std::string&>();
    // A Go duration (time.ParseDuration): an optional sign, then numbers with units.
    size_t i = 0;
    bool negative = false;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) negative = text[i++] == '-';
    if (text.substr(i) == "0") return 0;
    if (i == text.size()) return refuse("is not a duration");
    static constexpr std::pair<const char*, double> kUnits[] = {{"ns", 1e-9},      {"us", 1e-6}, {"\u00b5s", 1e-6},
                                                                {"\u03bcs", 1e-6}, {"ms", 1e-3}, {"s", 1},
                                                                {"m", 60},         {"h", 3600}};
    double seconds = 0;
    while (i < text.size()) {
        const size_t start = i;
        while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
        const std::string number = text.substr(start, i - start);
        if (number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1) {
            return refuse("is not a duration such as \"5m\", \"1h30m\" or \"0\" (a number needs a unit)");
        }
        const auto unit = std::find_if(std::begin(kUnits), std::end(kUnits), [&](const auto& u) {
            const size_t n = std::strlen(u.first);
            // "m" must not take the "m" of "ms".
            return text.compare(i, n, u.first) == 0 &&
                   !(n == 1 && u.first[0] == 'm' && i + 1 < text.size() && text[i + 1] == 's');
        });
        if (unit == std::end(kUnits)) {
            return refuse("is not a duration such as \"5m\", \"1h30m\" or \"0\" (units: ns, us, ms, s, m, h)");
        }
        seconds += std::stod(number) * unit->second;
        i += std::strlen(unit->first);
    }
    return negative || seconds > kForever ? -1 : seconds;
}

OllamaRequest parse_ollama_request(const json& body, bool chat) {
    if (!body.is_object()) wrong_type("the request body", "a JSON object", body);
    static constexpr const char* kChatFields[] = {"model",  "messages", "stream",     "options",
                                                  "format", "tools",    "keep_alive", "think"};
    static constexpr const char* kGenerateFields[] = {"model",  "prompt",     "system",   "stream",  "options",
                                                      "format", "raw",        "template", "context", "suffix",
                                                      "images", "keep_alive", "think"};
    for (const auto& item : body.items()) {
        const std::string& key = item.key();  // not a structured binding: lambdas capture it (clang 14)
        const auto known = [&key](const auto& list) {
            return std::find_if(std::begin(list), std::end(list), [&key](const char* f) { return key == f; }) !=
                   std::end(list);
        };
        if (!(chat ? known(kChatFields) : known(kGenerateFields))) {
            throw ApiError::unsupported(key, std::string("not a field of POST ") +
                                                 (chat ? "/api/chat" : "/api/generate") + " that fitllm knows");
        }
    }
    // Structured output: "json" (any JSON object) or a JSON schema.
    std::shared_ptr<const sampling::Grammar> format;
    if (const json* v = field(body, "format"); v && !v->is_null() && *v != "") {
        if (*v == "json")
            format = compile_grammar(sampling::json_object_gbnf(), "format");
        else if (v->is_object())
            format = schema_grammar(nlohmann::ordered_json::parse(v->dump()), "format");
        else
            invalid_value("format", "expected \"json\" or a JSON schema (an object), got " + v->dump());
    }
    OllamaRequest r;
    if (const json* v = field(body, "keep_alive"); v && !v->is_null() && *v != "") r.keep_alive = parse_keep_alive(*v);
    for (const char* name : {"template", "context", "suffix", "images"}) {
        if (asked(body, name)) throw ApiError::unsupported(name, "not implemented");
    }

    // The completion request it stands for, in the OpenAI endpoints' fields.
    json o = json::object();
    std::string model = model_field(body);
    if (model.size() > 7 && model.compare(model.size() - 7, 7, ":latest") == 0) model.resize(model.size() - 7);
    if (!model.empty()) o["model"] = model;
    o["stream"] = bool_field(body, "stream").value_or(true);
    bool as_chat = chat;
    if (chat) {
        const json* messages = field(body, "messages");
        if (!messages) throw ApiError::invalid("messages: required", "missing_field", "messages");
        if (!messages->is_array()) wrong_type("messages", "an array", *messages);
        json out = json::array();
        for (size_t i = 0; i < messages->size(); ++i) {
            const json& m = (*messages)[i];
            const std::string at = "messages[" + std::to_string(i) + "]";
            if (!m.is_object()) wrong_type(at, "an object", m);
            json message = json::object();
            for (const auto& [key, value] : m.items()) {
                if (key == "role" || key == "content") {
                    message[key] = value;
                } else if (key == "tool_calls") {
                    message[key] = value;  // {"function": {"name", "arguments": {...}}}, read as OpenAI's
                } else if ((key == "thinking" || key == "tool_name") && value.is_string()) {
                    if (value != "") message[key == "thinking" ? "reasoning_content" : "name"] = value;
                } else if (key == "images" || key == "thinking" || key == "tool_name") {
                    if (!is_empty_value(value) && value != "") {
                        throw ApiError::unsupported(at + "." + key, "not implemented");
                    }
                } else {
                    throw ApiError::unsupported(at + "." + key, "not a message field that fitllm knows");
                }
            }
            out.push_back(std::move(message));
        }
        o["messages"] = std::move(out);
    } else {
        const json* prompt = field(body, "prompt");
        if (prompt && !prompt->is_string()) wrong_type("prompt", "a string", *prompt);
        const json* system = field(body, "system");
        if (system && !system->is_string()) wrong_type("system", "a string", *system);
        const bool raw = bool_field(body, "raw").value_or(false);
        const std::string text = prompt ? prompt->get<std::string>() : std::string();
        if (text.empty()) {
            r.load_only = true;
            o["prompt"] = " ";  // not run: the request only loads the model
            as_chat = false;
        } else if (raw) {
            if (system) throw ApiError::unsupported("system", "not with raw: true (the prompt is given as it is)");
            o["prompt"] = text;
            as_chat = false;
        } else {
            o["messages"] = json::array();
            if (system && !system->get_ref<const std::string&>().empty()) {
                o["messages"].push_back({{"role", "system"}, {"content", *system}});
            }
            o["messages"].push_back({{"role", "user"}, {"content", text}});
            as_chat = true;
        }
    }
    // Tools and thinking: the OpenAI fields (server/chat_request.h); think is the template's
    // enable_thinking (Qwen 3's), and the thinking comes back as message.thinking.
    if (const json* v = field(body, "tools")) {
        if (!chat) throw ApiError::unsupported("tools", "a field of /api/chat");
        o["tools"] = *v;
    }
    if (const json* v = field(body, "think")) {
        if (!v->is_boolean())
            throw ApiError::unsupported("think", "true or false (thinking levels are not implemented)");
        if (as_chat) o["chat_template_kwargs"] = {{"enable_thinking", v->get<bool>()}};
    }
    if (const json* options = field(body, "options")) {
        if (!options->is_object()) wrong_type("options", "an object", *options);
        for (const auto& item : options->items()) {
            const std::string& key = item.key();  // not a structured binding: lambdas capture it (clang 14)
            const json& value = item.value();
            if (value.is_null()) continue;
            const auto mapped = std::find_if(std::begin(kOllamaOptions), std::end(kOllamaOptions),
                                             [&key](const auto& m) { return key == m.first; });
            if (mapped != std::end(kOllamaOptions)) {
                // num_predict: -1 (endless) and -2 (fill the context) are up to the end of the context.
                if (key == "num_predict" && value.is_number_integer() && value.get<int64_t>() < 0) continue;
                o[mapped->second] = value;
            } else if (key == "num_ctx") {
                if (!value.is_number_integer()) wrong_type("options.num_ctx", "an integer", value);
                r.num_ctx = value.get<int64_t>();
            } else if ((key == "mirostat" && value == 0) || (key == "tfs_z" && value == 1.0)) {
                continue;  // off
            } else {
                throw ApiError::unsupported("options." + key, "not an option fitllm implements per request");
            }
        }
    }
    try {
        r.completion = parse_completion_request(o, as_chat);
        r.completion.params.penalize_prompt = true;  // Ollama runs llama.cpp's penalties
        if (format) {
            r.completion.params.sampling.grammar = std::move(format);
            if (body["format"].is_object()) r.completion.schema_pointer = "/format";
        }
    } catch (const ApiError& e) {
        // Name the Ollama field that was wrong.
        std::optional<std::string> param = e.param();
        std::string message = e.what();
        if (param) {
            for (const auto& [option, name] : kOllamaOptions) {
                if (param->rfind(name, 0) == 0 &&
                    (param->size() == std::strlen(name) || (*param)[std::strlen(name)] == '[')) {
                    const std::string renamed = "options." + std::string(option) + param->substr(std::strlen(name));
                    if (message.rfind(*param, 0) == 0) message = renamed + message.substr(param->size());
                    param = renamed;
                    break;
                }
            }
        }
        throw ApiError(e.status(), e.type(), e.code(), message, param);
    }
    return r;
}

}  // namespace fitllm::server
