#include "engine/resources.h"

#include <cstdint>
#include <string>
#include <utility>

#include "fitllm/error.h"
#include "memory/budget.h"
#include "util/text.h"

namespace fitllm::engine {

ResolvedBudget resolve_budget(uint64_t mem, std::string budget_source) {
    if (mem > 0) return {mem, budget_source.empty() ? "set to " + util::human_bytes(mem) : std::move(budget_source)};
    const memory::HostBudget hb = memory::host_budget();
    return {hb.budget,
            hb.source + " " + util::human_bytes(hb.available) + " less margin " + util::human_bytes(hb.margin)};
}

std::unique_ptr<backend::Backend> resolve_offload(const OffloadConfig& offload, OffloadTarget& target,
                                                  memory::Device* host, bool open) {
    target = OffloadTarget{};
    target.device = offload.device;
    target.kv_offload = offload.kv_offload;
    if (target.device.empty() && offload.n_gpu_layers > 0) {
        if (backend::cuda_device_count() == 0) {
            throw ConfigError("-ngl " + std::to_string(offload.n_gpu_layers) + ": no GPU to offload to (" +
                              (backend::cuda_built() ? "no CUDA device found" : "this build has no CUDA") +
                              "); --device virtual runs the offload path on the CPU");
        }
        target.device = "cuda0";
    }
    if (target.device.empty()) {
        if (offload.vram > 0) throw ConfigError("--vram: no device to offload to (--device NAME or -ngl N)");
        if (offload.unified) throw ConfigError("--unified: no device to offload to (--device NAME or -ngl N)");
        return nullptr;
    }
    target.n_gpu_layers = offload.n_gpu_layers >= 0 ? offload.n_gpu_layers : OffloadConfig::kAllThatFit;
    const auto [base_name, unified_by_name] = backend::strip_unified_suffix(target.device);
    const std::string base(base_name);  // (target.device changes below)
    const bool integrated = !offload.unified && !unified_by_name && backend::device_is_integrated(base);
    if (offload.unified || unified_by_name || integrated) {
        // One memory, one budget: the device's share is the host's (engine/plan.h, PlanParams::unified).
        const std::string why = integrated ? target.device + " is an integrated GPU (it shares the host's memory)"
                                           : target.device + " is unified (it shares the host's memory)";
        if (offload.vram > 0) {
            throw ConfigError("--vram " + util::human_bytes(offload.vram) + ": " + why +
                              ", so its KV cache and activations come out of the host's budget, --mem; drop --vram");
        }
        if (!backend::is_device_name(base)) {
            throw ConfigError("--device " + offload.device +
                              ": unknown device (accepted: virtual, virtualN, virtual-unified, cuda, cudaN)");
        }
        target.unified = true;
        target.device = base.starts_with("virtual") ? base + "-unified" : (base == "cuda" ? "cuda0" : base);
        if (!open) return nullptr;
        std::unique_ptr<backend::Backend> device;
        try {
            device = backend::open_unified_device(base, *host);
        } catch (const std::exception& e) {
            throw ConfigError(std::string("--device ") + offload.device + (offload.unified ? " --unified" : "") + ": " +
                              e.what());
        }
        target.device = device->name();
        return device;
    }
    target.vram = offload.vram;
    if (!open && target.vram > 0) return nullptr;  // a plan for a device that may be elsewhere
    std::unique_ptr<backend::Backend> device;
    try {
        device = backend::open_device(target.device, target.vram > 0 ? target.vram : UINT64_MAX);
    } catch (const std::exception& e) {
        throw ConfigError(std::string("--device ") + target.device + ": " + e.what());
    }
    // The plan's device budget: vram, or what the device has (a CUDA device's free memory).
    if (target.vram == 0 && device->memory().capacity() != UINT64_MAX) target.vram = device->memory().capacity();
    target.device = device->name();
    return open ? std::move(device) : nullptr;
}

std::shared_ptr<Resources> Resources::open(const LoadConfig& load, int n_threads, std::string budget_source) {
    const ResolvedBudget budget = resolve_budget(load.mem, std::move(budget_source));
    std::shared_ptr<Resources> r(new Resources);
    r->budget_source_ = budget.source;
    r->host_ = std::make_unique<memory::Device>("host", budget.bytes);
    r->offload_ = resolve_offload(load.offload, r->target_, r->host_.get(), /*open=*/true);
    r->compute_ = std::make_unique<Compute>(n_threads);
    return r;
}

Resources::~Resources() {
    if (offload_) offload_->unbind_host();  // (Engine::load binds it) its charge goes back before host_ goes
}

}  // namespace fitllm::engine
