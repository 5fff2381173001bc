// fitllm plan -m MODEL [-c N] [-np N] [-b N] [-ctk T] [-ctv T] [--mem SIZE] [--device NAME -ngl N --vram SIZE]
//             [--unified]
//             [--fit] [--json]
// The memory plan of a run (memory/plan.h), from the GGUF header alone.
#include "memory/plan.h"

#include <cctype>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/run_budget.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "memory/budget.h"
#include "util/text.h"

namespace fitllm::cli {

namespace {

using json = nlohmann::ordered_json;

// "q8_0", as -ctk / -ctv spell it.
std::string type_str(quant::GgmlType t) {
    std::string s(quant::type_name(static_cast<uint32_t>(t)));
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

quant::GgmlType kv_type_option(const std::string& option, const std::string& value) {
    try {
        return kv::kv_type_from_name(value);
    } catch (const std::invalid_argument& e) {
        throw UsageError(option + ": " + e.what());
    }
}

std::string kv_detail(const memory::Plan& p, bool on_device) {
    std::string s;
    for (const memory::KvPoolPlan& pool : p.kv_pools) {
        if (pool.on_device != on_device) continue;
        if (!s.empty()) s += "; ";
        s += std::to_string(pool.n_layer) + " layers x " + std::to_string(pool.n_cells) + " cells";
        if (pool.window > 0) s += " (window " + std::to_string(pool.window) + ")";
    }
    if (s.empty()) return "none";
    s += ", " + type_str(p.params.type_k) + "/" + type_str(p.params.type_v);
    if (!on_device && p.kv_spilled > 0)
        s += "; " + util::human_bytes(p.kv_spilled) + " spilled to disk (not in the total)";
    return s;
}

json plan_json(const memory::Plan& p, const std::string& budget_source) {
    const memory::PlanParams& q = p.params;
    json pools = json::array();
    for (const memory::KvPoolPlan& pool : p.kv_pools) {
        if (pool.on_device && !p.device.unified) continue;  // (a unified device's are the host's)
        pools.push_back({{"window", pool.window},
                         {"n_layer", pool.n_layer},
                         {"n_cells", pool.n_cells},
                         {"bytes", pool.bytes},
                         {"device", pool.on_device ? p.device.name : "host"}});
    }
    json steps = json::array();
    for (const memory::FitStep& s : p.fit_steps) steps.push_back({{"change", s.change}, {"reason", s.reason}});
    json out = {
        {"model", p.shape.source},
        {"arch", p.shape.hp.arch},
        {"n_layer", p.shape.hp.n_layer},
        {"settings",
         {{"n_ctx", q.n_ctx},
          {"n_seq", q.n_seq},
          {"n_batch", q.n_batch},
          {"n_outputs", q.n_outputs},
          {"type_k", type_str(q.type_k)},
          {"type_v", type_str(q.type_v)},
          {"n_threads", q.n_threads},
          {"n_streamed_layers", q.n_streamed_layers}}},
        {"devices", json::array({{{"name", "host"},
                                  {"weights_resident", p.weights_resident},
                                  {"weights_streamed", p.weights_streamed},
                                  {"stream_buffer", p.stream_buffer},
                                  {"kv", p.kv},
                                  {"kv_pools", pools},
                                  {"kv_spilled", p.kv_spilled},
                                  {"scratch", p.scratch},
                                  {"activations", p.activations},
                                  {"matmul_scratch", p.matmul_scratch},
                                  {"attention_scratch", p.attention_scratch},
                                  {"logits", p.logits},
                                  {"overhead", p.overhead},
                                  {"device_staging", p.device_host},
                                  {"total", p.total()},
                                  {"budget", q.budget},
                                  {"budget_source", budget_source},
                                  {"fits", p.total() <= q.budget}}})},
    };
    if (!p.device.name.empty()) {
        json dpools = json::array();
        for (const memory::KvPoolPlan& pool : p.kv_pools) {
            if (pool.on_device) {
                dpools.push_back({{"window", pool.window},
                                  {"n_layer", pool.n_layer},
                                  {"n_cells", pool.n_cells},
                                  {"bytes", pool.bytes}});
            }
        }
        json d = {{"name", p.device.name},       {"unified", p.device.unified}, {"n_layer", p.device.n_layer},
                  {"output", p.device.output},   {"weights", p.device.weights}, {"kv", p.device.kv},
                  {"kv_pools", dpools},          {"scratch", p.device.scratch}, {"total", p.device.total()},
                  {"budget", p.device.capacity}, {"fits", p.device.fits()}};
        if (p.device.unified) {
            // Its share is inside the host's numbers above; nothing of its own to budget.
            d["weights_in_place"] = p.device.weights_in_place;
            d["in_host_total"] = true;
            d["budget"] = nullptr;
            d["budget_source"] = "the host's (unified)";
        }
        out["devices"].push_back(d);
        out["settings"]["device"] = p.device.name;
        out["settings"]["n_gpu_layers"] = q.n_gpu_layers;
        out["settings"]["kv_offload"] = q.kv_offload;
        out["settings"]["unified"] = q.unified;
    }
    out["fits"] = p.fits();
    if (p.fitted) out["fit"] = steps;
    return out;
}

}  // namespace

std::string plan_text(const memory::Plan& p, const std::string& budget_source) {
    const memory::PlanParams& q = p.params;
    std::string out;
    char line[512];
    const auto row = [&](const char* name, uint64_t bytes, const std::string& detail) {
        std::snprintf(line, sizeof line, "  %-18s %12s%s%s\n", name, util::human_bytes(bytes).c_str(),
                      detail.empty() ? "" : "  ", detail.c_str());
        out += line;
    };
    out += "model     " + p.shape.source + " (" + p.shape.hp.arch + ", " + std::to_string(p.shape.hp.n_layer) +
           " layers, " + util::human_bytes(p.shape.file_bytes) + ")\n";
    std::snprintf(line, sizeof line, "settings  -c %d -np %d -b %d -ctk %s -ctv %s (%d threads)\n", q.n_ctx, q.n_seq,
                  q.n_batch, type_str(q.type_k).c_str(), type_str(q.type_v).c_str(), q.n_threads);
    out += line;
    out += "\ndevice host\n";
    const int n_layer = p.shape.hp.n_layer;
    const memory::DevicePlan& dev = p.device;
    const int n_resident = n_layer - (dev.unified ? 0 : dev.n_layer) - q.n_streamed_layers;
    row("weights resident", p.weights_resident,
        "mapped: " + std::to_string(n_resident) + " of " + std::to_string(n_layer) + " layers, embeddings" +
            (dev.output && !dev.unified ? "" : " and output") +
            (dev.unified && dev.n_layer > 0
                 ? " (" + dev.name + " reads " + std::to_string(dev.n_layer) + " of them in place)"
                 : ""));
    if (q.n_streamed_layers > 0) {
        row("weights streamed", p.weights_streamed,
            std::to_string(q.n_streamed_layers) + " layers read from the file as needed (not in the total)");
        row("stream buffer", p.stream_buffer, "two of the largest streamed layers");
    }
    row("KV cache", p.kv,
        kv_detail(p, false) +
            (dev.unified && dev.kv > 0 ? "; and " + dev.name + "'s " + util::human_bytes(dev.kv) : ""));
    row("scratch", p.scratch,
        "activations " + util::human_bytes(p.activations) + " for " + std::to_string(q.n_batch) +
            " tokens, op scratch " + util::human_bytes(std::max(p.matmul_scratch, p.attention_scratch)) +
            (dev.unified && dev.scratch > 0 ? ", " + dev.name + "'s " + util::human_bytes(dev.scratch) : ""));
    row("outputs", p.logits,
        "logits: " + std::to_string(q.n_outputs) + " x " + std::to_string(p.shape.hp.n_vocab) + " floats");
    row("overhead", p.overhead,
        "runtime " + util::human_bytes(memory::kFixedOverhead) + ", metadata and tokenizer " +
            util::human_bytes(memory::kMetadataFactor * p.shape.metadata_bytes));
    if (p.device_host > 0) {
        row("device staging", p.device_host, "pinned buffer of " + p.device.name + "'s copies (fixed)");
    }
    row("total", p.total(), "");
    row("budget", q.budget, budget_source);
    out += std::string("  fits               ") + (p.total() <= q.budget ? "yes" : "no") + "\n";
    if (dev.unified) {
        const memory::DevicePlan& d = dev;
        out += "\ndevice " + d.name +
               " (unified: shares the host's memory and budget; its share is in the host's above)\n";
        row("weights", d.weights,
            std::to_string(d.n_layer) + " of " + std::to_string(n_layer) + " layers" +
                (d.output ? " and the output layer" : "") + " (-ngl " + std::to_string(q.n_gpu_layers) +
                "): " + util::human_bytes(d.weights_in_place) + " read in place from the mapped file, no copy");
        row("KV cache", d.kv, q.kv_offload ? kv_detail(p, true) + ", in the host's" : "none (--no-kv-offload)");
        row("scratch", d.scratch,
            d.n_layer > 0 ? "activations and op scratch for " + std::to_string(q.n_batch) + " tokens, in the host's"
                          : "");
        row("total", d.total(), "in the host's total");
    } else if (!p.device.name.empty()) {
        const memory::DevicePlan& d = p.device;
        out += "\ndevice " + d.name + "\n";
        row("weights", d.weights,
            std::to_string(d.n_layer) + " of " + std::to_string(n_layer) + " layers" +
                (d.output ? " and the output layer" : "") + " (-ngl " + std::to_string(q.n_gpu_layers) + ")");
        row("KV cache", d.kv, q.kv_offload ? kv_detail(p, true) : "none (--no-kv-offload)");
        row("scratch", d.scratch,
            d.n_layer > 0 ? "activations and op scratch for " + std::to_string(q.n_batch) + " tokens" : "");
        row("total", d.total(), "");
        row("budget", d.capacity, d.capacity == 0 ? "no limit (--vram)" : "--vram");
        out += std::string("  fits               ") + (d.fits() ? "yes" : "no") + "\n";
    }
    if (p.fitted) {
        if (p.fit_steps.empty()) out += "\n--fit: fits as asked; nothing changed\n";
        for (const memory::FitStep& s : p.fit_steps) out += "\n--fit: " + s.change + "\n       why: " + s.reason + "\n";
    }
    return out;
}

int run_plan(const std::vector<std::string>& args) {
    std::string model_path, mem;
    memory::PlanParams params;
    bool fit = false, as_json = false;
    ArgParser p(
        "fitllm plan -m MODEL [-c N] [-np N] [-b N] [-ctk T] [-ctv T] [--mem SIZE] [--stream-layers N] "
        "[--device NAME] [-ngl N] [--vram SIZE] [--no-kv-offload] [--unified] [--fit] [--json]",
        "Show where every byte of a run would go, from the GGUF header alone: weights (resident\n"
        "or streamed), KV cache, scratch, outputs and overhead per device, the total, and whether\n"
        "it fits the memory budget. --fit changes the settings until it does: it quantizes the KV\n"
        "cache first, then streams weights, and shortens the context only as the last resort.\n"
        "Exit status 3 when the plan does not fit.");
    p.option("-m, --model", "FILE", "the GGUF model", &model_path);
    p.option("-c, --ctx-size", "N", "KV cache cells, all sequences together (default 2048; 0: the model's)",
             &params.n_ctx);
    p.option("-np, --parallel", "N", "sequences sharing the cache (default 1)", &params.n_seq);
    p.option("-b, --batch-size", "N", "tokens per forward pass (default 512)", &params.n_batch);
    p.option("-t, --threads", "N", "threads (default: all)", &params.n_threads);
    p.option("-ctk, --cache-type-k", "TYPE", "KV cache type of K: f32, f16, bf16, q8_0, q4_0, ... (default f16)",
             [&](const std::string& v) { params.type_k = kv_type_option("-ctk", v); });
    p.option("-ctv, --cache-type-v", "TYPE", "KV cache type of V, as -ctk (default f16)",
             [&](const std::string& v) { params.type_v = kv_type_option("-ctv", v); });
    p.option("--mem", "SIZE",
             "host memory budget: 900M, 1.5G, 2GiB, bytes (default: the cgroup limit, else MemAvailable, "
             "less 5% or 64 MiB)",
             &mem);
    p.option("--stream-layers", "N", "stream the weights of the last N layers (default 0; --fit may stream more)",
             &params.n_streamed_layers);
    p.option("--kv-resident", "SIZE",
             "KV spill (run's --kv-spill-dir): the K/V bytes kept in memory, the rest in the spill file",
             [&](const std::string& v) {
                 try {
                     params.kv_resident_limit = memory::parse_size(v);
                 } catch (const memory::SizeError& e) {
                     throw UsageError(std::string("--kv-resident: ") + e.what());
                 }
             });
    MemoryOptions offload;
    add_offload_options(p, offload);
    p.flag("--fit", &fit, "change the settings until the plan fits the budget, and say why");
    p.flag("--json", &as_json, "print the plan as JSON");
    if (!p.parse(args)) return 0;
    if (model_path.empty()) throw UsageError("-m MODEL is required");
    if (params.n_ctx < 0) throw UsageError("-c: " + std::to_string(params.n_ctx) + " is negative");
    if (params.n_streamed_layers < 0) {
        throw UsageError("--stream-layers: " + std::to_string(params.n_streamed_layers) + " is negative");
    }

    const ResolvedBudget budget = resolve_budget(mem);
    params.budget = budget.bytes;
    const std::unique_ptr<backend::Backend> device =
        apply_offload_options(offload, params, /*host=*/nullptr, /*plan_only=*/true);
    const std::string& budget_source = budget.source;

    const gguf::GgufFile file = gguf::GgufFile::open(model_path);
    const memory::ModelShape shape = memory::model_shape(file);
    memory::Plan plan;
    try {
        plan = fit ? memory::fit_plan(shape, params) : memory::make_plan(shape, params);
    } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
    }
    if (as_json) {
        std::printf("%s\n", plan_json(plan, budget_source).dump(2).c_str());
    } else {
        std::fputs(plan_text(plan, budget_source).c_str(), stdout);
    }
    return plan.fits() ? 0 : 3;
}

}  // namespace fitllm::cli
