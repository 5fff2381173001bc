#include "server/model_registry.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "memory/budget.h"
#include "runtime/prefault.h"
#include "server/api_error.h"

namespace fitllm::server {
namespace {

std::string mib(uint64_t bytes) {
    return memory::format_size(bytes);
}

std::string describe_plan(const memory::Plan& p) {
    return mib(p.total()) + " (weights " + mib(p.weights()) + ", KV cache " + mib(p.kv) + ", scratch " +
           mib(p.scratch) + ", logits " + mib(p.logits) + ", overhead " + mib(p.overhead) + ")";
}

double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

LoadedModel::LoadedModel(std::string id, const std::filesystem::path& path, const SchedulerOptions& options,
                         memory::Device& device, Compute& compute, bool fit, const Offload& offload)
    : id_(std::move(id)), path_(path) {
    const auto start = std::chrono::steady_clock::now();
    file_ = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(path.string()));
    const memory::ModelShape shape = memory::model_shape(*file_);
    const int block = kv::CacheParams{}.block_size;
    const int extra_cells = options.n_slots * block;  // a partly used block per sequence
    memory::PlanParams params{.n_ctx = options.n_ctx + extra_cells,
                              .n_seq = options.n_slots,
                              .n_batch = std::max(options.n_batch, options.n_slots),
                              .n_outputs = options.n_slots,
                              .type_k = options.type_k,
                              .type_v = options.type_v,
                              .budget = device.capacity()};
    memory::Device* gpu = offload.device ? &offload.device->memory() : nullptr;
    if (gpu) {
        params.device = offload.device->name();
        params.n_gpu_layers = offload.n_gpu_layers;
        params.kv_offload = offload.kv_offload;
        params.unified = offload.device->unified();  // its share is in the host's plan
        // The room the other models leave (an unlimited device: no limit).
        params.vram = gpu->capacity() == UINT64_MAX || params.unified ? 0 : gpu->available();
    }
    plan_ = memory::make_plan(shape, params);
    SchedulerOptions so = options;
    if (fit && !plan_.fits()) {
        memory::Plan fitted = memory::fit_plan(shape, params);
        if (fitted.fits() && fitted.params.n_ctx > extra_cells) {
            plan_ = std::move(fitted);
            so.n_ctx = plan_.params.n_ctx - extra_cells;
            so.type_k = plan_.params.type_k;
            so.type_v = plan_.params.type_v;
            for (const memory::FitStep& step : plan_.fit_steps) {
                std::fprintf(stderr, "fitllm serve: model '%s' --fit: %s (%s)\n", id_.c_str(), step.change.c_str(),
                             step.reason.c_str());
            }
        }
    }
    if (plan_.total() > device.capacity()) {
        throw ApiError(507, "insufficient_memory", "model_too_large",
                       "model '" + id_ + "' needs " + describe_plan(plan_) + " with -c " +
                           std::to_string(options.n_ctx) + " and -np " + std::to_string(options.n_slots) +
                           ", but the memory budget is " + mib(device.capacity()));
    }
    auto busy = [&] {
        return ApiError(503, "insufficient_memory", "budget_busy",
                        "model '" + id_ + "' needs " + describe_plan(plan_) + "; the budget is " +
                            mib(device.capacity()) + " and " + mib(device.live()) +
                            " of it is held by models in use (" + device.breakdown() + ")");
    };
    if (plan_.total() > device.available()) throw busy();
    if (gpu && !plan_.device.fits()) {
        const memory::DevicePlan& d = plan_.device;
        const std::string needs = "model '" + id_ + "' needs " + mib(d.total()) + " on " + d.name + " for -ngl " +
                                  std::to_string(plan_.params.n_gpu_layers) + " (weights " + mib(d.weights) +
                                  ", KV cache " + mib(d.kv) + ", scratch " + mib(d.scratch) + ")";
        if (d.total() > gpu->capacity()) {
            throw ApiError(507, "insufficient_memory", "model_too_large",
                           needs + ", but the device's budget is " + mib(gpu->capacity()));
        }
        throw ApiError(503, "insufficient_memory", "budget_busy",
                       needs + "; " + mib(gpu->live()) + " of its " + mib(gpu->capacity()) +
                           " is held by models in use (" + gpu->breakdown() + ")");
    }
    // The plan's bytes for what has no pool of its own yet (weights mapped and read in, logits,
    // tokenizer); the KV cache and the model's working memory charge their pools themselves.
    try {
        const std::string what = "model '" + id_ + "'";
        // The stream buffers of streamed layers are charged by the model (staging).
        charges_.push_back(
            device.pool(memory::pool_names::kWeights).charge(plan_.weights_resident, what + " resident weights"));
        charges_.push_back(device.pool(memory::pool_names::kLogits).charge(plan_.logits, what + " logits"));
        charges_.push_back(
            device.pool(memory::pool_names::kOverhead).charge(plan_.overhead, what + " tokenizer and runtime"));
    } catch (const memory::BudgetError&) {
        throw busy();
    }
    tokenizer_ = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(*file_));
    template_ = std::make_unique<chat::ResolvedTemplate>(chat::template_for_model(*file_));
    const tokenizer::Vocab& vocab = tokenizer_->vocab();
    render_options_.add_generation_prompt = true;
    if (vocab.valid(vocab.special().bos)) render_options_.bos_token = vocab.text(vocab.special().bos);
    if (vocab.valid(vocab.special().eos)) render_options_.eos_token = vocab.text(vocab.special().eos);
    // The model charges its working memory (scratch) itself, as it grows: the scheduler's first
    // pass, a full batch, takes it to its largest.
    const int n_gpu_layers = gpu ? plan_.params.n_gpu_layers : 0;
    model_ = model::Model::load(*file_, {.device = &device,
                                         .n_streamed_layers = plan_.params.n_streamed_layers,
                                         .offload = n_gpu_layers > 0 ? offload.device : nullptr,
                                         .n_offload_layers = n_gpu_layers,
                                         .offload_kv = plan_.params.kv_offload});
    if (n_gpu_layers > 0) {
        std::fprintf(stderr, "fitllm serve: model '%s': %d of %d layers%s on %s (%s planned there)\n", id_.c_str(),
                     plan_.device.n_layer, plan_.shape.hp.n_layer, plan_.device.output ? " and the output" : "",
                     plan_.device.name.c_str(), mib(plan_.device.total()).c_str());
    }
    runtime::prefault(*file_, *model_);
    so.kv_pool = &device.pool(memory::pool_names::kKv);
    try {
        scheduler_ = std::make_unique<Scheduler>(*model_, *tokenizer_, so, compute);
    } catch (const memory::BudgetError&) {
        throw busy();
    }
    load_seconds_ = seconds_since(start);
}

