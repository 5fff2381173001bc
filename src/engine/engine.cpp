#include "engine/engine.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/drafter.h"
#include "engine/plan_report.h"
#include "engine/prefault.h"
#include "io/mapped_file.h"
#include "model/expert_cache.h"
#include "model/tensor_override.h"
#include "util/text.h"

namespace fitllm::engine {
namespace {

// [begin, end) file byte ranges of the resident weights (global tensors and the layers before
// the streamed ones), merged where they touch the same page.
std::vector<std::pair<uint64_t, uint64_t>> resident_ranges(const gguf::GgufFile& file, int n_layer, int n_streamed,
                                                           bool cached_experts) {
    const uint64_t page = io::MappedFile::page_size();
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const gguf::TensorInfo& t : file.tensors()) {
        const int il = tensor_layer(t.name);
        if (il >= n_layer - n_streamed || t.n_bytes == 0) continue;
        if (cached_experts && model::is_expert_tensor(t.name)) continue;  // read into the expert cache
        const uint64_t begin = file.data_offset() + t.offset;
        ranges.emplace_back(begin / page * page, std::min<uint64_t>(file.size(), begin + t.n_bytes));
    }
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint64_t, uint64_t>> merged;
    for (const auto& r : ranges) {
        if (!merged.empty() && r.first <= (merged.back().second + page - 1) / page * page) {
            merged.back().second = std::max(merged.back().second, r.second);
        } else {
            merged.push_back(r);
        }
    }
    return merged;
}

// Bytes this process has locked (VmLck), or 0 when /proc does not tell.
uint64_t process_locked_bytes() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    }
    return 0;
}

// Locks the resident weights' pages (all or nothing): their page rounding is charged to the
// weights pool first, and RLIMIT_MEMLOCK checked (even for root). Returns the bytes locked.
uint64_t lock_resident_weights(gguf::GgufFile& file, const Plan& plan, memory::Device& host, memory::Charge& rounding) {
    const int n_layer = plan.shape.hp.n_layer;
    const int n_streamed = plan.params.n_streamed_layers;
    const std::string resident =
        std::to_string(n_layer - n_streamed) + " of " + std::to_string(n_layer) + " layers, embeddings and output";
    io::MappedFile* mapping = file.mapping();
    if (mapping == nullptr || !mapping->is_file_mapping()) {
        throw io::IoError("--mlock: " + file.source() + " is not a mapped file; nothing to lock");
    }
    const auto ranges = resident_ranges(file, n_layer, n_streamed, plan.n_expert_slots > 0);
    const uint64_t page = io::MappedFile::page_size();
    uint64_t pages = 0;
    for (const auto& [b, e] : ranges) pages += (e + page - 1) / page * page - b;
    // The pages locked beyond the weights' own bytes (page rounding) are charged too: the lock
    // stays within the budget.
    if (pages > plan.weights_resident) {
        rounding = host.pool(memory::pool_names::kWeights)
                       .charge(pages - plan.weights_resident, "page rounding of the locked weights");
    }
    rlimit limit{};
    if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
        const uint64_t already = process_locked_bytes();
        if (already + pages > limit.rlim_cur) {
            throw io::IoError(
                "--mlock: locking the resident weights (" + resident + ") needs " + util::human_bytes(pages) + " (" +
                std::to_string(pages) + " bytes) + " + std::to_string(already) +
                " bytes already locked, over the RLIMIT_MEMLOCK soft limit of " + util::human_bytes(limit.rlim_cur) +
                " (" + std::to_string(limit.rlim_cur) + " bytes; see ulimit -l); nothing locked");
        }
    }
    size_t done = 0;
    try {
        for (; done < ranges.size(); ++done)
            mapping->lock(ranges[done].first, ranges[done].second - ranges[done].first);
    } catch (...) {
        for (size_t i = 0; i < done; ++i) mapping->unlock(ranges[i].first, ranges[i].second - ranges[i].first);
        throw;
    }
    return pages;
}

std::string pools_text(const memory::Device& d) {
    std::string s;
    for (const memory::PoolStats& p : d.pools())
        s += (s.empty() ? " " : ", ") + p.name + " " + util::human_bytes(p.peak);
    return s;
}

}  // namespace

