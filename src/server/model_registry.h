#pragma once
// The models a server offers and the ones it has loaded, under one memory budget (a
// memory::Device). With a models directory, each *.gguf file is a model (id: the file name without
// .gguf), loaded on first use (JIT), unloaded after ttl idle seconds (or the idle time a request
// set for it: set_keep_alive), and evicted least recently used when another needs its room. Each
// model is loaded by engine::Engine::load on resources the models share (one budget, offload
// device and thread pool): planned for the context its scheduler runs (weights, KV cache, scratch,
// logits, overhead), charged as it loads; one that cannot fit even alone, or not while the others
// are busy, gets an ApiError with the numbers instead of an out-of-memory kill.
//
//   ModelRegistry reg({.models_dir = "models/", .ttl_seconds = 300, .load = {.mem = 2 << 30}});
//   std::shared_ptr<LoadedModel> m = reg.acquire("gemma-3-270m-q4_k_m");  // loads it if needed
//   m->scheduler().submit(...);
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "chat/chat_template.h"
#include "engine/engine.h"
#include "engine/resources.h"
#include "engine/scheduler.h"
#include "fitllm/config.h"
#include "memory/device.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::server {

// The engine's request types, as the server's handlers name them.
using engine::finish_reason_name;
using engine::FinishReason;
using engine::Job;
using engine::QueueFullError;
using engine::SchedulerStats;

// How every model is loaded and the context its scheduler runs (the serve command's flags).
struct RegistryOptions {
    std::filesystem::path model_path;  // -m: one model, loaded at start and never unloaded
    std::filesystem::path models_dir;  // --models-dir: every *.gguf in it, loaded on demand
    double ttl_seconds = 300;          // idle time before a models-dir model is unloaded; <= 0: never
    LoadConfig load;                   // model_path is set per model; mem, fit, mlock, offload for all
    ContextConfig context;             // each model's: n_seq slots sharing n_ctx tokens, n_batch, K/V
    engine::SchedulerOptions scheduler;
    std::string mem_label;  // "--mem 2G" when given, for messages
    // The -m model's id (--alias); "" takes the file name without .gguf. Only with model_path.
    std::string alias;
    // With model_path, a request naming another model gets 404 (--strict-model-names) instead of
    // the one model (clients send their own default name). --models-dir is always strict.
    bool strict_model_names = false;
    // -md: the draft model of speculative decoding, loaded with each model (engine::Engine::load,
    // its KV cache planned for every slot); scheduler.draft has its parameters. Empty: none.
    std::string draft_model_path;
};

// A model the registry has loaded: its engine and the scheduler that serves it.
class LoadedModel {
public:
    // Loads the model through engine::Engine::load on the registry's resources; throws ApiError
    // 507 when its plan cannot fit the budget even alone, 503 when it could but the room is held
    // by models in use (the registry evicts and retries), and 500 for what loading throws. With
    // --fit the engine changes the settings first; what it changed is printed on stderr.
    LoadedModel(std::string id, const std::filesystem::path& path, const RegistryOptions& options,
                std::shared_ptr<engine::Resources> resources);
    ~LoadedModel();

    const std::string& id() const { return id_; }
    const std::filesystem::path& path() const { return path_; }
    engine::Engine& engine() { return *engine_; }
    const tokenizer::Tokenizer& tokenizer() const { return engine_->tokenizer(); }
    const chat::ResolvedTemplate& chat_template() const { return engine_->chat_template(); }
    const chat::RenderOptions& render_options() const { return engine_->render_options(); }
    model::Model& model() { return engine_->model(); }
    engine::Scheduler& scheduler() { return *scheduler_; }
    const engine::Plan& plan() const { return engine_->plan(); }
    // Bytes in use now: the plan's weights, scratch, logits and overhead, and the KV cells in use.
    uint64_t used_bytes() const;
    double load_seconds() const { return load_seconds_; }

private:
    std::string id_;
    std::filesystem::path path_;
    std::unique_ptr<engine::Engine> engine_;
    std::unique_ptr<engine::Scheduler> scheduler_;
    double load_seconds_ = 0.0;
};

struct ModelInfo {
    std::string id;
    std::filesystem::path path;
    bool loaded = false;
    std::shared_ptr<LoadedModel> model;  // when loaded
    // When a loaded model is unloaded if it stays idle (its last use plus its keep-alive);
    // std::nullopt: never (the -m model, a --ttl of 0, a keep-alive < 0) or not loaded.
    std::optional<std::chrono::steady_clock::time_point> expires;
};

class ModelRegistry {
public:
    // Throws std::invalid_argument when neither or both of model_path and models_dir are set, or
    // the directory does not exist.
    explicit ModelRegistry(RegistryOptions options);
    ~ModelRegistry();

    // Loads the -m model (for the start-up; loading() is true from the registry's construction
    // until this is done, so health says 503 until then). Throws as acquire().
    void load_startup_model();
    bool loading() const { return loading_; }

