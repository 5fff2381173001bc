// Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps): the Endpoints
// methods that answer it, on the same scheduler and limits as the OpenAI endpoints
// (endpoints.cpp).
#include <chrono>
#include <ctime>
#include <filesystem>
#include <optional>

#include "chat/chat_template.h"
#include "gguf/gguf_reader.h"
#include "quant/file_type.h"
#include "server/api_error.h"
#include "server/chat_output.h"
#include "server/chat_request.h"
#include "server/completion.h"
#include "server/endpoints.h"
#include "server/json_body.h"
#include "server/request.h"
#include "server/request_memory.h"

namespace fitllm::server {

using nlohmann::json;

namespace {

// "2026-12-06T20:15:02.123456Z", as Ollama's created_at.
std::string rfc3339(std::chrono::system_clock::time_point t, bool fraction) {
    const std::time_t tt = std::chrono::system_clock::to_time_t(t);
    std::tm tm{};
    gmtime_r(&tt, &tm);
    char buf[48];
    const int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900, tm.tm_mon + 1,
                                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    if (fraction) {
        const auto micros =
            std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count() % 1000000;
        std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), ".%06lldZ", static_cast<long long>(micros));
    } else {
        std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), "Z");
    }
    return buf;
}

int64_t nanoseconds(std::chrono::steady_clock::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

// One line of an Ollama answer: the text of this piece (the assistant's message for /api/chat,
// "response" for /api/generate), its thinking and tool calls (arguments as objects).
json ollama_line(const Completion& c, const OutputDelta& d, bool done) {
    json line = {{"model", c.model->id()}, {"created_at", rfc3339(std::chrono::system_clock::now(), true)}};
    if (c.ollama_chat) {
        line["message"] = {{"role", "assistant"}, {"content", d.content}};
        if (!d.reasoning.empty()) line["message"]["thinking"] = d.reasoning;
        if (!d.calls.empty()) {
            json calls = json::array();
            for (const ToolCall& call : d.calls) {
                calls.push_back({{"function", {{"name", call.name}, {"arguments", arguments_object(call)}}}});
            }
            line["message"]["tool_calls"] = std::move(calls);
        }
    } else {
        line["response"] = d.content;
        if (!d.reasoning.empty()) line["thinking"] = d.reasoning;
    }
    line["done"] = done;
    return line;
}

json ollama_line(const Completion& c, const std::string& text, bool done) {
    OutputDelta d;
    d.content = text;
    return ollama_line(c, d, done);
}

// The last line: the end and the counts, with the times as this request saw them (Ollama's
// fields, in nanoseconds: the prompt's until the first text came, queueing included, then the
// rest; nothing loads for a request here).
json ollama_done(const Completion& c, const Job::Update& u, const std::string& text) {
    OutputDelta d;
    if (c.output && !text.empty()) {
        ParsedOutput p = split_output(text, *c.output);
        d.reasoning = std::move(p.reasoning);
        d.content = std::move(p.content);
        d.calls = std::move(p.calls);
    } else {
        d.content = text;
    }
    json line = ollama_line(c, d, true);
    const auto now = std::chrono::steady_clock::now();
    const auto first = c.first_text.value_or(now);
    line["done_reason"] = finish_reason_name(u.reason);
    line["total_duration"] = nanoseconds(now - c.start);
    line["load_duration"] = 0;
    line["prompt_eval_count"] = u.n_prompt;
    line["prompt_eval_duration"] = nanoseconds(first - c.start);
    line["eval_count"] = u.n_generated;
    line["eval_duration"] = nanoseconds(now - first);
    return line;
}

// A whole answer: its one choice's last line.
json ollama_whole(const Completion& c, const std::vector<Answer>& answers) {
    return ollama_done(c, answers.front().end, answers.front().text);
}

}  // namespace

