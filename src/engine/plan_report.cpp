#include "engine/plan_report.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <vector>

#include "memory/pool.h"
#include "util/text.h"

namespace fitllm::engine {

namespace {

using json = nlohmann::ordered_json;

// "q8_0", as -ctk / -ctv spell it.
std::string type_str(quant::GgmlType t) {
    std::string s(quant::type_name(static_cast<uint32_t>(t)));
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string kv_detail(const Plan& p, bool on_device) {
    std::string s;
    for (const KvPoolPlan& pool : p.kv_pools) {
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

}  // namespace

nlohmann::ordered_json plan_json(const Plan& p, const std::string& budget_source) {
    const PlanParams& q = p.params;
    json pools = json::array();
    for (const KvPoolPlan& pool : p.kv_pools) {
        if (pool.on_device && !p.device.unified) continue;  // (a unified device's are the host's)
        pools.push_back({{"window", pool.window},
                         {"n_layer", pool.n_layer},
                         {"n_cells", pool.n_cells},
                         {"bytes", pool.bytes},
                         {"device", pool.on_device ? p.device.name : "host"}});
    }
    json steps = json::array();
    for (const FitStep& s : p.fit_steps) steps.push_back({{"change", s.change}, {"reason", s.reason}});
    json out = {
        {"model", p.shape.source},
        {"arch", p.shape.hp.arch},
        {"n_layer", p.shape.hp.n_layer},
        {"n_expert", p.shape.hp.n_expert},  // 0: a dense model
        {"n_expert_used", p.shape.hp.n_expert_used},
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
                                  {"prompt_cache", p.prompt_cache},
                                  {"overhead", p.overhead},
                                  {"samplers", p.samplers},
                                  {"device_staging", p.device_host},
                                  {"total", p.total()},
                                  {"budget", q.budget},
                                  {"budget_source", budget_source},
                                  {"fits", p.total() <= q.budget}}})},
    };
    if (p.draft_slots > 0) out["settings"]["draft_slots"] = p.draft_slots;  // kv_pools: each slot's
    if (!p.device.name.empty()) {
        json dpools = json::array();
        for (const KvPoolPlan& pool : p.kv_pools) {
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
        // Placement by tensor class: the routed experts of these offloaded layers stay on the host.
        d["host_expert_layers"] = p.device.n_host_expert_layers;
        d["host_experts"] = p.device.host_experts;
        // The other weight matrices of its layers kept on the host (-ot '.*=CPU': KV-only offload).
        d["host_matrices"] = p.device.n_host_matrices;
        d["host_matrix_bytes"] = p.device.host_matrices;
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
    if (p.shape.hp.is_moe()) {
        const model::Hparams& hp = p.shape.hp;
        json per_layer = json::array();
        for (const uint64_t b : p.shape.layer_expert_bytes) per_layer.push_back(b / static_cast<uint64_t>(hp.n_expert));
        out["experts"] = {{"dense_bytes", p.shape.dense_bytes()},
                          {"shared_expert_bytes", p.shape.shared_expert_bytes},  // of dense_bytes
                          {"expert_bytes", p.shape.expert_bytes},
                          {"bytes_per_expert", per_layer},  // per layer: gate + up + down of one expert
                          {"resident", p.n_expert_slots == 0},
                          {"n_slots", p.n_expert_slots},
                          {"slot_bytes", p.shape.expert_slot_bytes},
                          {"cache_bytes", p.expert_cache},
                          {"miss_rate_assumed", p.expert_miss_rate},
                          {"read_per_token", p.expert_read_per_token}};
        out["devices"][0]["expert_cache"] = p.expert_cache;
        out["settings"]["expert_slots"] = p.n_expert_slots;
    }
    out["fits"] = p.fits();
    if (p.fitted) out["fit"] = steps;
    return out;
}

// "; their routed experts stay on the host (8 layers, 1.2 GiB)" (tensor overrides), or "".
static std::string host_experts_text(const DevicePlan& d) {
    std::string text;
    if (d.n_host_expert_layers > 0) {
        text = "; the routed experts of " + std::to_string(d.n_host_expert_layers) + " of them stay on the host (" +
               util::human_bytes(d.host_experts) + ", --cpu-moe / -ot)";
    }
    if (d.n_host_matrices > 0) {
        text += "; " + std::to_string(d.n_host_matrices) + " of their weight matrices stay on the host (" +
                util::human_bytes(d.host_matrices) + ", -ot), multiplied there";
    }
    return text;
}

std::string plan_text(const Plan& p, const std::string& budget_source) {
    const PlanParams& q = p.params;
    std::string out;
    char line[512];
    const auto row = [&](const char* name, uint64_t bytes, const std::string& detail) {
        std::snprintf(line, sizeof line, "  %-18s %12s%s%s\n", name, util::human_bytes(bytes).c_str(),
                      detail.empty() ? "" : "  ", detail.c_str());
        out += line;
    };
    const std::string experts =
        p.shape.hp.is_moe()
            ? ", " + std::to_string(p.shape.hp.n_expert) + " experts (" + std::to_string(p.shape.hp.n_expert_used) +
                  " used, " +
                  (p.n_expert_slots > 0 ? std::to_string(p.n_expert_slots) + " cached" : std::string("all resident")) +
                  ")"
            : "";
    out += "model     " + p.shape.source + " (" + p.shape.hp.arch + ", " + std::to_string(p.shape.hp.n_layer) +
           " layers" + experts + ", " + util::human_bytes(p.shape.file_bytes) + ")\n";
    std::snprintf(line, sizeof line, "settings  -c %d -np %d -b %d -ctk %s -ctv %s", q.n_ctx, q.n_seq, q.n_batch,
                  type_str(q.type_k).c_str(), type_str(q.type_v).c_str());
    out += line;
    if (q.n_cached_prompts > 0) out += " --cache-prompts " + std::to_string(q.n_cached_prompts);
    out += " (" + std::to_string(q.n_threads) + " threads)\n";
    out += "\ndevice host\n";
    const int n_layer = p.shape.hp.n_layer;
    const DevicePlan& dev = p.device;
    const int n_resident = n_layer - (dev.unified ? 0 : dev.n_layer) - q.n_streamed_layers;
    row("weights resident", p.weights_resident,
        "mapped: " + std::to_string(n_resident) + " of " + std::to_string(n_layer) + " layers" +
            (p.n_expert_slots > 0 ? " (their dense weights)" : "") + ", embeddings" +
            (dev.output && !dev.unified ? "" : " and output") +
            (dev.unified && dev.n_layer > 0
                 ? " (" + dev.name + " reads " + std::to_string(dev.n_layer) + " of them in place)"
                 : "") +
            (dev.n_host_expert_layers > 0 && !dev.unified
                 ? ", and the routed experts of " + std::to_string(dev.n_host_expert_layers) + " offloaded layers (" +
                       util::human_bytes(dev.host_experts) + ")"
                 : "") +
            (dev.n_host_matrices > 0 && !dev.unified
                 ? ", and " + std::to_string(dev.n_host_matrices) + " weight matrices of offloaded layers (" +
                       util::human_bytes(dev.host_matrices) + ", -ot)"
                 : ""));
    if (p.shape.hp.is_moe()) {
        const model::Hparams& hp = p.shape.hp;
        uint64_t lo = UINT64_MAX, hi = 0;
        for (const uint64_t b : p.shape.layer_expert_bytes) {
            lo = std::min(lo, b / static_cast<uint64_t>(hp.n_expert));
            hi = std::max(hi, b / static_cast<uint64_t>(hp.n_expert));
        }
        const std::string each =
            lo == hi ? util::human_bytes(hi) : util::human_bytes(lo) + ".." + util::human_bytes(hi);
        const int n_device_experts = dev.unified ? 0 : dev.n_layer - dev.n_host_expert_layers;  // copied there
        row("  dense", p.shape.dense_bytes(),
            "attention, norms, embeddings, output, routers" +
                (p.shape.shared_expert_bytes > 0
                     ? ", shared experts (" + util::human_bytes(p.shape.shared_expert_bytes) + ", every token)"
                     : std::string()));
        row("  routed experts", p.shape.expert_bytes,
            std::to_string(hp.n_layer) + " layers x " + std::to_string(hp.n_expert) + " experts x " + each +
                " (gate, up, down)" +
                (p.n_expert_slots > 0 ? ": read from the file on demand (not in the total)"
                 : n_device_experts > 0
                     ? ": resident, those of " + std::to_string(n_device_experts) + " offloaded layers on " + dev.name
                     : ": resident"));
    }
    if (p.n_expert_slots > 0) {
        const model::Hparams& hp = p.shape.hp;
        char rate[32];
        std::snprintf(rate, sizeof rate, "%.0f%%", 100.0 * p.expert_miss_rate);
        row("expert cache", p.expert_cache,
            std::to_string(p.n_expert_slots) + " of " + std::to_string(hp.n_expert * hp.n_layer) +
                " experts, slots of " + util::human_bytes(p.shape.expert_slot_bytes) + "; expected " +
                util::human_bytes(p.expert_read_per_token) + " read per token (" + std::to_string(hp.n_expert_used) +
                " used x " + std::to_string(hp.n_layer) + " layers, miss rate " + rate +
                " assuming uniform routing: hit rate = slots / experts)");
    }
    if (q.n_streamed_layers > 0) {
        row("weights streamed", p.weights_streamed,
            std::to_string(q.n_streamed_layers) + " layers read from the file as needed (not in the total)");
        row("stream buffer", p.stream_buffer, "two of the largest streamed layers");
    }
    const std::string slots = p.draft_slots > 1 ? ", for each of " + std::to_string(p.draft_slots) + " slots" : "";
    row("KV cache", p.kv,
        kv_detail(p, false) + slots +
            (dev.unified && dev.kv > 0 ? "; and " + dev.name + "'s " + util::human_bytes(dev.kv) : ""));
    row("scratch", p.scratch,
        "activations " + util::human_bytes(p.activations) + " for " + std::to_string(q.n_batch) +
            " tokens, op scratch " + util::human_bytes(std::max(p.matmul_scratch, p.attention_scratch)) +
            (dev.unified && dev.scratch > 0 ? ", " + dev.name + "'s " + util::human_bytes(dev.scratch) : ""));
    row("outputs", p.logits,
        "logits: " + std::to_string(q.n_outputs) + " x " + std::to_string(p.shape.hp.n_vocab) + " floats" + slots);
    if (p.prompt_cache > 0) {
        row("prompt cache", p.prompt_cache,
            "kept prompts' K/V rows out of the KV cache (--cache-ram; and the token lists of --cache-disk's files)");
    }
    if (p.draft_slots > 0) {
        row("overhead", p.overhead,
            "metadata and tokenizer " + util::human_bytes(kMetadataFactor * p.shape.metadata_bytes) +
                " (the runtime and the samplers are the model's)");
    } else {
        row("overhead", p.overhead,
            "runtime " + util::human_bytes(kFixedOverhead) + ", metadata and tokenizer " +
                util::human_bytes(kMetadataFactor * p.shape.metadata_bytes) + ", samplers " +
                util::human_bytes(p.samplers));
    }
    if (p.device_host > 0) {
        row("device staging", p.device_host, "pinned buffer of " + p.device.name + "'s copies (fixed)");
    }
    row("total", p.total(), "");
    row("budget", q.budget, budget_source);
    out += std::string("  fits               ") + (p.total() <= q.budget ? "yes" : "no") + "\n";
    if (dev.unified) {
        const DevicePlan& d = dev;
        out += "\ndevice " + d.name +
               " (unified: shares the host's memory and budget; its share is in the host's above)\n";
        row("weights", d.weights,
            std::to_string(d.n_layer) + " of " + std::to_string(n_layer) + " layers" +
                (d.output ? " and the output layer" : "") + " (-ngl " + std::to_string(q.n_gpu_layers) +
                "): " + util::human_bytes(d.weights_in_place) + " read in place from the mapped file, no copy" +
                host_experts_text(d));
        row("KV cache", d.kv, q.kv_offload ? kv_detail(p, true) + ", in the host's" : "none (--no-kv-offload)");
        row("scratch", d.scratch,
            d.n_layer > 0 ? "activations and op scratch for " + std::to_string(q.n_batch) + " tokens, in the host's"
                          : "");
        row("total", d.total(), "in the host's total");
    } else if (!p.device.name.empty()) {
        const DevicePlan& d = p.device;
        out += "\ndevice " + d.name + "\n";
        row("weights", d.weights,
            std::to_string(d.n_layer) + " of " + std::to_string(n_layer) + " layers" +
                (d.output ? " and the output layer" : "") + " (-ngl " + std::to_string(q.n_gpu_layers) + ")" +
                host_experts_text(d));
        row("KV cache", d.kv, q.kv_offload ? kv_detail(p, true) : "none (--no-kv-offload)");
        row("scratch", d.scratch,
            d.n_layer > 0 ? "activations and op scratch for " + std::to_string(q.n_batch) + " tokens" : "");
        row("total", d.total(), "");
        row("budget", d.capacity, d.capacity == 0 ? "no limit (--vram)" : "--vram");
        out += std::string("  fits               ") + (d.fits() ? "yes" : "no") + "\n";
    }
    if (p.fitted) {
        if (p.fit_steps.empty()) out += "\n--fit: fits as asked; nothing changed\n";
        for (const FitStep& s : p.fit_steps) out += "\n--fit: " + s.change + "\n       why: " + s.reason + "\n";
    }
    return out;
}

// "-c 4096 -ctk q8_0 -ctv q8_0, 2 of 18 layers streamed"
std::string settings_text(const Plan& p) {
    const PlanParams& q = p.params;
    std::string s = "-c " + std::to_string(q.n_ctx) + " -ctk " + type_str(q.type_k) + " -ctv " + type_str(q.type_v) +
                    ", " + std::to_string(q.n_streamed_layers) + " of " + std::to_string(p.shape.hp.n_layer) +
                    " layers streamed";
    if (!p.device.name.empty()) s += ", -ngl " + std::to_string(q.n_gpu_layers) + " on " + p.device.name;
    if (p.n_expert_slots > 0) s += ", expert cache of " + std::to_string(p.n_expert_slots) + " slots";
    return s;
}

// The plan's rows charged to a device of the budget's capacity, in the order the run charges
// them (load: overhead, weights, stream buffers; the session: KV, logits; the first forward
// pass: scratch): the BudgetError of the first that does not fit, as the run would raise it.
std::string first_refusal(const Plan& p) {
    if (p.n_expert_slots > 0 && p.total() > p.params.budget)
        return "too small for an expert cache: " + expert_cache_shortfall(p);
    memory::Device host("host", p.params.budget);
    std::vector<memory::Charge> charges;
    try {
        namespace names = memory::pool_names;
        charges.push_back(host.pool(names::kOverhead).charge(p.overhead, "the runtime, metadata and tokenizer"));
        charges.push_back(host.pool(names::kWeights).charge(p.weights_resident, "the resident weights"));
        charges.push_back(host.pool(names::kStaging).charge(p.stream_buffer, "the streamed layers' buffer"));
        charges.push_back(host.pool(names::kExperts).charge(p.expert_cache, "the expert cache's slots"));
        charges.push_back(host.pool(names::kStaging).charge(p.device_host, "the offload device's host staging"));
        charges.push_back(host.pool(names::kKv).charge(p.kv, "the KV cache"));
        charges.push_back(host.pool(names::kLogits).charge(p.logits, "logits"));
        charges.push_back(host.pool(names::kPromptCache).charge(p.prompt_cache, "the prompt cache in host memory"));
        charges.push_back(host.pool(names::kScratch).charge(p.scratch, "activations and op scratch"));
    } catch (const memory::BudgetError& e) {
        return e.what();
    }
    if (!p.device.fits()) {
        memory::Device dev(p.device.name, p.device.capacity);
        std::vector<memory::Charge> on_device;  // (released before dev goes)
        try {
            namespace names = memory::pool_names;
            on_device.push_back(dev.pool(names::kWeights).charge(p.device.weights, "the offloaded layers' weights"));
            on_device.push_back(dev.pool(names::kKv).charge(p.device.kv, "the offloaded layers' KV cache"));
            on_device.push_back(dev.pool(names::kScratch).charge(p.device.scratch, "activations and op scratch"));
        } catch (const memory::BudgetError& e) {
            return e.what();
        }
    }
    return "the plan's total " + util::human_bytes(p.total()) + " is over the budget of " +
           util::human_bytes(p.params.budget);
}

}  // namespace fitllm::engine
