#include "server/model_registry.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "memory/budget.h"
#include "server/api_error.h"

namespace fitllm::server {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

LoadedModel::LoadedModel(std::string id, const std::filesystem::path& path, const RegistryOptions& options,
                         std::shared_ptr<engine::Resources> resources)
    : id_(std::move(id)), path_(path) {
    const auto start = std::chrono::steady_clock::now();
    LoadConfig load = options.load;
    load.model_path = path.string();
    const std::string model = "model '" + id_ + "': ";
    try {
        engine_ =
            engine::Engine::load(load, options.context, resources, options.draft_model_path, options.context.n_seq);
    } catch (const DoesNotFitError& e) {
        throw ApiError(507, "insufficient_memory", "model_too_large",
                       "model '" + id_ + "' needs " + memory::format_size(e.needed()) + " on " + e.device() +
                           ", but the memory budget is " + memory::format_size(e.budget()) + ": " + e.what());
    } catch (const engine::BudgetBusyError& e) {
        throw ApiError(503, "insufficient_memory", "budget_busy", model + e.what());
    }
    const engine::Plan& plan = engine_->plan();
    for (const engine::FitStep& step : plan.fit_steps) {
        std::fprintf(stderr, "fitllm serve: model '%s' --fit: %s (%s)\n", id_.c_str(), step.change.c_str(),
                     step.reason.c_str());
    }
    if (plan.device.n_layer > 0) {
        std::fprintf(stderr, "fitllm serve: model '%s': %d of %d layers%s on %s (%s planned there)\n", id_.c_str(),
                     plan.device.n_layer, plan.shape.hp.n_layer, plan.device.output ? " and the output" : "",
                     plan.device.name.c_str(), memory::format_size(plan.device.total()).c_str());
    }
    try {
        engine::SchedulerOptions scheduler = options.scheduler;
        // --cache-dir's files of this model file outlive the server (engine/prompt_cache.h).
        if (engine_->context().prompt_cache_disk > 0) {
            scheduler.prompt_cache_model = engine::model_file_identity(engine_->file());
        }
        if (engine::Engine* draft = engine_->draft()) {
            scheduler.draft_model = &draft->model();
            scheduler.draft_context = draft->context();
        }
        scheduler_ = std::make_unique<engine::Scheduler>(engine_->model(), engine_->tokenizer(), engine_->context(),
                                                         scheduler, engine_->compute(), &engine_->host());
    } catch (const memory::BudgetError& e) {
        throw ApiError(503, "insufficient_memory", "budget_busy", model + e.what());
    }
    if (scheduler_->prompt_cache().persistent()) {
        const engine::SchedulerStats st = scheduler_->stats();
        std::fprintf(stderr,
                     "fitllm serve: model '%s': prompt cache: %llu prompts taken up from %s; %llu files of "
                     "another model or KV layout, %llu truncated or corrupt (skipped)\n",
                     id_.c_str(), static_cast<unsigned long long>(st.n_disk_loaded),
                     engine_->context().prompt_cache_dir.c_str(), static_cast<unsigned long long>(st.n_disk_foreign),
                     static_cast<unsigned long long>(st.n_disk_bad));
    }
    for (const std::string& note : scheduler_->prompt_cache().notes()) {
        std::fprintf(stderr, "fitllm serve: model '%s': prompt cache: %s\n", id_.c_str(), note.c_str());
    }
    load_seconds_ = seconds_since(start);
}

LoadedModel::~LoadedModel() {
    scheduler_.reset();  // its thread first: it uses the model
}

uint64_t LoadedModel::used_bytes() const {
    const engine::SchedulerStats st = scheduler_->stats();
    const uint64_t kv = scheduler_->kv_bytes();
    const uint64_t kv_used =
        st.kv_cells_total > 0 ? kv * static_cast<uint64_t>(st.kv_cells_used) / static_cast<uint64_t>(st.kv_cells_total)
                              : 0;
    const engine::Plan& p = engine_->plan();
    return p.weights() + p.scratch + p.logits + p.overhead + kv_used;
}

ModelRegistry::ModelRegistry(RegistryOptions options) : options_(std::move(options)) {
    if (options_.model_path.empty() == options_.models_dir.empty()) {
        throw std::invalid_argument("give one of -m MODEL and --models-dir DIR");
    }
    if (!options_.models_dir.empty() && !std::filesystem::is_directory(options_.models_dir)) {
        throw std::invalid_argument("--models-dir: " + options_.models_dir.string() + " is not a directory");
    }
    if (!options_.model_path.empty() && !std::filesystem::is_regular_file(options_.model_path)) {
        throw std::invalid_argument("-m: " + options_.model_path.string() + " is not a file");
    }
    if (!options_.alias.empty() && options_.model_path.empty()) {
        throw std::invalid_argument("--alias names the -m model; with --models-dir each file's name is its id");
    }
    // The -m model is loading from now until load_startup_model() is done: a health check that
    // comes between the listener's start and the load must not hear "ok".
    loading_ = !options_.model_path.empty();
    resources_ = engine::Resources::open(options_.load, options_.context.n_threads, options_.mem_label);
    {
        std::lock_guard lock(mutex_);
        scan_locked();
    }
    reaper_ = std::thread([this] { reaper(); });
}

ModelRegistry::~ModelRegistry() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    reaper_cv_.notify_all();
    reaper_.join();
    std::lock_guard lock(mutex_);
    entries_.clear();
}