void Endpoints::ollama(bool chat, HttpRequest& req, HttpResponse& res) {
    auto c = std::make_shared<Completion>();
    c->ollama_chat = chat;
    {
        RequestMemory memory(request_pool());
        memory.note(req.body.size());
        OllamaRequest request;
        memory::Charge request_charge;
        {
            const JsonBody text(req.body);
            const memory::Charge dom = memory.charge(text.memory_bound(), "the request's JSON");
            request_charge = memory.charge(text.memory_bound(), "the request's fields");
            request = parse_ollama_request(text.parse(), chat);
            if (!request.completion.schema_pointer.empty()) {
                const memory::Charge ordered = memory.charge(text.memory_bound(), "the request's JSON, in order");
                order_schema_grammar(request.completion, req.body);
            }
        }
        req.free_body();
        c->chat = request.completion.chat;
        c->stream = request.completion.stream;
        c->model = registry_.acquire(request.completion.model);
        registry_.set_keep_alive(c->model->id(), request.keep_alive);  // absent: back to --ttl
        const int n_ctx = c->model->scheduler().n_ctx();
        if (request.num_ctx && (*request.num_ctx < 1 || *request.num_ctx > n_ctx)) {
            throw ApiError::unsupported("options.num_ctx", std::to_string(*request.num_ctx) +
                                                               " tokens; this server runs a context of " +
                                                               std::to_string(n_ctx) + " (its -c)");
        }
        if (request.load_only) {  // Ollama's way to load a model: a generate without a prompt
            registry_.touch(c->model->id());
            json line = ollama_line(*c, "", true);
            // keep_alive 0 is Ollama's way to unload one (`ollama stop`): it goes once idle.
            line["done_reason"] = request.keep_alive == 0.0 ? "unload" : "load";
            set_json(res, 200, line);
            return;
        }
        try {
            submit(*c, request.completion, memory);
        } catch (const ApiError& e) {
            if (e.param() != "max_tokens") throw;
            const std::string message = e.what();
            throw ApiError(e.status(), e.type(), e.code(), "options.num_predict" + message.substr(message.find(':')),
                           "options.num_predict");
        }
    }

    if (!c->stream) return send_whole(*c, req, res, ollama_whole);

    // Streamed: a JSON object a line (application/x-ndjson), one per piece of text, then the end.
    res.status = 200;
    res.content_type = "application/x-ndjson";
    res.stream = [this, c](BodyWriter& out) {
        std::optional<OutputSplitter> splitter;  // thinking and tool calls, split as they come
        if (c->output) splitter.emplace(*c->output);
        while (true) {
            if (out.client_gone()) return c->cancel();
            const Job::Update u = c->jobs.front()->wait(kPoll);
            std::string lines;
            for (const std::string& piece : u.pieces) {
                if (!c->first_text) c->first_text = std::chrono::steady_clock::now();
                if (splitter) {
                    const OutputDelta d = splitter->feed(piece);
                    if (!d.empty()) lines += dump_json(ollama_line(*c, d, false)) + "\n";
                } else {
                    lines += dump_json(ollama_line(*c, piece, false)) + "\n";
                }
            }
            if (u.finished && splitter && u.reason != FinishReason::error && u.reason != FinishReason::cancelled) {
                const OutputDelta d = splitter->finish();
                if (!d.empty()) lines += dump_json(ollama_line(*c, d, false)) + "\n";
            }
            if (u.finished) {
                finished(*c, u);
                if (u.reason == FinishReason::error || u.reason == FinishReason::cancelled) {
                    lines += dump_json({{"error", "generation " + std::string(finish_reason_name(u.reason)) +
                                                      (u.error.empty() ? "" : ": " + u.error)}}) +
                             "\n";
                } else {
                    lines += dump_json(ollama_done(*c, u, "")) + "\n";
                }
            }
            if (!lines.empty() && !out.write(lines)) return c->cancel();
            if (u.finished) return;
        }
    };
}

