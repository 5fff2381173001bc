#include "cli/run_budget.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "cli/args.h"
#include "cli/load_progress.h"
#include "io/mapped_file.h"
#include "memory/budget.h"
#include "ops/thread_pool.h"
#include "util/text.h"

namespace fitllm::cli {
namespace {

std::string type_str(quant::GgmlType t) {
    std::string s(quant::type_name(static_cast<uint32_t>(t)));
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

// "-c 4096 -ctk q8_0 -ctv q8_0, 2 of 18 layers streamed"
std::string settings_text(const memory::Plan& p) {
    const memory::PlanParams& q = p.params;
    std::string s = "-c " + std::to_string(q.n_ctx) + " -ctk " + type_str(q.type_k) + " -ctv " + type_str(q.type_v) +
                    ", " + std::to_string(q.n_streamed_layers) + " of " + std::to_string(p.shape.hp.n_layer) +
                    " layers streamed";
    if (!p.device.name.empty()) s += ", -ngl " + std::to_string(q.n_gpu_layers) + " on " + p.device.name;
    return s;
}

// The plan's rows charged to a device of the budget's capacity, in the order the run charges
// them (load: overhead, weights, stream buffers; the session: KV, logits; the first forward
// pass: scratch): the BudgetError of the first that does not fit, as the run would raise it.
std::string first_refusal(const memory::Plan& p) {
    memory::Device host("host", p.params.budget);
    std::vector<memory::Charge> charges;
    try {
        namespace names = memory::pool_names;
        charges.push_back(host.pool(names::kOverhead).charge(p.overhead, "the runtime, metadata and tokenizer"));
        charges.push_back(host.pool(names::kWeights).charge(p.weights_resident, "the resident weights"));
        charges.push_back(host.pool(names::kStaging).charge(p.stream_buffer, "the streamed layers' buffer"));
        charges.push_back(host.pool(names::kStaging).charge(p.device_host, "the offload device's host staging"));
        charges.push_back(host.pool(names::kKv).charge(p.kv, "the KV cache"));
        charges.push_back(host.pool(names::kLogits).charge(p.logits, "logits"));
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

// [begin, end) file byte ranges of the resident weights (global tensors and the layers before
// the streamed ones), merged where they touch the same page.
std::vector<std::pair<uint64_t, uint64_t>> resident_ranges(const gguf::GgufFile& file, int n_layer, int n_streamed) {
    const uint64_t page = io::MappedFile::page_size();
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const gguf::TensorInfo& t : file.tensors()) {
        const int il = memory::tensor_layer(t.name);
        if (il >= n_layer - n_streamed || t.n_bytes == 0) continue;
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

}  // namespace

ResolvedBudget resolve_budget(const std::string& mem) {
    if (!mem.empty()) {
        try {
            return {memory::parse_size(mem), "--mem " + mem};
        } catch (const memory::SizeError& e) {
            throw UsageError(std::string("--mem: ") + e.what());
        }
    }
    const memory::HostBudget hb = memory::host_budget();
    return {hb.budget,
            hb.source + " " + util::human_bytes(hb.available) + " less margin " + util::human_bytes(hb.margin)};
}

long peak_rss_kib() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
}

memory::PlanParams session_plan_params(const runtime::SessionParams& sp, int n_threads) {
    memory::PlanParams p;
    p.type_k = sp.type_k;
    p.type_v = sp.type_v;
    p.kv_rotation = sp.kv_rotation;
    p.n_threads = n_threads > 0 ? n_threads : ops::physical_core_count();
    p.kv_resident_limit = sp.kv_spill_dir.empty() ? 0 : sp.kv_resident_limit;
    return p;
}

std::unique_ptr<backend::Backend> apply_offload_options(const MemoryOptions& options, memory::PlanParams& params,
                                                        memory::Device* host, bool plan_only) {
    params.device = options.device;
    params.kv_offload = !options.no_kv_offload;
    params.unified = false;
    if (params.device.empty() && options.n_gpu_layers > 0) {
        if (backend::cuda_device_count() == 0) {
            throw UsageError("-ngl " + std::to_string(options.n_gpu_layers) + ": no GPU to offload to (" +
                             (backend::cuda_built() ? "no CUDA device found" : "this build has no CUDA") +
                             "); --device virtual runs the offload path on the CPU");
        }
        params.device = "cuda0";
    }
    if (params.device.empty()) {
        if (!options.vram.empty()) throw UsageError("--vram: no device to offload to (--device NAME or -ngl N)");
        if (options.unified) throw UsageError("--unified: no device to offload to (--device NAME or -ngl N)");
        params.n_gpu_layers = 0;
        return nullptr;
    }
    params.n_gpu_layers = options.n_gpu_layers >= 0 ? options.n_gpu_layers : -1;
    params.vram = 0;
    const auto [base_name, unified_by_name] = backend::strip_unified_suffix(params.device);
    const std::string base(base_name);  // (params.device changes below)
    const bool integrated = !options.unified && !unified_by_name && backend::device_is_integrated(base);
    if (options.unified || unified_by_name || integrated) {
        // One memory, one budget: the device's share is the host's (memory/plan.h, PlanParams::unified).
        const std::string why = integrated ? params.device + " is an integrated GPU (it shares the host's memory)"
                                           : params.device + " is unified (it shares the host's memory)";
        if (!options.vram.empty()) {
            throw UsageError("--vram " + options.vram + ": " + why +
                             ", so its KV cache and activations come out of "
                             "the host's budget, --mem; drop --vram");
        }
        if (!backend::is_device_name(base)) {
            throw UsageError("--device " + options.device +
                             ": unknown device (accepted: virtual, virtualN, "
                             "virtual-unified, cuda, cudaN)");
        }
        params.unified = true;
        params.device = base.starts_with("virtual") ? base + "-unified" : (base == "cuda" ? "cuda0" : base);
        if (host == nullptr) return nullptr;
        std::unique_ptr<backend::Backend> device;
        try {
            device = backend::open_unified_device(base, *host);
        } catch (const std::exception& e) {
            throw UsageError(std::string("--device ") + options.device + (options.unified ? " --unified" : "") + ": " +
                             e.what());
        }
        params.device = device->name();
        return device;
    }
    if (!options.vram.empty()) {
        try {
            params.vram = memory::parse_size(options.vram);
        } catch (const memory::SizeError& e) {
            throw UsageError(std::string("--vram: ") + e.what());
        }
    }
    if (plan_only && params.vram > 0) return nullptr;  // a plan for a device that may be elsewhere
    std::unique_ptr<backend::Backend> device;
    try {
        device = backend::open_device(params.device, params.vram > 0 ? params.vram : UINT64_MAX);
    } catch (const std::exception& e) {
        throw UsageError(std::string("--device ") + params.device + ": " + e.what());
    }
    // The plan's device budget: --vram, or what the device has (a CUDA device's free memory).
    if (params.vram == 0 && device->memory().capacity() != UINT64_MAX) params.vram = device->memory().capacity();
    params.device = device->name();
    return device;
}

std::optional<RunBudget> RunBudget::prepare(const char* command, const gguf::GgufFile& file, memory::PlanParams params,
                                            const MemoryOptions& options, ContextMayShrink shrink) {
    const ResolvedBudget budget = resolve_budget(options.mem);
    params.budget = budget.bytes;
    if (options.stream_layers >= 0) params.n_streamed_layers = options.stream_layers;
    RunBudget rb;
    rb.device_ = std::make_unique<memory::Device>("host", params.budget);
    rb.offload_ = apply_offload_options(options, params, rb.device_.get());
    const memory::ModelShape shape = memory::model_shape(file);
    rb.options_ = options;
    try {
        rb.plan_ = options.fit ? memory::fit_plan(shape, params) : memory::make_plan(shape, params);
    } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
    }
    if (options.fit && rb.plan_.fits() && shrink == ContextMayShrink::no && rb.plan_.params.n_ctx != params.n_ctx) {
        std::fprintf(stderr,
                     "fitllm %s: --fit: the budget %s (%s) would need the context shortened from %d to %d tokens, "
                     "which %s does not allow: lower -c / -p / -n, or raise --mem\n",
                     command, util::human_bytes(params.budget).c_str(), budget.source.c_str(), params.n_ctx,
                     rb.plan_.params.n_ctx, command);
        return std::nullopt;
    }
    if (options.fit && rb.plan_.fits()) {  // (a refusal prints them with the plan)
        for (const memory::FitStep& s : rb.plan_.fit_steps) {
            std::fprintf(stderr, "fitllm %s --fit: %s\n    why: %s\n", command, s.change.c_str(), s.reason.c_str());
        }
        {
            std::fprintf(stderr, "fitllm %s --fit: %s%s: %s planned of the %s budget\n", command,
                         rb.plan_.fit_steps.empty() ? "fits as asked, " : "", settings_text(rb.plan_).c_str(),
                         util::human_bytes(rb.plan_.total()).c_str(), util::human_bytes(params.budget).c_str());
        }
    }
    if (!rb.plan_.fits()) {
        std::fprintf(stderr, "fitllm %s: the plan does not fit the memory budget: %s\n\n%s\n", command,
                     first_refusal(rb.plan_).c_str(), plan_text(rb.plan_, budget.source).c_str());
        std::fprintf(stderr, "fitllm %s: %s\n", command,
                     options.fit ? "nothing fits even with --fit: raise --mem or use a smaller model"
                                 : "use --fit to let fitllm choose settings that fit (quantized KV cache, streamed "
                                   "layers, then a shorter context), or raise --mem");
        return std::nullopt;
    }
    rb.overhead_ = rb.device_->pool(memory::pool_names::kOverhead)
                       .charge(rb.plan_.overhead, "the runtime, the GGUF metadata and the tokenizer (planned)");
    // The device's host-side buffers (a CUDA device's pinned staging), as the plan's device_host.
    if (rb.offload_ && rb.plan_.params.n_gpu_layers > 0) rb.offload_->bind_host(*rb.device_);
    return rb;
}

std::unique_ptr<model::Model> RunBudget::load_model(gguf::GgufFile& file) {
    const memory::PlanParams& q = plan_.params;
    const int n_layer = plan_.shape.hp.n_layer;
    const std::string resident = std::to_string(n_layer - q.n_streamed_layers) + " of " + std::to_string(n_layer) +
                                 " layers, embeddings and output";
    weights_ = device_->pool(memory::pool_names::kWeights)
                   .charge(plan_.weights_resident, "the resident weights (" + resident + ")");
    memory::Charge lock_rounding;
    io::MappedFile* mapping = file.mapping();
    bool locked = false;
    if (options_.mlock) {
        if (mapping == nullptr || !mapping->is_file_mapping()) {
            throw io::IoError("--mlock: " + file.source() + " is not a mapped file; nothing to lock");
        }
        const auto ranges = resident_ranges(file, n_layer, q.n_streamed_layers);
        const uint64_t page = io::MappedFile::page_size();
        uint64_t pages = 0;
        for (const auto& [b, e] : ranges) pages += (e + page - 1) / page * page - b;
        // The pages locked beyond the weights' own bytes (page rounding) are charged too: the
        // lock stays within the budget.
        if (pages > plan_.weights_resident) {
            lock_rounding = device_->pool(memory::pool_names::kWeights)
                                .charge(pages - plan_.weights_resident, "page rounding of the locked weights");
        }
        rlimit limit{};
        if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
            const uint64_t already = process_locked_bytes();
            if (already + pages > limit.rlim_cur) {
                throw io::IoError("--mlock: locking the resident weights (" + resident + ") needs " +
                                  util::human_bytes(pages) + " (" + std::to_string(pages) + " bytes) + " +
                                  std::to_string(already) +
                                  " bytes already locked, over the RLIMIT_MEMLOCK soft limit of " +
                                  util::human_bytes(limit.rlim_cur) + " (" + std::to_string(limit.rlim_cur) +
                                  " bytes; see ulimit -l); nothing locked");
            }
        }
        size_t done = 0;
        try {
            for (; done < ranges.size(); ++done) {
                mapping->lock(ranges[done].first, ranges[done].second - ranges[done].first);
            }
        } catch (...) {
            for (size_t i = 0; i < done; ++i) mapping->unlock(ranges[i].first, ranges[i].second - ranges[i].first);
            throw;
        }
        locked = true;
        std::fprintf(stderr, "mlock: %s of resident weights locked\n", util::human_bytes(pages).c_str());
    }
    weights_lock_rounding_ = std::move(lock_rounding);
    // The model charges its working memory ("scratch", as it grows) and its stream buffers
    // ("staging") itself.
    auto model = model::Model::load(file, {.device = device_.get(),
                                           .n_streamed_layers = q.n_streamed_layers,
                                           .offload = q.n_gpu_layers > 0 ? offload_.get() : nullptr,
                                           .n_offload_layers = q.n_gpu_layers,
                                           .offload_kv = q.kv_offload});
    if (!locked) prefault_with_progress(file, *model);  // mlock has read them in already
    return model;
}

std::string RunBudget::peak_summary() const {
    std::string s = "pools (peak):";
    bool first = true;
    for (const memory::PoolStats& p : device_->pools()) {
        s += (first ? " " : ", ") + p.name + " " + util::human_bytes(p.peak);
        first = false;
    }
    s += "; all " + util::human_bytes(device_->peak()) + " of the " + util::human_bytes(device_->capacity()) +
         " budget, plan " + util::human_bytes(plan_.total());
    if (offload_ && offload_->unified() && plan_.device.n_layer > 0) {
        s += "; " + offload_->name() + " (unified) charged the host's pools: its KV " +
             util::human_bytes(plan_.device.kv) + " and scratch " + util::human_bytes(plan_.device.scratch) +
             " planned within them, no weight copies";
    } else if (offload_ && plan_.device.n_layer > 0) {
        const memory::Device& d = offload_->memory();
        s += "; " + d.name() + ":";
        first = true;
        for (const memory::PoolStats& p : d.pools()) {
            s += (first ? " " : ", ") + p.name + " " + util::human_bytes(p.peak);
            first = false;
        }
        s += "; all " + util::human_bytes(d.peak()) + ", plan " + util::human_bytes(plan_.device.total());
    }
    return s;
}

}  // namespace fitllm::cli