void ModelRegistry::scan_locked() const {
    if (!options_.model_path.empty()) {
        if (entries_.empty()) {
            entries_[options_.alias.empty() ? options_.model_path.stem().string() : options_.alias].path =
                options_.model_path;
        }
        return;
    }
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(options_.models_dir, ec)) {
        if (e.path().extension() != ".gguf" || !e.is_regular_file()) continue;
        auto& entry = entries_[e.path().stem().string()];
        entry.path = e.path();
    }
    // Files that went away and are not loaded leave the list.
    for (auto it = entries_.begin(); it != entries_.end();) {
        if (!it->second.loaded && !std::filesystem::exists(it->second.path)) {
            it = entries_.erase(it);
        } else {
            ++it;
        }
    }
}

void ModelRegistry::load_startup_model() {
    loading_ = true;
    try {
        acquire("");
    } catch (...) {
        loading_ = false;
        throw;
    }
    loading_ = false;
}

bool ModelRegistry::evict_one_idle_locked(const std::string& except) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        const Entry& e = it->second;
        if (it->first == except || !e.loaded || e.loaded.use_count() > 1 || !e.loaded->scheduler().idle()) continue;
        if (!options_.model_path.empty()) continue;  // the -m model stays
        if (victim == entries_.end() || e.last_used < victim->second.last_used) victim = it;
    }
    if (victim == entries_.end()) return false;
    victim->second.loaded.reset();
    ++n_unloads_;
    return true;
}

std::string ModelRegistry::resolve_locked(const std::string& requested) const {
    std::string id = requested;
    if (!options_.model_path.empty() && !options_.strict_model_names) {
        id = entries_.begin()->first;  // the one model answers to any name
    } else if (id.empty()) {
        if (!options_.model_path.empty()) {
            id = entries_.begin()->first;
        } else {
            scan_locked();
            std::vector<std::string> loaded;
            for (const auto& [name, e] : entries_)
                if (e.loaded) loaded.push_back(name);
            if (entries_.size() == 1) {
                id = entries_.begin()->first;
            } else if (loaded.size() == 1) {
                id = loaded[0];
            } else {
                throw ApiError::invalid("model: required (this server offers " + std::to_string(entries_.size()) +
                                            " models; GET /v1/models lists them)",
                                        "model_required", "model");
            }
        }
    }
    auto it = entries_.find(id);
    if (it == entries_.end() && options_.model_path.empty()) {
        scan_locked();
        it = entries_.find(id);
    }
    if (it == entries_.end()) {
        throw ApiError(404, "invalid_request_error", "model_not_found",
                       "model '" + id + "' does not exist (GET /v1/models lists the models" +
                           (options_.model_path.empty() ? std::string(")")
                                                        : "; this server serves '" + entries_.begin()->first +
                                                              "' and answers to no other name: --strict-model-names)"),
                       "model");
    }
    return id;
}