    // The model of that id, loaded if needed. "" picks the only model there is (or the -m one);
    // so does any other name with -m unless strict_model_names.
    // Throws ApiError: 404 for an id that is not offered, 400 when "" is ambiguous, 507 when the
    // model cannot fit the budget even alone, 503 when it could but busy models hold the room.
    std::shared_ptr<LoadedModel> acquire(const std::string& id);
    // Marks the model used now (for the idle timer), e.g. when a request ends.
    void touch(const std::string& id);
    // The offered model a request for that id names, as acquire() resolves it, without loading
    // it. Throws ApiError as acquire() does for a name that is not offered or is ambiguous.
    ModelInfo find(const std::string& id) const;
    // How long a --models-dir model stays loaded once idle, set per model by a request (Ollama's
    // keep_alive): seconds (0: unloaded as soon as its requests end), < 0: never unloaded,
    // std::nullopt: back to --ttl. Throws ApiError 400 for the -m model (it is never unloaded)
    // unless the value is < 0.
    void set_keep_alive(const std::string& id, std::optional<double> seconds);

    // Cancels every request of every loaded model (for a server that stops: streams end at once).
    void shutdown();

    // Model management (Ollama's /api/copy, /api/create, /api/delete), with --models-dir only:
    // with -m each throws ApiError 400 saying so. A model is its file DIR/ID.gguf and, when a
    // create gave it settings (system prompt, parameters, license), DIR/ID.fitllm.json beside it.
    //
    // Why a name cannot name a model, or "" when it can. A new name (new_name) is NAME or
    // NAME:TAG of letters, digits, '_', '-' and '.', starting with a letter, digit or '_', at
    // most 128 bytes; a name looked up only must not hold '/', '\\' or NUL, nor start with '.'.
    static std::string name_problem(const std::string& id, bool new_name);
    // Makes (or replaces) the model `id`: `write` writes its file at `gguf` and, if it has
    // settings, them at `settings` (paths of new files in the directory, not yet models); then
    // they take the model's names. A model of that id that is loaded is unloaded first if idle.
    // Throws ApiError: 400 for a bad name, 409 when the model it replaces is busy; what `write`
    // throws (its files removed).
    void put_model(
        const std::string& id,
        const std::function<void(const std::filesystem::path& gguf, const std::filesystem::path& settings)>& write);
    // Removes the model's file and settings, unloading it first if it is loaded and idle.
    // Throws ApiError: 400 for a bad name, 404 for a model that is not offered, 409 when it is
    // busy (requests running or waiting), 500 when the file cannot be removed.
    void remove_model(const std::string& id);
    // Throws ApiError 400 unless this is a --models-dir server; `what` names the request.
    void require_models_dir(const std::string& what) const;
    // Where a model file's settings are: "DIR/ID.fitllm.json" for "DIR/ID.gguf".
    static std::filesystem::path settings_file(const std::filesystem::path& gguf);

    std::vector<ModelInfo> models() const;  // offered models, sorted by id (the directory rescanned)
    memory::Device& device() { return resources_->host(); }
    // The offload device every model's last layers run on, or nullptr.
    backend::Backend* offload() { return resources_->offload(); }
    engine::Compute& compute() { return resources_->compute(); }
    // "--mem 2G", or where the default budget comes from.
    const std::string& budget_source() const { return resources_->budget_source(); }
    const RegistryOptions& options() const { return options_; }
    uint64_t n_loads() const;
    uint64_t n_unloads() const;

private:
    struct Entry {
        std::filesystem::path path;
        std::shared_ptr<LoadedModel> loaded;
        std::chrono::steady_clock::time_point last_used;
        std::optional<double> keep_alive;  // seconds (< 0: forever); std::nullopt: --ttl
    };
    void scan_locked() const;
    std::string resolve_locked(const std::string& requested) const;  // the id, or ApiError
    // Seconds the model stays loaded once idle; < 0: never.
    double idle_limit_locked(const Entry& e) const;
    ModelInfo info_locked(const std::string& id, const Entry& e) const;
    bool evict_one_idle_locked(const std::string& except);
    // The loaded model of that entry, taken out of it to be unloaded; ApiError 409 when busy.
    std::shared_ptr<LoadedModel> take_idle_locked(const std::string& id, Entry& e, const std::string& what);
    void reaper();

    RegistryOptions options_;
    std::shared_ptr<engine::Resources> resources_;  // the budget, offload device and threads all models share
    mutable std::mutex mutex_;                      // the entries
    std::mutex load_mutex_;                         // one load at a time
    mutable std::map<std::string, Entry> entries_;
    std::atomic<bool> loading_{false};
    uint64_t n_loads_ = 0, n_unloads_ = 0;
    std::condition_variable reaper_cv_;
    bool stopping_ = false;
    std::thread reaper_;
};

}  // namespace fitllm::server
