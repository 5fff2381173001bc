#pragma once
// How much memory fitllm may use (docs/architecture.md, idea 2): sizes as users write them ("900M",
// "1.5G", "2GiB") and the default budget of this process, read from its memory cgroup or
// /proc/meminfo.
//
//   uint64_t b = memory::parse_size("1.5G");               // 1610612736
//   memory::HostBudget h = memory::host_budget();          // cgroup limit or MemAvailable, less a margin
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "fitllm/error.h"

namespace fitllm::memory {

// A size that is not one: the message quotes the text and says what a size looks like.
class SizeError : public Error {
public:
    using Error::Error;
};

// Bytes from "1073741824", "900M", "1.5G", "2GiB", "512MiB", "64k", "1T" (case-insensitive, an
// optional "B", "iB" or space after the number). Units are binary: K = 1024, M = 1024^2, ...
// Throws SizeError naming the text for anything else (empty, negative, no digits, unknown unit,
// too large for 64 bits).
uint64_t parse_size(std::string_view text);

// "1.50 GiB", "900 MiB", "17 B" (util/text.h's human_bytes).
std::string format_size(uint64_t bytes);

// Where the budget reading looks; tests point these at fake trees in a temp dir.
struct SystemRoots {
    std::filesystem::path proc = "/proc";  // <proc>/self/cgroup, <proc>/meminfo
    std::filesystem::path sys = "/sys";    // <sys>/fs/cgroup/...
};

// The safety margin kept back from what the system offers: 5% of it or 64 MiB, whichever is
// larger (never more than all of it). It covers what fitllm cannot charge to a pool: the
// executable, the C++ runtime, thread stacks, the page tables of the mapping, other processes
// growing in the meantime.
uint64_t safety_margin(uint64_t available);
inline constexpr uint64_t kMinSafetyMargin = uint64_t{64} << 20;
inline constexpr double kSafetyMarginFraction = 0.05;

struct HostBudget {
    uint64_t available = 0;  // what the system offers this process (before the margin)
    uint64_t margin = 0;     // safety_margin(available)
    uint64_t budget = 0;     // available - margin: the default --mem
    // Where `available` comes from: "cgroup v1 memory.limit_in_bytes (/sys/fs/cgroup/memory/x)",
    // "cgroup v2 memory.max (...)" or "MemAvailable (/proc/meminfo)".
    std::string source;
};

// The smallest memory limit set on this process's cgroup or one above it: cgroup v1's
// memory.limit_in_bytes under <sys>/fs/cgroup/memory (the "memory" line of <proc>/self/cgroup),
// or cgroup v2's memory.max under <sys>/fs/cgroup (the "0::" line). "max" and v1's "no limit"
// value (>= 2^62) are no limit. Sets source when it finds one; 0 when there is none.
uint64_t cgroup_limit(const SystemRoots& roots, std::string* source = nullptr);
// MemAvailable from <proc>/meminfo in bytes (MemFree when the kernel is too old to report it);
// 0 when unreadable.
uint64_t mem_available(const SystemRoots& roots);

// The default host budget: the cgroup limit when one is set, else MemAvailable; less the safety
// margin. Throws Error when neither can be read (no /proc).
HostBudget host_budget(const SystemRoots& roots = {});

}  // namespace fitllm::memory