PlanParams plan_params(const LoadConfig& load, const ContextConfig& context, uint64_t budget, int n_threads,
                       const OffloadTarget& offload) {
    check(context);
    if (load.stream_layers < -1) {
        throw ConfigError("streamed layers (--stream-layers) " + std::to_string(load.stream_layers) + " is negative");
    }
    PlanParams p;
    p.n_ctx = context.n_ctx;
    p.n_seq = context.n_seq;
    p.n_cached_prompts = context.n_cached_prompts;
    p.prompt_cache_ram = context.prompt_cache_ram;
    p.prompt_cache_disk = context.prompt_cache_disk;
    p.context_shift = context.context_shift;
    p.n_batch = std::max(context.n_batch, context.n_seq);
    p.n_outputs = context.n_outputs;
    p.type_k = ggml_type(context.type_k);
    p.type_v = ggml_type(context.type_v);
    p.kv_rotation = context.kv_rotation;
    p.kv_resident_limit = context.kv_spill_dir.empty() ? 0 : context.kv_resident;
    p.n_threads = n_threads;
    p.budget = budget;
    p.n_streamed_layers = std::max(load.stream_layers, 0);
    p.expert_slots = load.expert_slots;  // (the same values: not set, off, auto, N)
    p.device = offload.device;
    p.n_gpu_layers = offload.device.empty() ? 0 : offload.n_gpu_layers;
    p.vram = offload.vram;
    p.kv_offload = offload.kv_offload;
    p.unified = offload.unified;
    try {  // placement by tensor class (model/tensor_override.h): -ot rules first, then --cpu-moe's
        for (const std::string& list : load.offload.override_tensors) {
            for (model::TensorOverride& o : model::parse_tensor_overrides(list, "-ot"))
                p.tensor_overrides.push_back(std::move(o));
        }
        if (load.offload.n_cpu_moe < OffloadConfig::kAllLayers) {
            throw std::invalid_argument("--n-cpu-moe " + std::to_string(load.offload.n_cpu_moe) + " is negative");
        }
        if (load.offload.n_cpu_moe != 0) {
            for (model::TensorOverride& o : model::cpu_moe_overrides(load.offload.n_cpu_moe))
                p.tensor_overrides.push_back(std::move(o));
        }
    } catch (const std::invalid_argument& e) {
        throw ConfigError(e.what());
    }
    return p;
}

LoadConfig draft_load_config(const LoadConfig& load, const std::string& draft_model_path) {
    LoadConfig d;
    d.model_path = draft_model_path;
    d.mem = load.mem;
    d.mlock = load.mlock;
    d.on_load_progress = load.on_load_progress;
    return d;
}

Plan draft_plan(const ModelShape& shape, const PlanParams& params, int draft_slots) {
    if (draft_slots < 1) throw std::invalid_argument("draft slots " + std::to_string(draft_slots) + " (>= 1)");
    Plan p = make_plan(shape, params);
    const auto n = static_cast<uint64_t>(draft_slots);
    p.kv *= n;
    p.kv_spilled *= n;
    p.logits *= n;
    p.overhead -= std::min(p.overhead, kFixedOverhead + p.samplers);
    p.samplers = 0;
    p.draft_slots = draft_slots;
    return p;
}

namespace {

// The draft model's plan: as asked (no --fit), on the CPU.
Plan plan_draft(const LoadConfig& draft, const ContextConfig& context, uint64_t budget, int n_threads,
                int draft_slots) {
    const PlanParams params = plan_params(draft, context, budget, n_threads, OffloadTarget{});
    const gguf::GgufFile file = gguf::GgufFile::open(draft.model_path);
    try {
        return draft_plan(model_shape(file), params, draft_slots);
    } catch (const std::invalid_argument& e) {
        throw ConfigError("draft model " + draft.model_path + ": " + e.what());
    }
}

// The context with n_ctx 0 resolved to the model's training context (as make_plan resolves it).
ContextConfig resolved_context(const LoadConfig& load, const ContextConfig& context) {
    ContextConfig c = context;
    if (c.n_ctx == 0) c.n_ctx = model_shape(gguf::GgufFile::open(load.model_path)).hp.n_ctx_train;
    return c;
}

// " (its KV cache 12 MiB for 4 slots)", or nothing for one slot.
std::string draft_slots_text(const Plan& draft) {
    return draft.draft_slots > 1 ? " (its KV cache " + util::human_bytes(draft.kv) + " for " +
                                       std::to_string(draft.draft_slots) + " slots)"
                                 : "";
}

std::string for_draft(const Plan& draft) {
    return util::human_bytes(draft.total()) + " for the draft model " + draft.shape.source + draft_slots_text(draft);
}

}  // namespace

