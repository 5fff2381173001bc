#pragma once
// What engines loaded under one budget share: the host's memory (the budget every allocation is
// charged to), the offload device, and the CPU threads. `fitllm run` opens one for its one engine;
// `fitllm serve` one for all the models it loads.
//
//   auto resources = engine::Resources::open(load, context.n_threads, "--mem 2G");
//   auto a = engine::Engine::load(load_a, context, resources);  // both charge resources->host()
//   auto b = engine::Engine::load(load_b, context, resources);
#include <memory>
#include <mutex>
#include <string>

#include "backend/backend.h"
#include "fitllm/config.h"
#include "memory/device.h"
#include "ops/thread_pool.h"

namespace fitllm::engine {

// The CPU threads: one forward pass at a time (the server's models take turns).
struct Compute {
    explicit Compute(int n_threads) : pool(n_threads) {}
    ops::ThreadPool pool;
    std::mutex mutex;
};

// An OffloadConfig resolved against the machine: the device the plan names, the layers asked for
// (-1: as many as fit its budget), and that budget.
struct OffloadTarget {
    std::string device;  // "" (none), "virtual", "cuda0", "virtual-unified", ...
    int n_gpu_layers = 0;
    bool kv_offload = true;
    bool unified = false;  // one budget: the host's
    uint64_t vram = 0;     // the device's budget for the plan; 0: no limit known
};

// Resolves `offload`: the device named, or the first CUDA device when n_gpu_layers asks for one and
// none is named. open == true opens it (a unified one on `host`, which must then be given) and
// returns it; false opens nothing when it need not (a plan for a device that may be on another
// machine: with a vram given, or unified), only to read a CUDA device's free memory otherwise.
// Throws ConfigError for layers without a device to offload to, a vram without a device, a unified
// device with a vram, or a device that cannot be opened (why).
std::unique_ptr<backend::Backend> resolve_offload(const OffloadConfig& offload, OffloadTarget& target,
                                                  memory::Device* host, bool open);

class Resources {
public:
    // The host budget of load.mem bytes (budget_source: how the caller names it, e.g. "--mem 2G"),
    // or, with mem 0, what this process may use (memory::host_budget(), its source in the text);
    // the offload device of load.offload, bound to the host for its host-side buffers when layers
    // go there; n_threads CPU threads (0: the physical cores). Throws ConfigError as
    // resolve_offload, and fitllm::Error when no budget can be read.
    static std::shared_ptr<Resources> open(const LoadConfig& load, int n_threads, std::string budget_source = {});
    ~Resources();
    Resources(const Resources&) = delete;
    Resources& operator=(const Resources&) = delete;

    memory::Device& host() { return *host_; }
    const memory::Device& host() const { return *host_; }
    // "--mem 2G", "MemAvailable (/proc/meminfo) 12.0 GiB less margin 614 MiB"
    const std::string& budget_source() const { return budget_source_; }
    backend::Backend* offload() { return offload_.get(); }
    const OffloadTarget& offload_target() const { return target_; }
    Compute& compute() { return *compute_; }

private:
    Resources() = default;

    std::string budget_source_;
    OffloadTarget target_;
    // Declared in the order they go: the offload device before the host it charges (a unified one
    // charges its pools, Backend::bind_host its host staging).
    std::unique_ptr<memory::Device> host_;
    std::unique_ptr<backend::Backend> offload_;
    std::unique_ptr<Compute> compute_;
};

// The budget of load.mem (budget_source as given) or of memory::host_budget(): bytes and its source.
struct ResolvedBudget {
    uint64_t bytes = 0;
    std::string source;
};
ResolvedBudget resolve_budget(uint64_t mem, std::string budget_source);

}  // namespace fitllm::engine
