#pragma once
// What a front end asks of the engine: how to load a model (LoadConfig) and the context it runs
// in (ContextConfig). The CLI, the server, the C API and the Python bindings turn their flags,
// fields and arguments into these two and nothing else.
//
//   fitllm::LoadConfig load{.model_path = "model.gguf", .mem = fitllm::parse_size("2G"), .fit = true};
//   fitllm::ContextConfig context{.n_ctx = 8192, .type_k = fitllm::KvType::q8_0, .type_v = fitllm::KvType::q8_0};
//   fitllm::Engine engine = fitllm::Engine::load(load, context);  // fitllm/fitllm.h
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fitllm/export.h"

namespace fitllm {

// How K and V are stored in the KV cache (-ctk / -ctv).
enum class KvType { f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl };

// "q8_0" for KvType::q8_0.
FITLLM_API std::string_view kv_type_name(KvType type);
// The type of that name ("f16", "q4_0", ...); throws fitllm::Error listing the names it accepts.
FITLLM_API KvType parse_kv_type(std::string_view name);

// Bytes from "900M", "1.5G", "2GiB", "1073741824" (binary units, case-insensitive); throws
// fitllm::Error quoting the text for anything else.
FITLLM_API uint64_t parse_size(std::string_view text);

// Layers on a device other than the CPU (llama.cpp's -ngl).
struct OffloadConfig {
    // "cuda0" (cuda1, ...), "virtual" (runs the CPU's kernels on a memory of its own: every placement
    // testable without a GPU), "virtual-unified"; empty: the first CUDA device when n_gpu_layers > 0.
    std::string device;
    // The last n_gpu_layers layers run there; more than the model's layers: the output layer too.
    // kAllThatFit: as many as fit `vram`. kNotSet: none without a device, kAllThatFit with one.
    int n_gpu_layers = kNotSet;
    uint64_t vram = 0;       // the device's budget in bytes; 0: its free memory (virtual: no limit)
    bool kv_offload = true;  // the offloaded layers' KV cache on the device (false: in host memory)
    bool unified = false;    // the device shares the host's memory (integrated GPUs): one budget, `mem`
    // Tensors of offloaded layers kept in host memory (llama.cpp's --override-tensor / -ot): each
    // item "REGEX=DEVICE[,REGEX=DEVICE...]" as given to -ot (DEVICE: CPU or `device`); the first
    // rule whose REGEX is found in a tensor's name decides. An offloaded layer splits only at its
    // routed experts (ffn_{gate,up,down}_exps, with their router), which then run on the host.
    std::vector<std::string> override_tensors;
    // --cpu-moe (kAllLayers) / --n-cpu-moe N: the routed experts of every / the first N layers stay
    // on the host (as -ot rules); 0: none.
    int n_cpu_moe = 0;
    static constexpr int kAllLayers = -1;
    static constexpr int kNotSet = -2;
    static constexpr int kAllThatFit = -1;
};

// Which slot a full expert cache gives up (--expert-evict): the least recently used one, or the
// one whose expert was looked up least often lately (counts halved every 32 tokens' lookups;
// ties: least recently used).
enum class ExpertEvict { lru, lfu };

struct LoadConfig {
    std::string model_path;  // a GGUF file
    // The host memory budget in bytes; 0: what this process may use (its memory cgroup's limit, else
    // MemAvailable), less a safety margin. Everything the engine allocates is charged to it first.
    uint64_t mem = 0;
    // When the plan does not fit `mem`: quantize the KV cache, stream the last layers' weights from
    // the file and, only if fit_may_shorten_context, shorten the context, until it does.
    bool fit = false;
    bool fit_may_shorten_context = true;
    bool mlock = false;      // lock the resident weights in RAM (within mem and RLIMIT_MEMLOCK)
    int stream_layers = -1;  // stream the last N layers' weights from the file; -1: none (or what fit picks)
    // A mixture-of-experts model's expert cache (--expert-cache): the dense weights resident, the
    // routed experts read from the file into this many slots on demand. kExpertsNotSet: none, or
    // what fit picks; 0: none (off); kExpertsAuto: as many slots as the budget holds.
    int expert_slots = kExpertsNotSet;
    static constexpr int kExpertsNotSet = -2;
    static constexpr int kExpertsAuto = -1;
    bool expert_prefetch = true;  // with an expert cache, read ahead the next layer's likely experts
    ExpertEvict expert_evict = ExpertEvict::lfu;
    OffloadConfig offload;
    // Called while the resident weights are read in: bytes done and total.
    std::function<void(uint64_t done, uint64_t total)> on_load_progress;
};

struct ContextConfig {
    int n_ctx = 2048;   // tokens the KV cache holds, all sequences together; 0: the model's training context
    int n_seq = 1;      // sequences decoding together (-np)
    int n_batch = 512;  // tokens per forward pass
    int n_outputs = 0;  // rows of logits one forward pass returns; 0: one per sequence
    KvType type_k = KvType::f16;
    KvType type_v = KvType::f16;
    bool kv_rotation = true;     // Hadamard-rotate (and shape) quantized K/V heads
    std::string kv_spill_dir;    // a directory where K/V that does not fit kv_resident spills
    uint64_t kv_resident = 0;    // with kv_spill_dir: the K/V bytes that may stay in memory; 0: all
    bool context_shift = false;  // a full context drops its oldest tokens (after n_keep) and goes on
    int n_keep = 0;
    int n_threads = 0;  // 0: the physical cores
    // Prompts kept in the KV cache after their request ends (serve's --cache-prompts): a later
    // request with the same prefix starts after it instead of computing it again. Each takes a
    // sequence id of the cache (n_seq + n_cached_prompts <= 64) and its cells until evicted, least
    // recently used first, when a request needs them; the sliding-window pools grow by a window each.
    int n_cached_prompts = 0;
    // Host memory for kept prompts the KV cache evicts (serve's --cache-ram): their K/V rows are
    // copied here, charged to the budget (the plan counts all of it), and copied back into cells
    // when a later request shares a longer prefix with one of them than with anything in the KV
    // cache. Least recently used go first. 0: none. Needs n_cached_prompts > 0.
    uint64_t prompt_cache_ram = 0;
    // Disk below host memory (serve's --cache-disk, --cache-dir): kept prompts that host memory
    // gives up are written to files in a directory of their own made under prompt_cache_dir (the
    // system's temporary directory when empty), at most prompt_cache_disk bytes of them, least
    // recently used deleted first, and read back through host memory when a later request's
    // longest prefix is one of them. Their token lists stay in memory: at most
    // prompt_cache_disk / kPromptCacheDiskIndexShare bytes of them (the oldest files go first), part
    // of the "prompt_cache" pool. The files go when the scheduler does, unless it has the model
    // file's identity (engine::SchedulerOptions::prompt_cache_model, which serve gives) and
    // prompt_cache_dir is set: then they are in prompt_cache_dir itself and a later scheduler of
    // the same model file and KV layout takes them up (engine/prompt_cache.h). 0: none. Needs
    // prompt_cache_ram.
    uint64_t prompt_cache_disk = 0;
    static constexpr uint64_t kPromptCacheDiskIndexShare = 64;
    std::string prompt_cache_dir;
};

}  // namespace fitllm
