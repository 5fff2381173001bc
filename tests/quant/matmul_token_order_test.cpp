// ops::matmul without token places (the one-token arithmetic: model::Batch::token_order, which
// speculative decoding's verification passes use) gives every token of an n-token call the floats
// it gets alone, bit for bit: every weight type at every ISA level this CPU has (host_cpu_features:
// FITLLM_CPU_ISA lowers it), token counts that take the small-batch kernels and the tiles
// (quant/gemm.h), rows one chunk wide and rows wider than the tiles' chunks (which carry their sums
// from chunk to chunk), and a row count that leaves a partial tile. With token places (a batch of
// prompts and decoding sequences), a run of 1 beside a prompt's runs gets its one-token floats too.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ops/matmul.h"
#include "quant/dot.h"
#include "quant_test_data.h"

namespace fitllm::quant {
namespace {

TEST(MatmulTokenOrder, EveryTokenGetsItsOneTokenBitsAtEveryLevel) {
    const CpuFeatures cpu = host_cpu_features();  // FITLLM_CPU_ISA lowers it
    ops::ThreadPool pool(2);
    constexpr int kRows = 37;
    int tested = 0;
    for (GgmlType w : test::kDotWeightTypes) {
        const bool super = traits(w).block_elements == kQK;
        for (int cols : {super ? 768 : 320, 4096}) {
            const auto packed = test::weight_rows(w, kRows, cols, static_cast<uint32_t>(cols) + 7, true);
            const ops::WeightView view{w, kRows, cols, packed.data(), 0};
            for (Isa isa : kAllIsas) {
                if (isa > cpu.best_isa()) continue;
                ops::Scratch scratch(limit_to(cpu, isa));
                ++tested;
                std::string differing;
                for (int toks : {2, 3, 5, 8, 9, 12, 16, 17, 33}) {
                    const auto x = test::gaussian(static_cast<size_t>(toks) * cols, static_cast<uint32_t>(toks + cols));
                    std::vector<float> batched(static_cast<size_t>(toks) * kRows);
                    ops::matmul(view, x.data(), toks, batched.data(), pool, scratch);
                    int bad_tokens = 0;
                    for (int t = 0; t < toks; ++t) {
                        std::vector<float> alone(kRows);
                        ops::matmul(view, x.data() + static_cast<size_t>(t) * cols, 1, alone.data(), pool, scratch);
                        bad_tokens += std::memcmp(alone.data(), batched.data() + static_cast<size_t>(t) * kRows,
                                                  sizeof(float) * kRows) != 0;
                    }
                    if (bad_tokens > 0) {
                        differing += " " + std::to_string(bad_tokens) + " of " + std::to_string(toks) + " tokens;";
                    }
                }
                EXPECT_TRUE(differing.empty()) << traits(w).name << " at " << isa_name(isa) << ", " << cols
                                               << " columns: not the one-token bits for" << differing;
            }
        }
    }
    EXPECT_GT(tested, 0);
}

TEST(MatmulTokenOrder, RunsOfOneBesideAPromptGetTheirOneTokenBits) {
    const CpuFeatures cpu = host_cpu_features();  // FITLLM_CPU_ISA lowers it
    ops::ThreadPool pool(2);
    constexpr int kRows = 37;
    // A prompt's run of 12 tokens, then three runs of 1 (decoding sequences, or rows in the
    // one-token arithmetic), then a run of 9.
    std::vector<ops::TokenPlace> places;
    for (int i = 0; i < 12; ++i) places.push_back({12, i});
    for (int i = 0; i < 3; ++i) places.push_back({1, 0});
    for (int i = 0; i < 9; ++i) places.push_back({9, i});
    const int toks = static_cast<int>(places.size());
    for (GgmlType w : test::kDotWeightTypes) {
        const int cols = traits(w).block_elements == kQK ? 1536 : 1280;
        const auto packed = test::weight_rows(w, kRows, cols, 11, true);
        const ops::WeightView view{w, kRows, cols, packed.data(), 0};
        const auto x = test::gaussian(static_cast<size_t>(toks) * cols, 5);
        for (Isa isa : kAllIsas) {
            if (isa > cpu.best_isa()) continue;
            ops::Scratch scratch(limit_to(cpu, isa));
            std::vector<float> batched(static_cast<size_t>(toks) * kRows);
            ops::matmul(view, x.data(), toks, batched.data(), pool, scratch, places);
            for (int t = 12; t < 15; ++t) {
                std::vector<float> alone(kRows);
                ops::matmul(view, x.data() + static_cast<size_t>(t) * cols, 1, alone.data(), pool, scratch);
                EXPECT_EQ(
                    std::memcmp(alone.data(), batched.data() + static_cast<size_t>(t) * kRows, sizeof(float) * kRows),
                    0)
                    << traits(w).name << " at " << isa_name(isa) << ": token " << t;
            }
        }
    }
}

}  // namespace
}  // namespace fitllm::quant
