#pragma once
// The server's counters and the two reports built from them and the registry: GET /metrics
// (Prometheus text format) and GET /v1/memory (JSON: the budget per device and pool, the plan
// and live use per model).
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "server/http_transport.h"
#include "server/model_registry.h"

namespace fitllm::server {

class Metrics {
public:
    // One finished HTTP request on `endpoint` ("/v1/chat/completions") with that status.
    void count_request(const std::string& endpoint, int status);
    void count_tokens(uint64_t n_prompt, uint64_t n_generated);
    void count_rejection(const std::string& reason);  // "queue_full", "over_budget", ...

    // The Prometheus exposition text of everything: these counters, the connections and the
    // registry's state.
    std::string prometheus_text(ModelRegistry& registry, const TransportStats& connections) const;

private:
    mutable std::mutex mutex_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;
    std::map<std::string, uint64_t> rejections_;
    uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
};

// GET /v1/memory:
// {"devices":[{"name":"host","capacity":N,"used":N,"peak":N,"pools":[{"name":"weights","used":N,"peak":N},...]}],
//  "models":[{"id":"NAME","loaded":true,"plan":{"weights":N,"kv":N,"scratch":N,"logits":N,"overhead":N,"total":N},
//             "used":N, "kv_cells_used":N, "kv_cells_total":N, "cached_prompts":N,
//             "cached_prompt_tokens":N}]}   (bytes)
nlohmann::json memory_report(ModelRegistry& registry);

}  // namespace fitllm::server