std::shared_ptr<LoadedModel> ModelRegistry::acquire(const std::string& requested) {
    std::string id;
    {
        std::lock_guard lock(mutex_);
        id = resolve_locked(requested);
        const auto it = entries_.find(id);
        it->second.last_used = std::chrono::steady_clock::now();
        if (it->second.loaded) return it->second.loaded;
    }
    // Load it: one load at a time; another thread may have loaded it meanwhile.
    std::lock_guard load_lock(load_mutex_);
    std::filesystem::path path;
    {
        std::lock_guard lock(mutex_);
        auto it = entries_.find(id);
        if (it == entries_.end()) {
            throw ApiError(404, "invalid_request_error", "model_not_found", "model '" + id + "' does not exist",
                           "model");
        }
        if (it->second.loaded) return it->second.loaded;
        path = it->second.path;
    }
    while (true) {
        try {
            auto m = std::make_shared<LoadedModel>(id, path, options_, resources_);
            std::lock_guard lock(mutex_);
            Entry& e = entries_[id];
            e.loaded = m;
            e.last_used = std::chrono::steady_clock::now();
            ++n_loads_;
            return m;
        } catch (const ApiError& e) {
            if (e.code() != "budget_busy") throw;
            std::lock_guard lock(mutex_);
            if (!evict_one_idle_locked(id)) throw;
        } catch (const std::exception& e) {
            throw ApiError(500, "server_error", "model_load_failed", "model '" + id + "' failed to load: " + e.what());
        }
    }
}

void ModelRegistry::shutdown() {
    std::lock_guard lock(mutex_);
    for (auto& [id, e] : entries_) {
        if (e.loaded) e.loaded->scheduler().shutdown();
    }
}

void ModelRegistry::touch(const std::string& id) {
    {
        std::lock_guard lock(mutex_);
        const auto it = entries_.find(id);
        if (it != entries_.end()) it->second.last_used = std::chrono::steady_clock::now();
    }
    reaper_cv_.notify_all();  // a model kept alive 0 seconds goes now
}

ModelInfo ModelRegistry::info_locked(const std::string& id, const Entry& e) const {
    ModelInfo info{id, e.path, e.loaded != nullptr, e.loaded, std::nullopt};
    const double limit = idle_limit_locked(e);
    if (e.loaded && limit >= 0) {
        info.expires = e.last_used + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                         std::chrono::duration<double>(limit));
    }
    return info;
}

std::vector<ModelInfo> ModelRegistry::models() const {
    std::lock_guard lock(mutex_);
    scan_locked();
    std::vector<ModelInfo> out;
    for (const auto& [id, e] : entries_) out.push_back(info_locked(id, e));
    return out;
}

ModelInfo ModelRegistry::find(const std::string& requested) const {
    std::lock_guard lock(mutex_);
    const std::string id = resolve_locked(requested);
    return info_locked(id, entries_.at(id));
}

double ModelRegistry::idle_limit_locked(const Entry& e) const {
    if (options_.models_dir.empty()) return -1;  // the -m model stays
    if (e.keep_alive) return *e.keep_alive;
    return options_.ttl_seconds > 0 ? options_.ttl_seconds : -1;
}

void ModelRegistry::set_keep_alive(const std::string& id, std::optional<double> seconds) {
    {
        std::lock_guard lock(mutex_);
        const auto it = entries_.find(id);
        if (it == entries_.end()) return;
        if (options_.models_dir.empty()) {
            if (seconds && *seconds < 0) return;  // forever: what the -m model does anyway
            if (!seconds) return;                 // the server's default: forever for -m
            char value[32];
            std::snprintf(value, sizeof value, "%g", *seconds);
            throw ApiError::unsupported("keep_alive", std::string(value) +
                                                          " s is not supported with -m: the -m model stays loaded "
                                                          "while the server runs (--models-dir models are "
                                                          "unloaded); give a negative keep_alive or none");
        }
        it->second.keep_alive = seconds;
    }
    reaper_cv_.notify_all();
}

