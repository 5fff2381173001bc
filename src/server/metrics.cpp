#include "server/metrics.h"

#include <sstream>

namespace fitllm::server {
namespace {

// A label value with \, " and newlines escaped, as the text format wants.
std::string label(const std::string& v) {
    std::string out;
    for (const char c : v) {
        if (c == '\\' || c == '"') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out;
}

void header(std::ostringstream& o, const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

}  // namespace

void Metrics::count_request(const std::string& endpoint, int status) {
    std::lock_guard lock(mutex_);
    ++requests_[{endpoint, status}];
}

void Metrics::count_tokens(uint64_t n_prompt, uint64_t n_generated) {
    std::lock_guard lock(mutex_);
    prompt_tokens_ += n_prompt;
    generated_tokens_ += n_generated;
}

void Metrics::count_rejection(const std::string& reason) {
    std::lock_guard lock(mutex_);
    ++rejections_[reason];
}

std::string Metrics::prometheus_text(ModelRegistry& registry, const TransportStats& connections) const {
    std::ostringstream o;
    {
        std::lock_guard lock(mutex_);
        header(o, "fitllm_requests_total", "counter", "HTTP requests answered, by endpoint and status");
        for (const auto& [key, n] : requests_) {
            o << "fitllm_requests_total{endpoint=\"" << label(key.first) << "\",status=\"" << key.second << "\"} " << n
              << '\n';
        }
        header(o, "fitllm_rejected_requests_total", "counter", "requests refused: queue full, over budget, ...");
        for (const auto& [reason, n] : rejections_) {
            o << "fitllm_rejected_requests_total{reason=\"" << label(reason) << "\"} " << n << '\n';
        }
        header(o, "fitllm_prompt_tokens_total", "counter", "prompt tokens of finished completion requests");
        o << "fitllm_prompt_tokens_total " << prompt_tokens_ << '\n';
        header(o, "fitllm_generated_tokens_total", "counter", "tokens generated for finished completion requests");
        o << "fitllm_generated_tokens_total " << generated_tokens_ << '\n';
    }
    header(o, "fitllm_connections_open", "gauge", "HTTP connections open now");
    o << "fitllm_connections_open " << connections.open_connections << '\n';
    header(o, "fitllm_connections_total", "counter", "HTTP connections accepted");
    o << "fitllm_connections_total " << connections.accepted << '\n';
    header(o, "fitllm_connections_refused_total", "counter",
           "connections refused at the connection caps (every open one busy) or the memory budget");
    o << "fitllm_connections_refused_total " << connections.refused << '\n';
    header(o, "fitllm_connections_evicted_total", "counter",
           "connections closed at a cap to make room: the oldest still waiting for its request");
    o << "fitllm_connections_evicted_total " << connections.evicted << '\n';
    header(o, "fitllm_timeouts_total", "counter",
           "requests not in within --request-timeout and answers not taken within the write timeout");
    o << "fitllm_timeouts_total " << connections.timed_out << '\n';
    header(o, "fitllm_workers_busy", "gauge", "worker threads running a request");
    o << "fitllm_workers_busy " << connections.busy_workers << '\n';
    header(o, "fitllm_requests_waiting", "gauge", "requests read and waiting for a worker thread");
    o << "fitllm_requests_waiting " << connections.waiting_requests << '\n';

    const std::vector<ModelInfo> models = registry.models();
    int n_loaded = 0;
    for (const ModelInfo& m : models) n_loaded += m.loaded ? 1 : 0;
    header(o, "fitllm_models_loaded", "gauge", "models loaded now");
    o << "fitllm_models_loaded " << n_loaded << '\n';
    header(o, "fitllm_models_available", "gauge", "models the server offers");
    o << "fitllm_models_available " << models.size() << '\n';
    header(o, "fitllm_model_loads_total", "counter", "models loaded since the start");
    o << "fitllm_model_loads_total " << registry.n_loads() << '\n';
    header(o, "fitllm_model_unloads_total", "counter", "models unloaded (idle timeout or eviction)");
    o << "fitllm_model_unloads_total " << registry.n_unloads() << '\n';

    struct Row {
        std::string id;
        SchedulerStats st;
    };
    std::vector<Row> rows;
    for (const ModelInfo& m : models) {
        if (m.model) rows.push_back({m.id, m.model->scheduler().stats()});
    }
    auto gauge = [&](const char* name, const char* type, const char* help, auto value) {
        header(o, name, type, help);
        for (const Row& r : rows) o << name << "{model=\"" << label(r.id) << "\"} " << value(r.st) << '\n';
    };
    gauge("fitllm_tokens_per_second", "gauge", "tokens generated per second over the last 5 s",
          [](const SchedulerStats& s) { return s.tokens_per_second; });
    gauge("fitllm_kv_cells_used", "gauge", "KV cache cells in use",
          [](const SchedulerStats& s) { return s.kv_cells_used; });
    gauge("fitllm_kv_cells_free", "gauge", "KV cache cells free",
          [](const SchedulerStats& s) { return s.kv_cells_total - s.kv_cells_used; });
    gauge("fitllm_slots_busy", "gauge", "sequences being decoded or fed",
          [](const SchedulerStats& s) { return s.n_active; });
    gauge("fitllm_queue_length", "gauge", "requests waiting for a slot (new and preempted)",
          [](const SchedulerStats& s) { return s.n_queued; });
    gauge("fitllm_preemptions_total", "counter", "sequences whose KV cells were taken back under pressure",
          [](const SchedulerStats& s) { return s.n_preemptions; });
    gauge("fitllm_spec_drafted_total", "counter",
          "tokens drafted and checked by speculative decoding (--lookup or -md)",
          [](const SchedulerStats& s) { return s.n_drafted; });
    gauge("fitllm_spec_accepted_total", "counter", "drafted tokens the model accepted (each a token without a pass)",
          [](const SchedulerStats& s) { return s.n_draft_accepted; });
    gauge("fitllm_prompt_cache_prompts", "gauge", "finished prompts whose KV cells are kept for reuse",
          [](const SchedulerStats& s) { return s.n_cached_prompts; });
    gauge("fitllm_prompt_cache_tokens", "gauge", "tokens the kept prompts hold (shared prefixes counted per prompt)",
          [](const SchedulerStats& s) { return s.cached_prompt_tokens; });
    gauge("fitllm_prompt_cache_hits_total", "counter", "requests that started from a kept prompt's prefix",
          [](const SchedulerStats& s) { return s.n_cache_hits; });
    gauge("fitllm_prompt_tokens_cached_total", "counter", "prompt tokens taken from the prompt cache, not computed",
          [](const SchedulerStats& s) { return s.n_prompt_tokens_cached; });
    gauge("fitllm_prompt_cache_evictions_total", "counter", "kept prompts dropped because their cells were needed",
          [](const SchedulerStats& s) { return s.n_cache_evictions; });
    gauge("fitllm_prompt_cache_ram_prompts", "gauge", "kept prompts copied to host memory (--cache-ram)",
          [](const SchedulerStats& s) { return s.n_saved_prompts; });
    gauge("fitllm_prompt_cache_ram_bytes", "gauge", "host memory the kept prompts' K/V rows take (--cache-ram)",
          [](const SchedulerStats& s) { return s.saved_prompt_bytes; });
    gauge("fitllm_prompt_cache_restores_total", "counter", "hits copied back from host memory into KV cells",
          [](const SchedulerStats& s) { return s.n_cache_restores; });
    gauge("fitllm_prompt_cache_disk_prompts", "gauge", "kept prompts in files (--cache-disk)",
          [](const SchedulerStats& s) { return s.n_disk_prompts; });
    gauge("fitllm_prompt_cache_disk_bytes", "gauge", "bytes of the kept prompts' files (--cache-disk)",
          [](const SchedulerStats& s) { return s.disk_prompt_bytes; });
    gauge("fitllm_prompt_cache_disk_reads_total", "counter", "kept prompts read back from files into host memory",
          [](const SchedulerStats& s) { return s.n_disk_reads; });
    gauge("fitllm_prompt_cache_disk_failures_total", "counter",
          "kept prompts dropped because their file could not be written or read",
          [](const SchedulerStats& s) { return s.n_disk_failures; });
    gauge("fitllm_prompt_cache_disk_loaded_total", "counter",
          "kept prompts' files of an earlier run taken up at the start (--cache-dir)",
          [](const SchedulerStats& s) { return s.n_disk_loaded; });
    gauge("fitllm_prompt_cache_disk_skipped_total", "counter",
          "files in --cache-dir skipped at the start: of another model, KV layout or format version",
          [](const SchedulerStats& s) { return s.n_disk_foreign; });
    gauge("fitllm_prompt_cache_disk_corrupt_total", "counter",
          "files in --cache-dir skipped at the start: truncated or corrupt",
          [](const SchedulerStats& s) { return s.n_disk_bad; });
    gauge("fitllm_forward_steps_total", "counter", "forward passes run",
          [](const SchedulerStats& s) { return s.n_steps; });

    // The expert cache of each loaded mixture-of-experts model that has one (--expert-cache).
    std::vector<std::pair<std::string, model::ExpertCacheStats>> experts;
    for (const ModelInfo& m : models) {
        if (!m.model) continue;
        const model::ExpertCacheStats x = m.model->engine().model().expert_cache_stats();
        if (x.n_slots > 0) experts.emplace_back(m.id, x);
    }
    if (!experts.empty()) {
        const auto expert_metric = [&](const char* name, const char* type, const char* help, auto value) {
            header(o, name, type, help);
            for (const auto& [id, x] : experts) o << name << "{model=\"" << label(id) << "\"} " << value(x) << '\n';
        };
        expert_metric("fitllm_expert_cache_slots", "gauge", "slots of the expert cache",
                      [](const model::ExpertCacheStats& x) { return x.n_slots; });
        expert_metric("fitllm_expert_cache_hits_total", "counter", "expert lookups found in a slot",
                      [](const model::ExpertCacheStats& x) { return x.hits; });
        expert_metric("fitllm_expert_cache_misses_total", "counter", "expert lookups read from the file",
                      [](const model::ExpertCacheStats& x) { return x.misses; });
        expert_metric("fitllm_expert_cache_hit_rate", "gauge", "hits / lookups since the model loaded",
                      [](const model::ExpertCacheStats& x) { return x.hit_rate(); });
        expert_metric("fitllm_expert_cache_read_bytes_total", "counter", "bytes the expert cache read from the file",
                      [](const model::ExpertCacheStats& x) { return x.bytes_read; });
        expert_metric("fitllm_expert_cache_read_bytes_per_token", "gauge",
                      "bytes read per token through the experts since the model loaded",
                      [](const model::ExpertCacheStats& x) { return x.bytes_per_token(); });
    }

    memory::Device& dev = registry.device();
    header(o, "fitllm_memory_capacity_bytes", "gauge", "the memory budget of each device");
    o << "fitllm_memory_capacity_bytes{device=\"" << label(dev.name()) << "\"} " << dev.capacity() << '\n';
    header(o, "fitllm_memory_used_bytes", "gauge", "bytes charged to each device and pool");
    o << "fitllm_memory_used_bytes{device=\"" << label(dev.name()) << "\",pool=\"all\"} " << dev.live() << '\n';
    for (const memory::PoolStats& p : dev.pools()) {
        o << "fitllm_memory_used_bytes{device=\"" << label(dev.name()) << "\",pool=\"" << label(p.name) << "\"} "
          << p.live << '\n';
    }
    header(o, "fitllm_memory_peak_bytes", "gauge", "the most bytes charged at once");
    o << "fitllm_memory_peak_bytes{device=\"" << label(dev.name()) << "\",pool=\"all\"} " << dev.peak() << '\n';
    for (const memory::PoolStats& p : dev.pools()) {
        o << "fitllm_memory_peak_bytes{device=\"" << label(dev.name()) << "\",pool=\"" << label(p.name) << "\"} "
          << p.peak << '\n';
    }
    return o.str();
}

nlohmann::json memory_report(ModelRegistry& registry) {
    using nlohmann::json;
    memory::Device& dev = registry.device();
    json pools = json::array();
    for (const memory::PoolStats& p : dev.pools())
        pools.push_back({{"name", p.name}, {"used", p.live}, {"peak", p.peak}});
    json devices = json::array();
    devices.push_back({{"name", dev.name()},
                       {"capacity", dev.capacity()},
                       {"used", dev.live()},
                       {"peak", dev.peak()},
                       {"pools", pools}});
    if (backend::Backend* offload = registry.offload(); offload && offload->unified()) {
        // One memory: its charges are in the host's pools above.
        devices[0]["unified_devices"] = json::array({offload->name()});
    } else if (offload) {
        const memory::Device& gpu = offload->memory();
        json gpu_pools = json::array();
        for (const memory::PoolStats& p : gpu.pools())
            gpu_pools.push_back({{"name", p.name}, {"used", p.live}, {"peak", p.peak}});
        devices.push_back({{"name", gpu.name()},
                           {"capacity", gpu.capacity() == UINT64_MAX ? json(nullptr) : json(gpu.capacity())},
                           {"used", gpu.live()},
                           {"peak", gpu.peak()},
                           {"pools", gpu_pools}});
    }
    json models = json::array();
    for (const ModelInfo& m : registry.models()) {
        json entry = {{"id", m.id}, {"loaded", m.loaded}};
        if (m.model) {
            const engine::Plan& p = m.model->plan();
            const SchedulerStats st = m.model->scheduler().stats();
            entry["plan"] = {{"weights", p.weights()},
                             {"kv", p.kv},
                             {"scratch", p.scratch},
                             {"logits", p.logits},
                             {"prompt_cache", p.prompt_cache},
                             {"overhead", p.overhead},
                             {"total", p.total()}};
            if (!p.device.name.empty()) {
                entry["plan_devices"] = {{p.device.name,
                                          {{"n_layer", p.device.n_layer},
                                           {"unified", p.device.unified},
                                           {"output", p.device.output},
                                           {"weights", p.device.weights},
                                           {"kv", p.device.kv},
                                           {"scratch", p.device.scratch},
                                           {"total", p.device.total()}}}};
            }
            entry["used"] = m.model->used_bytes();
            entry["kv_cells_used"] = st.kv_cells_used;
            entry["kv_cells_total"] = st.kv_cells_total;
            entry["cached_prompts"] = st.n_cached_prompts;
            entry["cached_prompt_tokens"] = st.cached_prompt_tokens;
        }
        models.push_back(std::move(entry));
    }
    return {{"devices", devices}, {"models", models}};
}

}  // namespace fitllm::server