PlanOnly plan_only(const LoadConfig& load, const ContextConfig& context, std::string budget_source,
                   const std::string& draft_model_path, int draft_slots) {
    const ResolvedBudget budget = resolve_budget(load.mem, std::move(budget_source));
    OffloadTarget target;
    resolve_offload(load.offload, target, /*host=*/nullptr, /*open=*/false);
    const int n_threads = context.n_threads > 0 ? context.n_threads : ops::physical_core_count();
    std::optional<Plan> draft;
    ContextConfig c = context;
    uint64_t left = budget.bytes;
    std::string source = budget.source;
    if (!draft_model_path.empty()) {
        check(context);
        c = resolved_context(load, context);
        draft = plan_draft(draft_load_config(load, draft_model_path), draft_context(c), budget.bytes, n_threads,
                           draft_slots);
        left = budget.bytes - std::min(budget.bytes, draft->total());
        source += ", less " + for_draft(*draft);
    }
    const PlanParams params = plan_params(load, c, left, n_threads, target);
    const gguf::GgufFile file = gguf::GgufFile::open(load.model_path);
    const ModelShape shape = model_shape(file);
    try {
        return {load.fit ? fit_plan(shape, params) : make_plan(shape, params), source, std::move(draft), budget.source};
    } catch (const std::invalid_argument& e) {
        throw ConfigError(e.what());
    }
}

std::unique_ptr<Engine> Engine::load(const LoadConfig& load, const ContextConfig& context,
                                     std::shared_ptr<Resources> resources, const std::string& draft_model_path,
                                     int draft_slots) {
    if (draft_model_path.empty()) return load_one(load, context, std::move(resources), 0, {}, 0);
    check(context);
    if (!resources) resources = Resources::open(load, context.n_threads);
    const ContextConfig c = resolved_context(load, context);
    const LoadConfig draft_load = draft_load_config(load, draft_model_path);
    const ContextConfig draft_ctx = draft_context(c);
    const uint64_t capacity = resources->host().capacity();
    const Plan draft =
        plan_draft(draft_load, draft_ctx, capacity, static_cast<int>(resources->compute().pool.size()), draft_slots);
    if (!draft.fits()) {
        throw DoesNotFitError("the draft model " + draft_model_path + draft_slots_text(draft) +
                                  " alone does not fit the memory budget: " + first_refusal(draft),
                              "host", draft.total(), capacity, engine::plan_text(draft, resources->budget_source()));
    }
    std::unique_ptr<Engine> e = load_one(load, c, resources, draft.total(), for_draft(draft), 0);
    e->draft_ = load_one(draft_load, draft_ctx, resources, 0, {}, draft_slots);
    check_same_vocab(e->tokenizer().vocab(), load.model_path, e->draft_->tokenizer().vocab(), draft_model_path);
    return e;
}

