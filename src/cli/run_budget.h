#pragma once
// The memory budget of a generating command (run, chat, bench, perplexity): the plan for the
// command's settings, checked before anything is loaded (or changed by --fit until it fits), and
// the host device that charges what the run then allocates (memory/device.h).
//
//   MemoryOptions mo;  add_memory_options(parser, mo);          // cli/generation_options.h
//   ...parse...
//   auto budget = RunBudget::prepare("run", file, planned, mo, ContextMayShrink::yes);
//   if (!budget) return kExitDoesNotFit;                        // refused, the plan printed
//   params.n_ctx = budget->plan().params.n_ctx - ...;           // the settings --fit chose
//   const auto model = budget->load_model(file);                // weights charged, locked with --mlock
//   params.device = &budget->device();                          // the session charges KV and logits
//   ... std::fprintf(stderr, "... | %s\n", budget->peak_summary().c_str());
//
// Declare the RunBudget before the model and the sessions: they charge its device.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "cli/generation_options.h"
#include "gguf/gguf_reader.h"
#include "memory/device.h"
#include "memory/plan.h"
#include "memory/pool.h"
#include "model/model.h"

namespace fitllm::cli {

// The exit status of a command whose plan does not fit its budget (as `fitllm plan`).
inline constexpr int kExitDoesNotFit = 3;

// The host budget: --mem SIZE, or memory::host_budget() when mem is empty; source says where it
// came from ("--mem 1G", "MemAvailable (/proc/meminfo) 12.0 GiB less margin 614 MiB").
// Throws UsageError for a size that is not one.
struct ResolvedBudget {
    uint64_t bytes = 0;
    std::string source;
};
ResolvedBudget resolve_budget(const std::string& mem);

// The plan as `fitllm plan` prints it (cli/plan.cpp).
std::string plan_text(const memory::Plan& plan, const std::string& budget_source);

// The process's peak resident set (VmHWM) in KiB, or -1 where /proc does not tell.
long peak_rss_kib();

enum class ContextMayShrink { no, yes };

// The plan parameters a run's session settings decide: KV types, the spill's resident limit (with
// --kv-spill-dir) and the threads (n_threads <= 0: the physical cores). The caller adds the
// context, sequences, batch and outputs.
memory::PlanParams session_plan_params(const runtime::SessionParams& sp, int n_threads);

// Copies the offload options into params and opens the device: the one named, or the first CUDA
// device when -ngl asks for one and none is named; the layers (-1: as many as fit); the device
// budget (--vram, else a CUDA device's free memory; none for the virtual device) and the KV
// placement. Returns nullptr without a device. Throws UsageError for -ngl without a device to
// offload to, a --vram that is not a size or a device that cannot be opened (why). plan_only:
// with --vram, nothing is opened (fitllm plan, for a device that may be on another machine).
// Unified mode (--unified, --device virtual-unified, or a CUDA device that reports itself
// integrated) sets params.unified and opens the device on `host` (backend::open_unified_device:
// its pools are host's; -ngl defaults to every layer); --vram with it is a UsageError (its
// budget is --mem). host nullptr: a unified device is not opened (fitllm plan; fitllm serve's
// registry opens it on its own budget), params.device names it.
std::unique_ptr<backend::Backend> apply_offload_options(const MemoryOptions& options, memory::PlanParams& params,
                                                        memory::Device* host, bool plan_only = false);

class RunBudget {
public:
    // Plans `params` (its budget and n_streamed_layers from the options) for the model in file.
    // Without --fit, a plan over the budget is refused: the first pool that would not fit, the
    // plan's table and a hint go to stderr, and the result is empty. With --fit, fit_plan()
    // changes the settings (the context only when `shrink` allows) and what it chose and why go
    // to stderr; a plan that still does not fit is refused the same way. Throws UsageError for
    // settings the plan refuses.
    static std::optional<RunBudget> prepare(const char* command, const gguf::GgufFile& file, memory::PlanParams params,
                                            const MemoryOptions& options, ContextMayShrink shrink);

    RunBudget(RunBudget&&) = default;
    RunBudget& operator=(RunBudget&&) = default;

    const memory::Plan& plan() const { return plan_; }
    memory::Device& device() { return *device_; }
    // The device offloaded layers run on (--device, -ngl), or nullptr. A unified one's memory() is
    // device().
    backend::Backend* offload() { return offload_.get(); }

    // Charges the resident weights to the "weights" pool, locks them with --mlock (all or
    // nothing: over RLIMIT_MEMLOCK or the budget is refused with the numbers, nothing locked),
    // loads the model on the device (it charges its scratch and stream buffers, and streams the
    // planned layers) and reads the resident weights in (with a progress line on a terminal).
    // Throws memory::BudgetError, io::IoError or model::ModelError.
    std::unique_ptr<model::Model> load_model(gguf::GgufFile& file);

    // "pools (peak): weights 230 MiB, kv 27.0 MiB, ...; all 310 MiB of the 1.20 GiB budget, plan 311 MiB"
    std::string peak_summary() const;

private:
    RunBudget() = default;

    memory::Plan plan_;
    MemoryOptions options_;
    // Declared before what charges it: the offload device (a unified one charges its pools, and
    // Backend::bind_host its host staging) and the charges below.
    std::unique_ptr<memory::Device> device_;
    std::unique_ptr<backend::Backend> offload_;
    memory::Charge overhead_;
    memory::Charge weights_;
    memory::Charge weights_lock_rounding_;  // --mlock: whole pages beyond the weights' bytes
};

}  // namespace fitllm::cli