LoadedModel::~LoadedModel() {
    scheduler_.reset();  // its thread first: it uses the model
}

uint64_t LoadedModel::used_bytes() const {
    const SchedulerStats st = scheduler_->stats();
    const uint64_t kv = scheduler_->kv_bytes();
    const uint64_t kv_used =
        st.kv_cells_total > 0 ? kv * static_cast<uint64_t>(st.kv_cells_used) / static_cast<uint64_t>(st.kv_cells_total)
                              : 0;
    return plan_.weights() + plan_.scratch + plan_.logits + plan_.overhead + kv_used;
}

ModelRegistry::ModelRegistry(RegistryOptions options)
    : options_(std::move(options)), device_("host", options_.budget), compute_(options_.n_threads) {
    if (!options_.offload.unified_device.empty()) {
        unified_device_ = backend::open_unified_device(options_.offload.unified_device, device_);
        options_.offload.device = unified_device_.get();
    }
    if (options_.model_path.empty() == options_.models_dir.empty()) {
        throw std::invalid_argument("give one of -m MODEL and --models-dir DIR");
    }
    if (!options_.models_dir.empty() && !std::filesystem::is_directory(options_.models_dir)) {
        throw std::invalid_argument("--models-dir: " + options_.models_dir.string() + " is not a directory");
    }
    if (!options_.model_path.empty() && !std::filesystem::is_regular_file(options_.model_path)) {
        throw std::invalid_argument("-m: " + options_.model_path.string() + " is not a file");
    }
    {
        std::lock_guard lock(mutex_);
        scan_locked();
    }
    // The offload device's host-side buffers (a CUDA device's pinned staging), charged to this
    // budget while the registry lives (the models' plans count them too).
    if (options_.offload.device != nullptr && options_.offload.n_gpu_layers != 0) {
        options_.offload.device->bind_host(device_);
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
    if (options_.offload.device != nullptr) options_.offload.device->unbind_host();  // device_ goes first
}

void ModelRegistry::scan_locked() const {
    if (!options_.model_path.empty()) {
        if (entries_.empty()) entries_[options_.model_path.stem().string()].path = options_.model_path;
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

std::shared_ptr<LoadedModel> ModelRegistry::acquire(const std::string& requested) {
    std::string id = requested;
    {
        std::lock_guard lock(mutex_);
        if (id.empty()) {
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
                                            "model_required");
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
                           "model '" + id + "' does not exist (GET /v1/models lists the models)");
        }
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
            throw ApiError(404, "invalid_request_error", "model_not_found", "model '" + id + "' does not exist");
        }
        if (it->second.loaded) return it->second.loaded;
        path = it->second.path;
    }
    while (true) {
        try {
            auto m = std::make_shared<LoadedModel>(id, path, options_.scheduler, device_, compute_, options_.fit,
                                                   options_.offload);
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
    std::lock_guard lock(mutex_);
    const auto it = entries_.find(id);
    if (it != entries_.end()) it->second.last_used = std::chrono::steady_clock::now();
}

std::vector<ModelInfo> ModelRegistry::models() const {
    std::lock_guard lock(mutex_);
    scan_locked();
    std::vector<ModelInfo> out;
    for (const auto& [id, e] : entries_) out.push_back({id, e.path, e.loaded != nullptr, e.loaded});
    return out;
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
    if (options_.ttl_seconds <= 0 || options_.models_dir.empty()) return;
    const auto period = std::chrono::milliseconds(std::clamp(static_cast<int>(options_.ttl_seconds * 250), 50, 1000));
    std::unique_lock lock(mutex_);
    while (!stopping_) {
        reaper_cv_.wait_for(lock, period);
        if (stopping_) break;
        for (auto& [id, e] : entries_) {
            if (!e.loaded || e.loaded.use_count() > 1 || !e.loaded->scheduler().idle()) continue;
            if (seconds_since(e.last_used) < options_.ttl_seconds) continue;
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