void Endpoints::ollama_tags(HttpResponse& res) {
    json models = json::array();
    for (const ModelInfo& m : registry_.models()) {
        std::error_code size_error, time_error;
        const uint64_t size = std::filesystem::file_size(m.path, size_error);
        const auto modified = std::filesystem::last_write_time(m.path, time_error);
        const auto modified_sys = std::chrono::time_point_cast<std::chrono::system_clock::duration>(
            modified - std::filesystem::file_time_type::clock::now() + std::chrono::system_clock::now());
        models.push_back(
            {{"name", m.id},
             {"model", m.id},
             {"modified_at", rfc3339(time_error ? std::chrono::system_clock::time_point{} : modified_sys, false)},
             {"size", size_error ? 0 : size},
             {"digest", ""},
             {"details", {{"format", "gguf"}}}});
    }
    set_json(res, 200, {{"models", models}});
}

namespace {

// A metadata value as JSON: scalars as they are; arrays as null (as Ollama's /api/show does
// without "verbose": the vocabulary alone has hundreds of thousands of entries).
json metadata_json(const gguf::Value& v) {
    switch (v.type()) {
        case gguf::ValueType::STRING:
            return std::string(v.get<std::string_view>());
        case gguf::ValueType::BOOL:
            return v.to_int() != 0;
        case gguf::ValueType::FLOAT32:
        case gguf::ValueType::FLOAT64:
            return v.to_double();
        case gguf::ValueType::ARRAY:
            return nullptr;
        default:
            return v.to_int();
    }
}

// "268.10M", "7.2B": a parameter count as Ollama's details.parameter_size writes it.
std::string parameter_size(uint64_t n) {
    char buf[32];
    if (n >= 1000000000ULL) {
        std::snprintf(buf, sizeof buf, "%.1fB", static_cast<double>(n) / 1e9);
    } else if (n >= 1000000ULL) {
        std::snprintf(buf, sizeof buf, "%.2fM", static_cast<double>(n) / 1e6);
    } else {
        std::snprintf(buf, sizeof buf, "%.2fK", static_cast<double>(n) / 1e3);
    }
    return buf;
}

// Ollama's "details" of a model file: format, family, parameter size, quantization.
json model_details(const gguf::GgufFile& f, uint64_t n_params) {
    const gguf::Value* a = f.find("general.architecture");
    const std::string arch(a && a->type() == gguf::ValueType::STRING ? a->get<std::string_view>() : "");
    std::string quant = "unknown";
    if (const gguf::Value* v = f.find("general.file_type");
        v && !v->is_array() && v->type() != gguf::ValueType::STRING) {
        const int64_t id = v->to_int();
        if (id >= 0 && id <= UINT32_MAX) quant = quant::file_type_name(static_cast<uint32_t>(id)).value_or(quant);
    }
    return {{"parent_model", ""},
            {"format", "gguf"},
            {"family", arch},
            {"families", json::array({arch})},
            {"parameter_size", parameter_size(n_params)},
            {"quantization_level", quant}};
}

uint64_t parameter_count(const gguf::GgufFile& f) {
    uint64_t n = 0;
    for (const gguf::TensorInfo& t : f.tensors()) n += t.n_elements;
    return n;
}

}  // namespace

