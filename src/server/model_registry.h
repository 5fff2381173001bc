#pragma once
// The models a server offers and the ones it has loaded, under one memory budget (a
// memory::Device). With a models directory, each *.gguf file is a model (id: the file name without
// .gguf), loaded on first use (JIT), unloaded after ttl idle seconds, and evicted least recently
// used when another needs its room. A model is admitted with the bytes of its plan
// (memory::make_plan: weights, KV cache for n_ctx cells and n_slots sequences, scratch, logits,
// overhead) charged to the device's pools; one that cannot fit even alone, or not while the
// others are busy, gets an ApiError with the numbers instead of an out-of-memory kill.
//
//   ModelRegistry reg({.models_dir = "models/", .budget = memory::parse_size("2G"), .ttl_seconds = 300});
//   std::shared_ptr<LoadedModel> m = reg.acquire("gemma-3-270m-q4_k_m");  // loads it if needed
//   m->scheduler().submit(...);
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "chat/chat_template.h"
#include "gguf/gguf_reader.h"
#include "memory/device.h"
#include "memory/plan.h"
#include "memory/pool.h"
#include "model/model.h"
#include "server/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::server {

// Layers on a device for every model (-ngl, --device, --no-kv-offload): the last n_gpu_layers
// of each model (-1: as many as the device has room for when the model loads).
struct Offload {
    backend::Backend* device = nullptr;  // outlives the registry; nullptr: host only
    // A unified device (shares the host's memory) to open on the registry's host budget
    // (backend::open_unified_device) instead of `device`: "virtual-unified", "cuda0".
    std::string unified_device;
    int n_gpu_layers = -1;
    bool kv_offload = true;
};

class LoadedModel {
public:
    // Opens, plans, charges and loads; throws ApiError (507 / 503) when the plan does not fit
    // `device` as it stands (the registry evicts and retries), and what loading throws. With fit,
    // a plan over the device's capacity is changed by memory::fit_plan (KV type, streamed layers,
    // context) before it is refused, and what it changed is printed on stderr.
    // With offload.device, the model's share there is planned against the device's room left and
    // refused (507 / 503) like the host's.
    LoadedModel(std::string id, const std::filesystem::path& path, const SchedulerOptions& options,
                memory::Device& device, Compute& compute, bool fit = false, const Offload& offload = {});
    ~LoadedModel();

    const std::string& id() const { return id_; }
    const std::filesystem::path& path() const { return path_; }
    const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
    const chat::ResolvedTemplate& chat_template() const { return *template_; }
    const chat::RenderOptions& render_options() const { return render_options_; }
    model::Model& model() { return *model_; }
    Scheduler& scheduler() { return *scheduler_; }
    const memory::Plan& plan() const { return plan_; }
    // Bytes in use now: the plan's weights, scratch, logits and overhead, and the KV cells in use.
    uint64_t used_bytes() const;
    double load_seconds() const { return load_seconds_; }

private:
    std::string id_;
    std::filesystem::path path_;
    memory::Plan plan_;
    std::vector<memory::Charge> charges_;
    std::unique_ptr<gguf::GgufFile> file_;
    std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
    std::unique_ptr<chat::ResolvedTemplate> template_;
    chat::RenderOptions render_options_;
    std::unique_ptr<model::Model> model_;
    std::unique_ptr<Scheduler> scheduler_;
    double load_seconds_ = 0.0;
};

struct RegistryOptions {
    std::filesystem::path model_path;  // -m: one model, loaded at start and never unloaded
    std::filesystem::path models_dir;  // --models-dir: every *.gguf in it, loaded on demand
    uint64_t budget = 0;               // bytes of the host device
    double ttl_seconds = 300;          // idle time before a models-dir model is unloaded; <= 0: never
    SchedulerOptions scheduler;
    int n_threads = 0;
    bool fit = false;  // --fit: LoadedModel's fit
    Offload offload;
};

struct ModelInfo {
    std::string id;
    std::filesystem::path path;
    bool loaded = false;
    std::shared_ptr<LoadedModel> model;  // when loaded
};

class ModelRegistry {
public:
    // Throws std::invalid_argument when neither or both of model_path and models_dir are set, or
    // the directory does not exist.
    explicit ModelRegistry(RegistryOptions options);
    ~ModelRegistry();

    // Loads the -m model (for the start-up; health says 503 until it is done). Throws as acquire().
    void load_startup_model();
    bool loading() const { return loading_; }

    // The model of that id, loaded if needed. "" picks the only model there is (or the -m one).
    // Throws ApiError: 404 for an id that is not offered, 400 when "" is ambiguous, 507 when the
    // model cannot fit the budget even alone, 503 when it could but busy models hold the room.
    std::shared_ptr<LoadedModel> acquire(const std::string& id);
    // Marks the model used now (for the idle timer), e.g. when a request ends.
    void touch(const std::string& id);

    // Cancels every request of every loaded model (for a server that stops: streams end at once).
    void shutdown();

    std::vector<ModelInfo> models() const;  // offered models, sorted by id (the directory rescanned)
    memory::Device& device() { return device_; }
    Compute& compute() { return compute_; }
    const RegistryOptions& options() const { return options_; }
    uint64_t n_loads() const;
    uint64_t n_unloads() const;

private:
    struct Entry {
        std::filesystem::path path;
        std::shared_ptr<LoadedModel> loaded;
        std::chrono::steady_clock::time_point last_used;
    };
    void scan_locked() const;
    bool evict_one_idle_locked(const std::string& except);
    void reaper();

    RegistryOptions options_;
    memory::Device device_;
    std::unique_ptr<backend::Backend> unified_device_;  // Offload::unified_device, charging device_
    Compute compute_;
    mutable std::mutex mutex_;  // the entries
    std::mutex load_mutex_;     // one load at a time
    mutable std::map<std::string, Entry> entries_;
    std::atomic<bool> loading_{false};
    uint64_t n_loads_ = 0, n_unloads_ = 0;
    std::condition_variable reaper_cv_;
    bool stopping_ = false;
    std::thread reaper_;
};

}  // namespace fitllm::server