std::string ModelRegistry::name_problem(const std::string& id, bool new_name) {
    if (id.empty()) return "a name is required";
    if (id.find_first_of(std::string("/\\\0", 3)) != std::string::npos || id[0] == '.') {
        return "a model's name must not hold '/', '\\' or NUL, nor start with '.'";
    }
    if (!new_name) return "";
    const auto plain = [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
    };
    const size_t colon = id.find(':');
    const std::string name = id.substr(0, colon);
    const std::string tag = colon == std::string::npos ? std::string("x") : id.substr(colon + 1);
    const bool ok =
        id.size() <= 128 && !name.empty() && !tag.empty() && plain(name[0]) && plain(tag[0]) &&
        std::all_of(name.begin(), name.end(), [&](char ch) { return plain(ch) || ch == '-' || ch == '.'; }) &&
        std::all_of(tag.begin(), tag.end(), [&](char ch) { return plain(ch) || ch == '-' || ch == '.'; });
    if (ok) return "";
    return "a new model's name is NAME or NAME:TAG of letters, digits, '_', '-' and '.', each starting with a "
           "letter, digit or '_', at most 128 bytes";
}

std::filesystem::path ModelRegistry::settings_file(const std::filesystem::path& gguf) {
    std::filesystem::path p = gguf;
    p.replace_extension(".fitllm.json");
    return p;
}

void ModelRegistry::require_models_dir(const std::string& what) const {
    if (!options_.models_dir.empty()) return;
    throw ApiError(400, "invalid_request_error", "needs_models_dir",
                   what + ": this server serves the one model of -m ('" + entries_.begin()->first +
                       "'); adding, copying and deleting models needs `fitllm serve --models-dir DIR`");
}

std::shared_ptr<LoadedModel> ModelRegistry::take_idle_locked(const std::string& id, Entry& e, const std::string& what) {
    if (!e.loaded) return nullptr;
    if (e.loaded.use_count() > 1 || !e.loaded->scheduler().idle()) {
        throw ApiError(409, "invalid_request_error", "model_busy",
                       what + ": model '" + id +
                           "' is loaded and serving requests; try again when they are done (GET /api/ps lists "
                           "the loaded models)");
    }
    ++n_unloads_;
    return std::move(e.loaded);
}

void ModelRegistry::put_model(
    const std::string& id,
    const std::function<void(const std::filesystem::path& gguf, const std::filesystem::path& settings)>& write) {
    require_models_dir("model '" + id + "'");
    if (const std::string why = name_problem(id, true); !why.empty()) {
        throw ApiError::invalid("model: invalid name '" + id + "': " + why, "invalid_model_name", "model");
    }
    const std::filesystem::path file = options_.models_dir / (id + ".gguf");
    const std::filesystem::path settings = settings_file(file);
    // Not *.gguf, and hidden: no scan takes them for models while they are written.
    const std::filesystem::path tmp_file = options_.models_dir / ("." + id + ".gguf.partial");
    const std::filesystem::path tmp_settings = options_.models_dir / ("." + id + ".fitllm.json.partial");
    const auto drop_temporaries = [&] {
        std::error_code ec;
        std::filesystem::remove(tmp_file, ec);
        std::filesystem::remove(tmp_settings, ec);
    };
    std::lock_guard load_lock(load_mutex_);  // no load of it meanwhile, nor another change
    {
        std::lock_guard lock(mutex_);  // a busy model is refused before the work
        scan_locked();
        const auto it = entries_.find(id);
        if (it != entries_.end() && it->second.loaded &&
            (it->second.loaded.use_count() > 1 || !it->second.loaded->scheduler().idle())) {
            take_idle_locked(id, it->second, "model '" + id + "'");
        }
    }
    drop_temporaries();
    try {
        write(tmp_file, tmp_settings);
    } catch (...) {
        drop_temporaries();
        throw;
    }
    std::shared_ptr<LoadedModel> unloaded;
    {
        std::lock_guard lock(mutex_);
        scan_locked();
        const auto it = entries_.find(id);
        try {
            if (it != entries_.end()) unloaded = take_idle_locked(id, it->second, "model '" + id + "'");
            std::error_code ec;
            if (std::filesystem::exists(tmp_settings)) {
                std::filesystem::rename(tmp_settings, settings);
            } else {
                std::filesystem::remove(settings, ec);  // the old model's, if any
            }
            std::filesystem::rename(tmp_file, file);
        } catch (const std::filesystem::filesystem_error& e) {
            drop_temporaries();
            throw ApiError(500, "server_error", "model_write_failed", "model '" + id + "': " + e.what());
        } catch (...) {
            drop_temporaries();
            throw;
        }
        Entry& e = entries_[id];
        e.path = file;
        e.keep_alive.reset();
    }
    unloaded.reset();  // joins its scheduler thread: not under the lock
}

