// The forward passes the offload tests compare between placements, and their bitwise check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "kv/cache.h"
#include "model/model.h"
#include "ops/thread_pool.h"

namespace fitllm::test {

// A prompt of 40 tokens in one batch (all rows), greedy steps, then two sequences in one batch and
// a decode step of both: every logit, in order.
inline std::vector<float> offload_script(model::Model& m, ops::ThreadPool& pool) {
    const int V = m.n_vocab();
    std::vector<float> all;
    {
        std::vector<int32_t> tokens(40), pos(40);
        for (int i = 0; i < 40; ++i) tokens[size_t(i)] = (i * 37 + 11) % std::min(V, 300);
        std::iota(pos.begin(), pos.end(), 0);
        kv::ModelCache cache = m.make_cache({.n_cells = 128, .block_size = 4}, 40);
        std::vector<float> rows(40 * size_t(V));
        m.forward(tokens, pos, cache, rows.data(), /*all_logits=*/true, pool);
        all.insert(all.end(), rows.begin(), rows.end());
        std::vector<float> row(rows.end() - V, rows.end());
        for (int32_t p = 40; p < 44; ++p) {
            const auto t = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
            m.forward(std::span(&t, 1), std::span(&p, 1), cache, row.data(), false, pool);
            all.insert(all.end(), row.begin(), row.end());
        }
    }
    kv::ModelCache cache = m.make_cache({.n_cells = 128, .n_seq_max = 2, .block_size = 4}, 16);
    const std::vector<int32_t> tokens = {1, 9, 7, 4, 3, 12, 5}, pos = {0, 0, 1, 1, 2, 2, 3};
    const std::vector<kv::SeqId> seq = {0, 1, 0, 1, 0, 1, 0};
    std::vector<float> rows(7 * size_t(V));
    m.forward({.tokens = tokens, .positions = pos, .seq_ids = seq, .all_logits = true}, cache, rows.data(), pool);
    all.insert(all.end(), rows.begin(), rows.end());
    const std::vector<int32_t> t2 = {8, 2}, p2 = {4, 3};
    const std::vector<kv::SeqId> s2 = {0, 1};
    m.forward({.tokens = t2, .positions = p2, .seq_ids = s2, .all_logits = true}, cache, rows.data(), pool);
    all.insert(all.end(), rows.begin(), rows.begin() + 2 * V);
    return all;
}

inline void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got) {
    ASSERT_EQ(want.size(), got.size());
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
}

}  // namespace fitllm::test
