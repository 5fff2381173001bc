// fitllm inspect MODEL.gguf [--tensors] [--metadata] [--json]
#include "cli/inspect.h"

#include <chrono>
#include <cstdio>
#include <map>

#include "cli/args.h"
#include "cli/commands.h"
#include "model/model.h"
#include "quant/file_type.h"
#include "tokenizer/tokenizer.h"
#include "util/text.h"

namespace fitllm::cli {

using json = nlohmann::ordered_json;

namespace {

json value_to_json(const gguf::Value& v, size_t max_items) {
    using gguf::ValueType;
    auto scalar = [](ValueType t, const gguf::Value& s) -> json {
        switch (t) {
            case ValueType::BOOL:
                return s.get<bool>();
            case ValueType::FLOAT32:
            case ValueType::FLOAT64:
                return s.to_double();
            case ValueType::UINT64:
                return s.get<uint64_t>();
            case ValueType::STRING:
                return std::string(s.get<std::string_view>());
            default:
                return s.to_int();
        }
    };
    if (!v.is_array()) return scalar(v.type(), v);
    json arr = json::array();
    const uint64_t n = std::min<uint64_t>(v.array_size(), max_items);
    for (uint64_t i = 0; i < n; ++i) {
        switch (v.array_type()) {
            case ValueType::STRING:
                arr.push_back(std::string(v.strings()[i]));
                break;
            case ValueType::UINT8:
                arr.push_back(v.array_at<uint8_t>(i));
                break;
            case ValueType::INT8:
                arr.push_back(v.array_at<int8_t>(i));
                break;
            case ValueType::UINT16:
                arr.push_back(v.array_at<uint16_t>(i));
                break;
            case ValueType::INT16:
                arr.push_back(v.array_at<int16_t>(i));
                break;
            case ValueType::UINT32:
                arr.push_back(v.array_at<uint32_t>(i));
                break;
            case ValueType::INT32:
                arr.push_back(v.array_at<int32_t>(i));
                break;
            case ValueType::UINT64:
                arr.push_back(v.array_at<uint64_t>(i));
                break;
            case ValueType::INT64:
                arr.push_back(v.array_at<int64_t>(i));
                break;
            case ValueType::FLOAT32:
                arr.push_back(v.array_at<float>(i));
                break;
            case ValueType::FLOAT64:
                arr.push_back(v.array_at<double>(i));
                break;
            case ValueType::BOOL:
                arr.push_back(v.array_at<bool>(i));
                break;
            default:
                break;
        }
    }
    return arr;
}

// Copies key into out[name] when the file has it.
void copy_if(const gguf::GgufFile& f, const std::string& key, json& out, const char* name) {
    if (const gguf::Value* v = f.find(key)) out[name] = value_to_json(*v, 64);
}

json general_section(const gguf::GgufFile& f) {
    json g = json::object();
    copy_if(f, "general.architecture", g, "architecture");
    copy_if(f, "general.name", g, "name");
    copy_if(f, "general.basename", g, "basename");
    copy_if(f, "general.size_label", g, "size_label");
    copy_if(f, "general.license", g, "license");
    if (const gguf::Value* v = f.find("general.file_type");
        v && !v->is_array() && v->type() != gguf::ValueType::STRING) {
        const int64_t id = v->to_int();
        auto name = id >= 0 && id <= UINT32_MAX ? quant::file_type_name(static_cast<uint32_t>(id)) : std::nullopt;
        g["file_type"] = {{"id", id}, {"name", name ? *name : "unknown"}};
    }
    copy_if(f, "general.quantization_version", g, "quantization_version");
    return g;
}

json hparams_section(const gguf::GgufFile& f, const std::string& arch) {
    json h = json::object();
    if (arch.empty()) return h;
    const std::string a = arch + ".";
    copy_if(f, a + "block_count", h, "n_layer");
    copy_if(f, a + "embedding_length", h, "n_embd");
    copy_if(f, a + "attention.head_count", h, "n_head");
    copy_if(f, a + "attention.head_count_kv", h, "n_head_kv");
    copy_if(f, a + "attention.key_length", h, "head_dim");
    copy_if(f, a + "attention.value_length", h, "head_dim_v");
    if (!h.contains("head_dim") && h.contains("n_embd") && h.contains("n_head") && h["n_head"].is_number_integer() &&
        h["n_head"].get<int64_t>() > 0) {
        h["head_dim"] = h["n_embd"].get<int64_t>() / h["n_head"].get<int64_t>();
    }
    copy_if(f, a + "feed_forward_length", h, "n_ff");
    copy_if(f, a + "expert_count", h, "n_expert");
    copy_if(f, a + "expert_used_count", h, "n_expert_used");
    copy_if(f, a + "expert_feed_forward_length", h, "n_ff_exp");
    copy_if(f, a + "expert_shared_feed_forward_length", h, "n_ff_shexp");  // qwen2moe's shared expert
    copy_if(f, a + "context_length", h, "context_length");
    copy_if(f, a + "vocab_size", h, "vocab_size");
    copy_if(f, a + "attention.layer_norm_rms_epsilon", h, "rms_norm_eps");
    copy_if(f, a + "attention.layer_norm_epsilon", h, "norm_eps");
    copy_if(f, a + "attention.sliding_window", h, "sliding_window");
    copy_if(f, a + "attn_logit_softcapping", h, "attn_logit_softcapping");
    copy_if(f, a + "final_logit_softcapping", h, "final_logit_softcapping");
    json rope = json::object();
    copy_if(f, a + "rope.dimension_count", rope, "dimension_count");
    copy_if(f, a + "rope.freq_base", rope, "freq_base");
    copy_if(f, a + "rope.scaling.type", rope, "scaling_type");
    copy_if(f, a + "rope.scaling.factor", rope, "scaling_factor");
    copy_if(f, a + "rope.scaling.original_context_length", rope, "original_context_length");
    if (!rope.empty()) h["rope"] = rope;
    return h;
}

json tokenizer_section(const gguf::GgufFile& f) {
    json t = json::object();
    copy_if(f, "tokenizer.ggml.model", t, "model");
    copy_if(f, "tokenizer.ggml.pre", t, "pre");
    const gguf::Value* tokens = f.find("tokenizer.ggml.tokens");
    if (tokens && tokens->is_array()) t["vocab_size"] = tokens->array_size();
    if (const gguf::Value* m = f.find("tokenizer.ggml.merges"); m && m->is_array()) t["merges"] = m->array_size();
    static constexpr std::pair<const char*, const char*> kSpecial[] = {
        {"bos", "bos_token_id"},       {"eos", "eos_token_id"},     {"eot", "eot_token_id"},
        {"eom", "eom_token_id"},       {"unk", "unknown_token_id"}, {"pad", "padding_token_id"},
        {"sep", "separator_token_id"}, {"mask", "mask_token_id"},
    };
    json special = json::object();
    for (const auto& [name, key] : kSpecial) {
        const gguf::Value* v = f.find(std::string("tokenizer.ggml.") + key);
        if (!v || v->is_array() || v->type() == gguf::ValueType::STRING) continue;
        const int64_t id = v->to_int();
        json entry = {{"id", id}};
        if (tokens && tokens->is_array() && tokens->array_type() == gguf::ValueType::STRING && id >= 0 &&
            static_cast<uint64_t>(id) < tokens->array_size()) {
            entry["text"] = std::string(tokens->strings()[static_cast<size_t>(id)]);
        }
        special[name] = entry;
    }
    if (!special.empty()) t["special_tokens"] = special;
    copy_if(f, "tokenizer.ggml.add_bos_token", t, "add_bos");
    copy_if(f, "tokenizer.ggml.add_eos_token", t, "add_eos");
    copy_if(f, "tokenizer.ggml.add_space_prefix", t, "add_space_prefix");
    const gguf::Value* tmpl = f.find("tokenizer.chat_template");
    t["chat_template"] = tmpl != nullptr;
    if (tmpl && tmpl->type() == gguf::ValueType::STRING)
        t["chat_template_bytes"] = tmpl->get<std::string_view>().size();
    return t;
}

json shape_of(const gguf::TensorInfo& t) {
    json shape = json::array();
    for (uint32_t d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
    return shape;
}

}  // namespace

namespace {

// Whether fitllm can run the file, and if not the first reason: the model bound as `run` binds it
// (architecture, hyper-parameters, every tensor's name, shape and type; nothing is read or
// allocated) and the tokenizer built.
json runs_section(const gguf::GgufFile& f) {
    try {
        model::Model::load(f);
        tokenizer::Tokenizer::from_gguf(f);
    } catch (const std::exception& e) {
        return {{"runs", false}, {"why", e.what()}};
    }
    return {{"runs", true}};
}

}  // namespace

json inspect_report(const gguf::GgufFile& f, const InspectOptions& options) {
    json r;
    r["file"] = {{"path", f.source()},
                 {"size_bytes", f.size()},
                 {"gguf_version", f.version()},
                 {"alignment", f.alignment()},
                 {"data_offset", f.data_offset()},
                 {"metadata_count", f.metadata().size()},
                 {"tensor_count", f.tensors().size()}};
    r["general"] = general_section(f);
    const std::string arch = r["general"].value("architecture", std::string());
    r["hyperparameters"] = hparams_section(f, arch);
    r["tokenizer"] = tokenizer_section(f);
    r["fitllm"] = runs_section(f);

    struct TypeTotal {
        uint64_t count = 0, elements = 0, bytes = 0;
    };
    std::map<std::string, TypeTotal> by_type;
    uint64_t elements = 0, bytes = 0;
    for (const gguf::TensorInfo& t : f.tensors()) {
        TypeTotal& tt = by_type[std::string(quant::traits(t.type).name)];
        ++tt.count;
        tt.elements += t.n_elements;
        tt.bytes += t.n_bytes;
        elements += t.n_elements;
        bytes += t.n_bytes;
    }
    json types = json::array();
    for (const auto& [name, tt] : by_type) {
        types.push_back({{"type", name}, {"tensors", tt.count}, {"elements", tt.elements}, {"bytes", tt.bytes}});
    }
    r["tensor_types"] = types;
    r["totals"] = {
        {"tensors", f.tensors().size()},
        {"elements", elements},
        {"bytes", bytes},
        {"bits_per_weight", elements ? 8.0 * static_cast<double>(bytes) / static_cast<double>(elements) : 0.0}};
    if (options.tensors) {
        json list = json::array();
        for (const gguf::TensorInfo& t : f.tensors()) {
            list.push_back({{"name", std::string(t.name)},
                            {"type", std::string(quant::traits(t.type).name)},
                            {"shape", shape_of(t)},
                            {"bytes", t.n_bytes},
                            {"offset", f.data_offset() + t.offset}});
        }
        r["tensors"] = list;
    }
    if (options.metadata) {
        json meta = json::array();
        for (const gguf::Value& v : f.metadata()) {
            meta.push_back({{"key", std::string(v.key())}, {"type", v.type_name()}, {"value", v.to_display(16, 200)}});
        }
        r["metadata"] = meta;
    }
    return r;
}

namespace {

std::string scalar_text(const json& j) {
    if (j.is_string()) return j.get<std::string>();
    if (j.is_number_float()) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", j.get<double>());
        return buf;
    }
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void line(std::string& out, const char* label, const std::string& text) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "  %-24s ", label);
    out += buf + text + "\n";
}

}  // namespace