std::unique_ptr<Engine> Engine::load_one(const LoadConfig& load, const ContextConfig& context,
                                         std::shared_ptr<Resources> resources, uint64_t reserved,
                                         const std::string& reserved_for, int draft_slots) {
    check(context);
    const bool offload_allowed = draft_slots == 0;
    if (!resources) resources = Resources::open(load, context.n_threads);
    std::unique_ptr<Engine> e(new Engine);
    e->load_ = load;
    e->resources_ = std::move(resources);
    Resources& r = *e->resources_;
    memory::Device& host = r.host();
    backend::Backend* offload = offload_allowed ? r.offload() : nullptr;
    memory::Device* gpu = offload && !offload->unified() ? &offload->memory() : nullptr;
    e->budget_source_ = r.budget_source() + (reserved > 0 ? ", less " + reserved_for : "");

    e->file_ = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(load.model_path));
    const ModelShape shape = model_shape(*e->file_);
    OffloadTarget target = offload_allowed ? r.offload_target() : OffloadTarget{};
    // The device's room: what the engines sharing it left (an unlimited device: no limit).
    if (gpu) target.vram = gpu->capacity() == UINT64_MAX ? 0 : gpu->available();
    const PlanParams params = plan_params(load, context, host.capacity() - std::min(reserved, host.capacity()),
                                          r.compute().pool.size(), target);
    try {
        e->plan_ = draft_slots > 0 ? draft_plan(shape, params, draft_slots)
                   : load.fit      ? fit_plan(shape, params)
                                   : make_plan(shape, params);
    } catch (const std::invalid_argument& err) {
        throw ConfigError(err.what());
    }
    const Plan& plan = e->plan_;
    const std::string& source = e->budget_source_;
    if (load.fit && plan.fits() && !load.fit_may_shorten_context && plan.params.n_ctx != params.n_ctx) {
        throw DoesNotFitError("--fit: the budget " + util::human_bytes(params.budget) + " (" + source +
                                  ") would need the context shortened from " + std::to_string(params.n_ctx) + " to " +
                                  std::to_string(plan.params.n_ctx) +
                                  " tokens, which this command does not allow: use a shorter context or raise --mem",
                              "host", plan.total(), params.budget, "");
    }
    const DevicePlan& d = plan.device;
    if (gpu && !d.fits() && d.total() <= gpu->capacity()) {
        throw BudgetBusyError("the plan needs " + util::human_bytes(d.total()) + " on " + d.name + " for -ngl " +
                              std::to_string(plan.params.n_gpu_layers) + " (weights " + util::human_bytes(d.weights) +
                              ", KV cache " + util::human_bytes(d.kv) + ", scratch " + util::human_bytes(d.scratch) +
                              "); " + util::human_bytes(gpu->live()) + " of its " + util::human_bytes(gpu->capacity()) +
                              " is held (" + gpu->breakdown() + ")");
    }
    if (!plan.fits()) {
        const bool host_over = plan.total() > params.budget;
        throw DoesNotFitError("the plan does not fit the memory budget" +
                                  (reserved > 0 ? " less " + reserved_for : std::string()) + ": " + first_refusal(plan),
                              host_over ? "host" : d.name, host_over ? plan.total() : d.total(),
                              host_over ? params.budget : d.capacity, engine::plan_text(plan, source));
    }
    // The device's host-side buffers (a CUDA device's pinned staging, Plan::device_host) are charged
    // once, by the first engine that offloads layers to it.
    const bool offloads = offload && plan.params.n_gpu_layers > 0;
    const uint64_t needed = plan.total() - (offloads && offload->host_bound() ? plan.device_host : 0);
    if (needed > host.available()) {
        throw BudgetBusyError("the plan needs " + util::human_bytes(needed) + " (weights " +
                              util::human_bytes(plan.weights()) + ", KV cache " + util::human_bytes(plan.kv) +
                              ", scratch " + util::human_bytes(plan.scratch) + ", logits " +
                              util::human_bytes(plan.logits) + ", overhead " + util::human_bytes(plan.overhead) +
                              "); the budget is " + util::human_bytes(host.capacity()) + " and " +
                              util::human_bytes(host.live()) + " of it is held (" + host.breakdown() + ")");
    }

    if (offloads && !offload->host_bound()) offload->bind_host(host);

    // The context as planned.
    e->context_ = context;
    e->context_.n_ctx = plan.params.n_ctx;
    e->context_.type_k = kv_type(plan.params.type_k);
    e->context_.type_v = kv_type(plan.params.type_v);
    e->context_.n_threads = plan.params.n_threads;
    e->load_.stream_layers = plan.params.n_streamed_layers;
    e->load_.expert_slots = plan.n_expert_slots;

    // Charge, lock, load, read in.
    const int n_layer = plan.shape.hp.n_layer;
    const std::string resident = std::to_string(n_layer - plan.params.n_streamed_layers) + " of " +
                                 std::to_string(n_layer) + " layers, embeddings and output";
    e->overhead_ =
        host.pool(memory::pool_names::kOverhead)
            .charge(plan.overhead, "the runtime, the GGUF metadata, the tokenizer and the samplers (planned)");
    e->weights_ = host.pool(memory::pool_names::kWeights)
                      .charge(plan.weights_resident, "the resident weights (" + resident + ")");
    if (load.mlock) e->locked_bytes_ = lock_resident_weights(*e->file_, plan, host, e->lock_rounding_);
    // The model charges its working memory ("scratch", as it grows) and its stream buffers
    // ("staging") itself.
    const int n_gpu_layers = offload ? plan.params.n_gpu_layers : 0;
    // The tensor overrides (--cpu-moe, -ot) place tensors of offloaded layers: none without them.
    const std::vector<model::TensorOverride> overrides =
        n_gpu_layers > 0 ? plan.params.tensor_overrides : std::vector<model::TensorOverride>{};
    e->model_ = model::Model::load(*e->file_, {.device = &host,
                                               .n_streamed_layers = plan.params.n_streamed_layers,
                                               .offload = n_gpu_layers > 0 ? offload : nullptr,
                                               .n_offload_layers = n_gpu_layers,
                                               .offload_kv = plan.params.kv_offload,
                                               .tensor_overrides = overrides,
                                               .expert_slots = plan.n_expert_slots,
                                               .expert_prefetch = load.expert_prefetch,
                                               .expert_evict = load.expert_evict});
    if (e->locked_bytes_ == 0) prefault(*e->file_, *e->model_, load.on_load_progress);  // mlock read them in
    return e;
}

