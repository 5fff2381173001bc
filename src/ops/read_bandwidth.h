// The machine's read bandwidth as decode sees it: how fast the threads of a pool read a set of
// byte ranges (a model's mapped weights), all of them once per pass. Decode reads every weight
// once per token, so tokens/s x bytes read per token over this figure is the share of the
// bandwidth a decode reaches (fitllm bench prints it for each tg test).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ops/thread_pool.h"

namespace fitllm::ops {

struct ReadBandwidth {
    double bytes_per_second = 0.0;  // the best pass
    uint64_t bytes = 0;             // read in one pass
    int passes = 0;
};

// Reads every byte of `ranges` once per pass on all threads of `pool` (1 MiB chunks, taken in
// turn), `passes` times; returns the fastest pass. Ranges that are not resident are paged in by
// the first pass, so give at least two passes for a figure of memory rather than of the disk.
// Empty ranges are fine; no ranges gives bytes_per_second = 0.
ReadBandwidth measure_read_bandwidth(std::span<const std::span<const std::byte>> ranges, ThreadPool& pool,
                                     int passes = 3);

}  // namespace fitllm::ops