void ModelRegistry::remove_model(const std::string& requested) {
    require_models_dir("model '" + requested + "'");
    if (const std::string why = name_problem(requested, false); !why.empty()) {
        throw ApiError::invalid("model: invalid name '" + requested + "': " + why, "invalid_model_name", "model");
    }
    std::lock_guard load_lock(load_mutex_);
    std::shared_ptr<LoadedModel> unloaded;
    {
        std::lock_guard lock(mutex_);
        scan_locked();
        const auto it = entries_.find(requested);
        if (it == entries_.end()) {
            throw ApiError(404, "invalid_request_error", "model_not_found",
                           "model '" + requested + "' does not exist (GET /api/tags lists the models)", "model");
        }
        unloaded = take_idle_locked(requested, it->second, "model '" + requested + "'");
        std::error_code ec;
        std::filesystem::remove(it->second.path, ec);
        if (ec && std::filesystem::exists(it->second.path)) {
            it->second.loaded = std::move(unloaded);  // still offered, as it was
            if (it->second.loaded) --n_unloads_;
            throw ApiError(
                500, "server_error", "model_remove_failed",
                "model '" + requested + "': cannot remove " + it->second.path.string() + ": " + ec.message());
        }
        std::filesystem::remove(settings_file(it->second.path), ec);
        entries_.erase(it);
    }
    unloaded.reset();
}

uint64_t ModelRegistry::n_loads() const {
    std::lock_guard lock(mutex_);
    return n_loads_;
}

uint64_t ModelRegistry::n_unloads() const {
    std::lock_guard lock(mutex_);
    return n_unloads_;
}

void ModelRegistry::reaper() {
    if (options_.models_dir.empty()) return;  // the -m model stays
    std::unique_lock lock(mutex_);
    bool held = false;  // an expired model was in use at the last look
    while (!stopping_) {
        // Looks again at a quarter of the shortest idle limit (50 ms to 1 s), or when woken; after
        // 50 ms when an expired model was in use (a request, or a reader of /api/ps or /metrics
        // holding it for a moment: a client polling those must not keep it loaded).
        double shortest = -1;
        for (const auto& [id, e] : entries_) {
            const double limit = idle_limit_locked(e);
            if (e.loaded && limit >= 0 && (shortest < 0 || limit < shortest)) shortest = limit;
        }
        const int ms = shortest < 0 ? 1000 : std::clamp(static_cast<int>(shortest * 250), 50, 1000);
        reaper_cv_.wait_for(lock, std::chrono::milliseconds(held ? 50 : ms));
        if (stopping_) break;
        held = false;
        for (auto& [id, e] : entries_) {
            if (!e.loaded) continue;
            const double limit = idle_limit_locked(e);
            if (limit < 0 || seconds_since(e.last_used) < limit) continue;
            if (e.loaded.use_count() > 1 || !e.loaded->scheduler().idle()) {
                held = true;
                continue;
            }
            std::shared_ptr<LoadedModel> gone = std::move(e.loaded);
            ++n_unloads_;
            lock.unlock();
            gone.reset();  // joins its scheduler thread: not under the lock
            lock.lock();
            break;  // the map may have changed; look again next round
        }
    }
}

}  // namespace fitllm::server
