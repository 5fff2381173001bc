#pragma once
// Options shared by the generating subcommands (run, chat, bench, perplexity): the sampling flags,
// the KV cache's flags, and their checks.
#include <string>

#include "cli/args.h"
#include "runtime/session.h"
#include "sampling/sampling_params.h"

namespace fitllm::cli {

// Parses a number for option `name`, with a UsageError naming it on bad input.
float parse_float(const std::string& name, const std::string& text);

// Declares --temp, --top-k, --top-p, --min-p, --seed and --repeat-penalty, writing into sp.
void add_sampling_options(ArgParser& parser, sampling::SamplingParams& sp);

// Throws UsageError when a sampling parameter is out of range.
void validate_sampling_options(const sampling::SamplingParams& sp);

// Declares -ctk / --cache-type-k TYPE, -ctv / --cache-type-v TYPE and --no-kv-rotation, writing
// into sp.type_k, sp.type_v and sp.kv_rotation (an unknown type is a UsageError listing the names),
// and --kv-spill-dir DIR and --kv-resident SIZE, writing into sp.kv_spill_dir and sp.kv_resident_limit.
void add_kv_options(ArgParser& parser, runtime::SessionParams& sp);

// Declares --context-shift and --keep N, writing into sp.context_shift and sp.n_keep.
void add_context_shift_options(ArgParser& parser, runtime::SessionParams& sp);

// Throws UsageError when --keep is negative or leaves no room in -c with --context-shift.
void validate_context_shift_options(const runtime::SessionParams& sp);

// The memory budget's options (cli/run_budget.h uses them).
struct MemoryOptions {
    std::string mem;         // --mem SIZE; empty: memory::host_budget()
    bool fit = false;        // --fit: change the settings until the plan fits
    bool mlock = false;      // --mlock: lock the resident weights in RAM
    int stream_layers = -1;  // --stream-layers N: stream the last N layers' weights; -1: as planned (none)
    // Offload (DESIGN.md idea 6): --device NAME (cuda0, virtual; empty: a CUDA device when there
    // is one and -ngl asks for it), -ngl N (the last N layers; -1: as many as fit --vram),
    // --vram SIZE (the device's budget; empty: its free memory, no limit for the virtual device),
    // --no-kv-offload (the KV cache of offloaded layers stays in host memory).
    std::string device;
    int n_gpu_layers = -2;  // -2: not given
    std::string vram;
    bool no_kv_offload = false;
    bool unified = false;  // --unified: the device shares the host's memory (cli/run_budget.h)
};

// Declares --mem SIZE, --fit, --mlock, --stream-layers N, --device NAME, -ngl N, --vram SIZE,
// --no-kv-offload and --unified, writing into mo.
void add_memory_options(ArgParser& parser, MemoryOptions& mo);
// Only --device, -ngl, --vram, --no-kv-offload and --unified (fitllm plan has the others of its own).
void add_offload_options(ArgParser& parser, MemoryOptions& mo);

// "K f16, V f16" or "K q4_0, V q4_0, rotated": for the summary lines.
std::string describe_kv(const runtime::SessionParams& sp);

}  // namespace fitllm::cli