std::string render_inspect_text(const json& r) {
    std::string out;
    const json& file = r["file"];
    out += "file " + file["path"].get<std::string>() + "\n";
    line(out, "size", util::human_bytes(file["size_bytes"]) + " (" + file["size_bytes"].dump() + " bytes)");
    line(out, "format",
         "GGUF v" + file["gguf_version"].dump() + ", alignment " + file["alignment"].dump() + ", data at byte " +
             file["data_offset"].dump());
    line(out, "contents",
         file["metadata_count"].dump() + " metadata keys, " + file["tensor_count"].dump() + " tensors");

    out += "\nmodel\n";
    const json& g = r["general"];
    line(out, "architecture",
         g.contains("architecture") ? scalar_text(g["architecture"]) : "(none: vocab-only or unknown)");
    for (const char* k : {"name", "size_label", "license", "quantization_version"}) {
        if (g.contains(k)) line(out, k, scalar_text(g[k]));
    }
    if (g.contains("file_type"))
        line(out, "file type", g["file_type"]["name"].get<std::string>() + " (" + g["file_type"]["id"].dump() + ")");
    if (r.contains("fitllm")) {
        const json& runs = r["fitllm"];
        line(out, "fitllm runs it",
             runs["runs"].get<bool>() ? "yes" : "no: " + runs.value("why", std::string("(no reason given)")));
    }

    const json& h = r["hyperparameters"];
    if (!h.empty()) {
        out += "\nhyper-parameters\n";
        for (const auto& [k, v] : h.items()) {
            if (k == "rope") continue;
            line(out, k.c_str(), scalar_text(v));
        }
        if (h.contains("rope")) {
            for (const auto& [k, v] : h["rope"].items()) line(out, ("rope." + k).c_str(), scalar_text(v));
        }
    }

    const json& t = r["tokenizer"];
    out += "\ntokenizer\n";
    for (const char* k : {"model", "pre", "vocab_size", "merges", "add_bos", "add_eos", "add_space_prefix"}) {
        if (t.contains(k)) line(out, k, scalar_text(t[k]));
    }
    if (t.contains("special_tokens")) {
        for (const auto& [name, e] : t["special_tokens"].items()) {
            std::string text = e["id"].dump();
            if (e.contains("text")) text += "  " + e["text"].dump(-1, ' ', false, json::error_handler_t::replace);
            line(out, (name + " token").c_str(), text);
        }
    }
    line(out, "chat template",
         t["chat_template"].get<bool>() ? "yes (" + t.value("chat_template_bytes", json(0)).dump() + " bytes)" : "no");

    out += "\ntensors by type\n";
    char buf[160];
    std::snprintf(buf, sizeof buf, "  %-10s %8s %16s %14s %8s\n", "type", "tensors", "elements", "bytes", "share");
    out += buf;
    const double total_bytes = r["totals"]["bytes"].get<double>();
    for (const json& tt : r["tensor_types"]) {
        std::snprintf(buf, sizeof buf, "  %-10s %8llu %16llu %14s %7.1f%%\n", tt["type"].get<std::string>().c_str(),
                      tt["tensors"].get<unsigned long long>(), tt["elements"].get<unsigned long long>(),
                      util::human_bytes(tt["bytes"]).c_str(),
                      total_bytes > 0 ? 100.0 * tt["bytes"].get<double>() / total_bytes : 0.0);
        out += buf;
    }
    const json& tot = r["totals"];
    std::snprintf(buf, sizeof buf, "  %-10s %8llu %16llu %14s   %.2f bits/weight\n", "total",
                  tot["tensors"].get<unsigned long long>(), tot["elements"].get<unsigned long long>(),
                  util::human_bytes(tot["bytes"]).c_str(), tot["bits_per_weight"].get<double>());
    out += buf;

    if (r.contains("tensors")) {
        out += "\ntensors\n";
        std::snprintf(buf, sizeof buf, "  %-40s %-8s %-24s %12s %14s\n", "name", "type", "shape", "bytes", "offset");
        out += buf;
        for (const json& e : r["tensors"]) {
            std::string shape;
            for (const json& d : e["shape"]) shape += (shape.empty() ? "" : " x ") + d.dump();
            std::snprintf(buf, sizeof buf, "  %-40s %-8s %-24s %12llu %14llu\n", e["name"].get<std::string>().c_str(),
                          e["type"].get<std::string>().c_str(), shape.c_str(), e["bytes"].get<unsigned long long>(),
                          e["offset"].get<unsigned long long>());
            out += buf;
        }
    }
    if (r.contains("metadata")) {
        out += "\nmetadata\n";
        for (const json& m : r["metadata"]) {
            out += "  " + m["key"].get<std::string>() + " (" + m["type"].get<std::string>() +
                   ") = " + m["value"].get<std::string>() + "\n";
        }
    }
    return out;
}

