// Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, and the model
// management of /api/copy, /api/delete, /api/create, /api/pull, /api/push): the Endpoints
// methods that answer it, on the same scheduler and limits as the OpenAI endpoints
// (endpoints.cpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
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
#include "server/model_settings.h"
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

// A model name as Ollama's clients send it: "NAME:latest" is NAME.
std::string strip_latest(std::string name) {
    if (name.size() > 7 && name.compare(name.size() - 7, 7, ":latest") == 0) name.resize(name.size() - 7);
    return name;
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
            json body = text.parse();
            apply_created_settings(registry_, body, chat ? Api::OllamaChat : Api::OllamaGenerate);
            request = parse_ollama_request(body, chat);
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
    name = strip_latest(name);
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
    // What a create gave it: its system prompt, parameters and license, and the Modelfile that
    // says so.
    const json settings = registry_.options().models_dir.empty() ? json::object() : read_settings(m.path);
    json license =
        info.contains("general.license") && info["general.license"].is_string() ? info["general.license"] : json("");
    if (settings.contains("license") && settings["license"].is_string()) license = settings["license"];
    const std::string system =
        settings.contains("system") && settings["system"].is_string() ? settings["system"].get<std::string>() : "";
    // "parameters" as Ollama lists them, a line per value (a list a line per item), and the
    // Modelfile's PARAMETER lines.
    std::string parameters, parameter_lines;
    if (settings.contains("parameters") && settings["parameters"].is_object()) {
        for (const auto& [key, value] : settings["parameters"].items()) {
            for (const json& v : value.is_array() ? value : json::array({value})) {
                parameters += key + std::string(key.size() < 30 ? 30 - key.size() : 1, ' ') + dump_json(v) + "\n";
                parameter_lines += "PARAMETER " + key + " " + dump_json(v) + "\n";
            }
        }
    }
    std::string modelfile = "# Modelfile of '" + m.id + "' (fitllm)\nFROM " + m.path.string() + "\n";
    if (!system.empty()) modelfile += "SYSTEM \"\"\"" + system + "\"\"\"\n";
    modelfile += parameter_lines;
    if (license.is_string() && !license.get_ref<const std::string&>().empty()) {
        modelfile += "LICENSE \"\"\"" + license.get<std::string>() + "\"\"\"\n";
    }
    // The answer's text: its strings at most 6 bytes a byte once escaped, and room for each number.
    uint64_t answer_bytes = (tmpl.size() + 2 * modelfile.size()) * 6 + 4096;
    for (const auto& [key, value] : info.items()) {
        answer_bytes += key.size() + 32 + (value.is_string() ? value.get_ref<const std::string&>().size() * 6 : 0);
    }
    const memory::Charge answer = memory.charge(answer_bytes, "the answer");
    // What the template lets the model do, as Ollama lists it: tools when fitllm parses its calls
    // (a template that shows no tools gets them in a system prompt: prepare_render), thinking when
    // it has <think> blocks.
    json capabilities = json::array({"completion"});
    const TemplateTraits traits = template_traits(tmpl);
    if (traits.tools != ToolCallFormat::none || !traits.takes_tools) capabilities.push_back("tools");
    if (traits.thinks) capabilities.push_back("thinking");
    set_json(res, 200,
             {{"license", license},
              {"modelfile", modelfile},
              {"parameters", parameters},
              {"system", system},
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

namespace {

// The JSON object of a management request (small: names, a path, a system prompt), charged.
json management_body(HttpRequest& req, RequestMemory& memory, memory::Charge& charge) {
    memory.note(req.body.size());
    json body = parse_charged(req, memory, charge);
    if (!body.is_object()) throw ApiError::invalid("the request body: expected a JSON object", "invalid_type");
    return body;
}

// A string field, or "" when absent or null; ApiError 400 naming it when it is not a string.
std::string string_field(const json& body, const char* key) {
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) return "";
    if (!it->is_string()) throw ApiError::invalid(std::string(key) + ": expected a string", "invalid_type", key);
    return it->get<std::string>();
}

// "model", or Ollama's older "name", as a model's id (":latest" dropped); ApiError 400 when
// neither is there.
std::string model_name(const json& body) {
    std::string name = string_field(body, "model");
    if (name.empty()) name = string_field(body, "name");
    if (name.empty()) throw ApiError::invalid("model: required", "missing_field", "model");
    return strip_latest(name);
}

// Ollama's "stream" (true when absent); ApiError 400 when it is not a boolean.
bool stream_field(const json& body) {
    const auto it = body.find("stream");
    if (it == body.end() || it->is_null()) return true;
    if (!it->is_boolean()) throw ApiError::invalid("stream: expected a boolean", "invalid_type", "stream");
    return it->get<bool>();
}

// Refuses a field that is not in `known`, naming it.
void only_fields(const json& body, std::initializer_list<const char*> known, const char* endpoint) {
    for (const auto& item : body.items()) {
        const std::string& key = item.key();
        if (std::none_of(known.begin(), known.end(), [&key](const char* k) { return key == k; })) {
            throw ApiError::unsupported(key, std::string("not a field of ") + endpoint + " that fitllm knows");
        }
    }
}

// Ollama's status answer: {"status": ...} lines (NDJSON) when streamed, else the last one.
void status_answer(HttpResponse& res, bool stream, const std::vector<std::string>& statuses) {
    if (!stream) return set_json(res, 200, {{"status", statuses.back()}});
    res.status = 200;
    res.content_type = "application/x-ndjson";
    for (const std::string& status : statuses) res.body += dump_json({{"status", status}}) + "\n";
}

// The model file `source` under a new name `target` (a new file in the same models directory):
// a symbolic link as it is (its target stays the same), else a hard link (no bytes copied; each
// name removed alone), else, where the file system has no hard links or refuses one, a
// symbolic link to the source's absolute path.
void link_model_file(const std::filesystem::path& source, const std::filesystem::path& target) {
    namespace fs = std::filesystem;
    try {
        if (fs::is_symlink(source)) {
            fs::path to = fs::read_symlink(source);
            if (to.is_relative()) to = fs::canonical(source);  // relative to the source's folder
            fs::create_symlink(to, target);
            return;
        }
        std::error_code ec;
        fs::create_hard_link(source, target, ec);
        if (!ec) return;
        fs::create_symlink(fs::canonical(source), target);
    } catch (const fs::filesystem_error& e) {
        throw ApiError(500, "server_error", "model_write_failed",
                       "cannot link " + source.string() + " as " + target.string() + ": " + e.what());
    }
}

void write_settings(const json& settings, const std::filesystem::path& path) {
    const std::string text = settings.dump(2) + "\n";
    std::FILE* f = std::fopen(path.c_str(), "wb");
    const bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (f && std::fclose(f) != 0) {
        throw ApiError(500, "server_error", "model_write_failed", "cannot write " + path.string());
    }
    if (!ok) throw ApiError(500, "server_error", "model_write_failed", "cannot write " + path.string());
}

// A new model's name: ApiError 400 naming the field and the name when it cannot be one.
std::string new_model_name(const std::string& name, const char* field) {
    if (const std::string why = ModelRegistry::name_problem(name, true); !why.empty()) {
        throw ApiError::invalid(std::string(field) + ": invalid name '" + name + "': " + why, "invalid_model_name",
                                field);
    }
    return name;
}

}  // namespace

void Endpoints::ollama_copy(HttpRequest& req, HttpResponse& res) {
    RequestMemory memory(request_pool());
    memory::Charge charge;
    const json body = management_body(req, memory, charge);
    only_fields(body, {"source", "destination"}, "POST /api/copy");
    registry_.require_models_dir("POST /api/copy");
    const std::string source = strip_latest(string_field(body, "source"));
    const std::string destination = strip_latest(string_field(body, "destination"));
    if (source.empty()) throw ApiError::invalid("source: required", "missing_field", "source");
    if (destination.empty()) throw ApiError::invalid("destination: required", "missing_field", "destination");
    if (const std::string why = ModelRegistry::name_problem(source, false); !why.empty()) {
        throw ApiError::invalid("source: invalid name '" + source + "': " + why, "invalid_model_name", "source");
    }
    new_model_name(destination, "destination");
    const ModelInfo from = [&] {
        try {
            return registry_.find(source);
        } catch (const ApiError& e) {
            if (e.status() != 404) throw;
            throw ApiError(404, e.type(), e.code(), "source: model '" + source + "' does not exist", "source");
        }
    }();
    if (from.id == destination) {
        throw ApiError::invalid("destination: '" + destination + "' is the source model itself", "invalid_value",
                                "destination");
    }
    registry_.put_model(destination, [&](const std::filesystem::path& gguf, const std::filesystem::path& settings) {
        link_model_file(from.path, gguf);
        const json kept = read_settings(from.path);
        if (!kept.empty()) write_settings(kept, settings);
    });
    set_json(res, 200, {{"status", "success"}});
}

void Endpoints::ollama_delete(HttpRequest& req, HttpResponse& res) {
    RequestMemory memory(request_pool());
    memory::Charge charge;
    const json body = management_body(req, memory, charge);
    only_fields(body, {"model", "name"}, "DELETE /api/delete");
    registry_.require_models_dir("DELETE /api/delete");
    registry_.remove_model(model_name(body));
    set_json(res, 200, {{"status", "success"}});
}

void Endpoints::ollama_create(HttpRequest& req, HttpResponse& res) {
    RequestMemory memory(request_pool());
    memory::Charge charge;
    const json body = management_body(req, memory, charge);
    // Ollama's create fields fitllm cannot keep, and why.
    static constexpr std::pair<const char*, const char*> kRefused[] = {
        {"template",
         "Ollama's Go templates are not supported: fitllm renders the chat template of the GGUF file (its "
         "tokenizer.chat_template)"},
        {"files",
         "uploaded blobs (/api/blobs) are not supported: give \"from\" the path of a GGUF file the server "
         "can read"},
        {"adapters", "LoRA adapters are not supported"},
        {"quantize", "not done by the server: run `fitllm quantize IN OUT TYPE` and create the model from OUT"},
        {"messages", "a conversation kept with the model is not supported"},
        {"modelfile", "the Modelfile text of Ollama before 0.5.5 is not read: give from, system, parameters"},
        {"path", "the Modelfile path of Ollama before 0.5.5 is not read: give from, system, parameters"},
    };
    for (const auto& [field, why] : kRefused) {
        const auto it = body.find(field);
        if (it != body.end() && !it->is_null() && !(it->is_object() && it->empty()) &&
            !(it->is_array() && it->empty()) && *it != "") {
            throw ApiError::unsupported(field, why);
        }
    }
    only_fields(body,
                {"model", "name", "from", "system", "parameters", "license", "stream", "template", "files", "adapters",
                 "quantize", "messages", "modelfile", "path"},
                "POST /api/create");
    registry_.require_models_dir("POST /api/create");
    const std::string id = new_model_name(model_name(body), "model");
    const bool stream = stream_field(body);
    const std::string from = string_field(body, "from");
    if (from.empty()) {
        throw ApiError::invalid("from: required (a model here, or the path of a GGUF file the server can read)",
                                "missing_field", "from");
    }
    // The settings: the base model's, then the request's.
    json settings = json::object();
    std::filesystem::path source;
    ModelInfo base;
    bool from_model = false;
    if (ModelRegistry::name_problem(strip_latest(from), false).empty()) {
        try {
            base = registry_.find(strip_latest(from));
            from_model = true;
        } catch (const ApiError& e) {
            if (e.status() != 404) throw;
        }
    }
    std::vector<std::string> statuses;
    if (from_model) {
        source = base.path;
        settings = read_settings(source);
        statuses.push_back("using the model '" + base.id + "'");
    } else {
        std::error_code ec;
        source = std::filesystem::canonical(from, ec);
        if (ec || !std::filesystem::is_regular_file(source)) {
            throw ApiError(404, "invalid_request_error", "model_not_found",
                           "from: '" + from +
                               "' is neither a model here (GET /api/tags lists them) nor a GGUF file the server can "
                               "read" +
                               (ec ? " (" + ec.message() + ")" : std::string(" (not a file)")),
                           "from");
        }
        statuses.push_back("reading model metadata");
        try {
            const gguf::GgufFile f = gguf::GgufFile::open(source.string());  // the header, checked
        } catch (const std::exception& e) {
            throw ApiError::invalid("from: " + source.string() + " is not a GGUF file fitllm reads: " + e.what(),
                                    "invalid_value", "from");
        }
    }
    if (const auto it = body.find("system"); it != body.end() && !it->is_null()) {
        if (!it->is_string()) throw ApiError::invalid("system: expected a string", "invalid_type", "system");
        settings["system"] = *it;
    }
    if (const auto it = body.find("license"); it != body.end() && !it->is_null()) {
        std::string license;
        if (it->is_string()) {
            license = it->get<std::string>();
        } else if (it->is_array() && std::all_of(it->begin(), it->end(), [](const json& l) { return l.is_string(); })) {
            for (const json& l : *it) license += (license.empty() ? "" : "\n\n") + l.get<std::string>();
        } else {
            throw ApiError::invalid("license: expected a string or an array of strings", "invalid_type", "license");
        }
        settings["license"] = license;
    }
    if (const auto it = body.find("parameters"); it != body.end() && !it->is_null()) {
        if (!it->is_object()) throw ApiError::invalid("parameters: expected an object", "invalid_type", "parameters");
        json merged = settings.contains("parameters") && settings["parameters"].is_object() ? settings["parameters"]
                                                                                            : json::object();
        for (const auto& [key, value] : it->items()) {
            if (value.is_null()) {
                merged.erase(key);
            } else {
                merged[key] = value;
            }
        }
        // Checked as a request's options are: the ones fitllm implements, with values it takes.
        try {
            parse_ollama_request({{"prompt", "x"}, {"options", merged}}, false);
        } catch (const ApiError& e) {
            std::string message = e.what();
            std::optional<std::string> param = e.param();
            if (message.rfind("options.", 0) == 0) message = "parameters." + message.substr(8);
            if (param && param->rfind("options.", 0) == 0) param = "parameters." + param->substr(8);
            throw ApiError(e.status(), e.type(), e.code(), message, param);
        }
        settings["parameters"] = std::move(merged);
    }
    statuses.push_back("linking the model file");
    if (!settings.empty()) statuses.push_back("writing the model's settings");
    registry_.put_model(id, [&](const std::filesystem::path& gguf, const std::filesystem::path& settings_path) {
        link_model_file(source, gguf);
        if (!settings.empty()) write_settings(settings, settings_path);
    });
    statuses.push_back("success");
    status_answer(res, stream, statuses);
}

void Endpoints::ollama_pull(bool push, HttpRequest& req, HttpResponse& res) {
    RequestMemory memory(request_pool());
    memory::Charge charge;
    const json body = management_body(req, memory, charge);
    const char* endpoint = push ? "POST /api/push" : "POST /api/pull";
    only_fields(body, {"model", "name", "insecure", "stream", "username", "password"}, endpoint);
    const std::string name = model_name(body);
    const bool stream = stream_field(body);
    if (const std::string why = ModelRegistry::name_problem(name, false); !why.empty()) {
        throw ApiError::invalid("model: invalid name '" + name + "': " + why, "invalid_model_name", "model");
    }
    const bool dir = !registry_.options().models_dir.empty();
    const std::string how =
        dir ? "add a model as a GGUF file in the --models-dir directory (" +
                  (registry_.options().models_dir / (name + ".gguf")).string() +
                  ") or with POST /api/create {\"model\": \"" + name + "\", \"from\": \"/path/to/file.gguf\"}"
            : "this server serves the one model of -m; to offer others, start `fitllm serve --models-dir DIR` and "
              "put GGUF files in DIR";
    try {
        registry_.find(name);  // here already: up to date, as Ollama answers a pull of a model it has
    } catch (const ApiError& e) {
        if (e.status() != 404) throw;
        throw ApiError(404, "invalid_request_error", "model_not_found",
                       std::string(push ? "push" : "pull") + " model '" + name +
                           "': the model is not here and fitllm " + (push ? "uploads" : "downloads") + " no models; " +
                           how,
                       "model");
    }
    if (push) {
        throw ApiError(501, "invalid_request_error", "not_implemented",
                       "push model '" + name +
                           "': fitllm uploads no models to a registry (the model is the GGUF "
                           "file the server serves; copy that file instead)",
                       "model");
    }
    status_answer(res, stream, {"success"});
}

}  // namespace fitllm::server