void Endpoints::ollama_show(HttpRequest& req, HttpResponse& res) {
    RequestMemory memory(request_pool());
    memory.note(req.body.size());
    memory::Charge json_charge;
    const json body = parse_charged(req, memory, json_charge);
    if (!body.is_object()) throw ApiError::invalid("the request body: expected a JSON object", "invalid_type");
    std::string name;
    for (const char* key : {"model", "name"}) {
        const auto it = body.find(key);
        if (it == body.end() || it->is_null()) continue;
        if (!it->is_string()) throw ApiError::invalid(std::string(key) + ": expected a string", "invalid_type", key);
        if (name.empty()) name = it->get<std::string>();
    }
    if (name.size() > 7 && name.compare(name.size() - 7, 7, ":latest") == 0) name.resize(name.size() - 7);
    if (name.empty()) throw ApiError::invalid("model: required", "missing_field", "model");
    const ModelInfo m = registry_.find(name);
    // The file's header, mapped (the model need not be loaded); nothing of the tensors is read.
    gguf::GgufFile f = [&] {
        try {
            return gguf::GgufFile::open(m.path.string());
        } catch (const std::exception& e) {
            throw ApiError(500, "server_error", "model_unreadable", "model '" + m.id + "': " + e.what());
        }
    }();
    const uint64_t n_params = parameter_count(f);
    json info = json::object();
    for (const gguf::Value& v : f.metadata()) {
        if (v.key() == "tokenizer.chat_template") continue;  // the template, below
        info[std::string(v.key())] = metadata_json(v);
    }
    info["general.parameter_count"] = n_params;
    std::string tmpl;
    if (m.model) {
        tmpl = m.model->chat_template().tmpl.source();
    } else {
        try {
            tmpl = chat::template_for_model(f).tmpl.source();
        } catch (const std::exception&) {
            // A template that does not parse: the text as the file has it.
            if (const gguf::Value* v = f.find("tokenizer.chat_template"); v && v->type() == gguf::ValueType::STRING) {
                tmpl = std::string(v->get<std::string_view>());
            }
        }
    }
    std::error_code time_error;
    const auto modified = std::filesystem::last_write_time(m.path, time_error);
    const auto modified_sys = std::chrono::time_point_cast<std::chrono::system_clock::duration>(
        modified - std::filesystem::file_time_type::clock::now() + std::chrono::system_clock::now());
    const json license =
        info.contains("general.license") && info["general.license"].is_string() ? info["general.license"] : json("");
    // The answer's text: its strings at most 6 bytes a byte once escaped, and room for each number.
    uint64_t answer_bytes = tmpl.size() * 6 + 4096;
    for (const auto& [key, value] : info.items()) {
        answer_bytes += key.size() + 32 + (value.is_string() ? value.get_ref<const std::string&>().size() * 6 : 0);
    }
    const memory::Charge answer = memory.charge(answer_bytes, "the answer");
    // What the template lets the model do, as Ollama lists it: tools when fitllm parses its calls,
    // thinking when it has <think> blocks.
    json capabilities = json::array({"completion"});
    const TemplateTraits traits = template_traits(tmpl);
    if (traits.tools != ToolCallFormat::none) capabilities.push_back("tools");
    if (traits.thinks) capabilities.push_back("thinking");
    set_json(res, 200,
             {{"license", license},
              {"modelfile", ""},
              {"parameters", ""},
              {"template", tmpl},
              {"details", model_details(f, n_params)},
              {"model_info", info},
              {"capabilities", capabilities},
              {"modified_at", rfc3339(time_error ? std::chrono::system_clock::time_point{} : modified_sys, false)}});
}

void Endpoints::ollama_ps(HttpResponse& res) {
    json models = json::array();
    const auto now = std::chrono::steady_clock::now();
    const auto now_sys = std::chrono::system_clock::now();
    for (const ModelInfo& m : registry_.models()) {
        if (!m.loaded) continue;
        const engine::Plan& plan = m.model->plan();
        // What it holds: the plan's host bytes (weights, KV cache, scratch, logits, overhead) and
        // the offload device's share, which is its size_vram.
        const uint64_t vram = plan.device.total();
        json details = json{{"format", "gguf"}};
        uint64_t n_params = 0;
        try {
            const gguf::GgufFile f = gguf::GgufFile::open(m.path.string());
            n_params = parameter_count(f);
            details = model_details(f, n_params);
        } catch (const std::exception&) {
            // The file changed or went away since it loaded: the details it still knows.
        }
        // Never unloaded: a date far ahead, as Ollama's keep_alive < 0 gives.
        const std::string expires =
            m.expires
                ? rfc3339(now_sys + std::chrono::duration_cast<std::chrono::system_clock::duration>(*m.expires - now),
                          true)
                : std::string("2318-01-01T00:00:00Z");
        models.push_back({{"name", m.id},
                          {"model", m.id},
                          {"size", plan.total() + vram},
                          {"digest", ""},
                          {"details", details},
                          {"expires_at", expires},
                          {"size_vram", vram},
                          {"context_length", m.model->scheduler().n_ctx()}});
    }
    set_json(res, 200, {{"models", models}});
}

}  // namespace fitllm::server