int run_inspect(const std::vector<std::string>& args) {
    std::string path;
    InspectOptions options;
    bool as_json = false;
    bool mmap_off = false;
    ArgParser p("fitllm inspect MODEL.gguf [--tensors] [--metadata] [--json]",
                "Show what a GGUF file holds: architecture, file type, hyper-parameters, tokenizer,\n"
                "and the bytes of its tensors by type. Reads the header only.");
    p.positional("MODEL.gguf", "the GGUF file to read (models and vocab-only files)", &path);
    p.flag("--tensors", &options.tensors, "list every tensor: name, type, shape, bytes, file offset");
    p.flag("--metadata", &options.metadata, "list every metadata key with its type and value");
    p.flag("--json", &as_json, "print the report as JSON");
    p.flag("--no-mmap", &mmap_off, "read the file into memory instead of mapping it");
    if (!p.parse(args)) return 0;

    io::MapOptions map_options;
    map_options.use_mmap = !mmap_off;
    const auto start = std::chrono::steady_clock::now();
    const gguf::GgufFile file = gguf::GgufFile::open(path, map_options);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    json report = inspect_report(file, options);
    if (as_json) {
        std::printf("%s\n", report.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    } else {
        std::fputs(render_inspect_text(report).c_str(), stdout);
        std::printf("\nheader read in %.2f ms\n", ms);
    }
    return 0;
}

}  // namespace fitllm::cli