Engine::~Engine() = default;

std::string Engine::plan_text() const {
    std::string s = engine::plan_text(plan_, budget_source_);
    if (draft_) s += "\ndraft model (-md):\n" + draft_->plan_text();
    return s;
}

const tokenizer::Tokenizer& Engine::tokenizer() const {
    std::call_once(tokenizer_once_, [this] {
        auto t = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(*file_));
        const tokenizer::Vocab& vocab = t->vocab();
        render_options_.add_generation_prompt = true;
        if (vocab.valid(vocab.special().bos)) render_options_.bos_token = vocab.text(vocab.special().bos);
        if (vocab.valid(vocab.special().eos)) render_options_.eos_token = vocab.text(vocab.special().eos);
        tokenizer_ = std::move(t);
    });
    return *tokenizer_;
}

const chat::RenderOptions& Engine::render_options() const {
    tokenizer();
    return render_options_;
}

const chat::ResolvedTemplate& Engine::chat_template() const {
    std::call_once(template_once_,
                   [this] { template_ = std::make_unique<chat::ResolvedTemplate>(chat::template_for_model(*file_)); });
    return *template_;
}

kv::ModelCache Engine::make_cache(const ContextConfig& context, int max_position) const {
    return engine::make_cache(*model_, context, &resources_->host(), max_position);
}

memory::PoolBuffer<float> Engine::make_logits(int rows) const {
    return engine::make_logits(*model_, rows, &resources_->host());
}

std::string Engine::peak_summary() const {
    const memory::Device& host = resources_->host();
    std::string s = "pools (peak):" + pools_text(host) + "; all " + util::human_bytes(host.peak()) + " of the " +
                    util::human_bytes(host.capacity()) + " budget, plan " +
                    util::human_bytes(plan_.total() + (draft_ ? draft_->plan().total() : 0));
    if (draft_) s += " (the draft model's " + util::human_bytes(draft_->plan().total()) + " included)";
    if (const model::ExpertCacheStats x = model_->expert_cache_stats(); x.n_slots > 0)
        s += "; " + model::expert_cache_text(x);
    backend::Backend* offload = resources_->offload();
    if (offload && offload->unified() && plan_.device.n_layer > 0) {
        s += "; " + offload->name() + " (unified) charged the host's pools: its KV " +
             util::human_bytes(plan_.device.kv) + " and scratch " + util::human_bytes(plan_.device.scratch) +
             " planned within them, no weight copies";
    } else if (offload && plan_.device.n_layer > 0) {
        const memory::Device& d = offload->memory();
        s += "; " + d.name() + ":" + pools_text(d) + "; all " + util::human_bytes(d.peak()) + ", plan " +
             util::human_bytes(plan_.device.total());
    }
    return s;
}

}  // namespace fitllm::engine
