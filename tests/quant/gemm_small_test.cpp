// The small-batch kernels (select_small_batch) and ops::matmul's use of them: every result equals
// select_dot's at the same level bit for bit (so a decoding sequence gets the same logits alone or
// batched), and stays within float rounding of the scalar reference; odd row, token and block
// counts (a last block without a partner, blocks not a multiple of 4), padded strides, rows that
// start off their vector alignment, and more tokens than one pass takes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/matmul.h"
#include "quant/dot.h"
#include "quant/gemm.h"
#include "quant_test_data.h"

namespace fitllm::quant {
namespace {

std::vector<int> sizes_for(GgmlType w) {
    if (traits(w).block_elements == 1) return {1, 7, 17, 64, 100, 768, 1001};
    if (traits(w).block_elements == kQK) return {256, 768, 2304};
    return {32, 64, 96, 160, 224, 768, 2240};  // 1, 2, 3, 5, 7, 24, 70 blocks
}

bool same_bits(float a, float b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

TEST(GemmSmallBatch, EqualsTheDotBitForBitAndTheReferenceToRounding) {
    const CpuFeatures cpu = detect_cpu_features();
    int tested = 0;
    for (GgmlType w : test::kDotWeightTypes) {
        const DotKernel ref = select_dot(w, CpuFeatures{});
        for (Isa isa : kAllIsas) {
            if (isa > cpu.best_isa()) continue;
            const CpuFeatures features = limit_to(cpu, isa);
            const GemmKernel k = select_small_batch(w, features);
            if (k.fn == nullptr) continue;
            const DotKernel dot = select_dot(w, features);
            ASSERT_EQ(k.isa, dot.isa) << traits(w).name;
            ASSERT_EQ(k.act_type, dot.act_type) << traits(w).name;
            ++tested;
            for (int n : sizes_for(w)) {
                for (int rows : {1, 5, 17}) {
                    for (int toks : {1, 2, 3, 4, 5, 7, 8, 9, 11, 16, 17}) {
                        for (bool from_floats : {true, false}) {
                            const std::string what = std::string(traits(w).name) + " " + std::string(isa_name(isa)) +
                                                     " n=" + std::to_string(n) + " rows=" + std::to_string(rows) +
                                                     " toks=" + std::to_string(toks) +
                                                     (from_floats ? " quantized floats" : " random blocks");
                            // Padded strides; a padding of 68 bytes (and the start 4 bytes in) moves
                            // float rows off their vector alignment, not off their type's.
                            const size_t w_row = test::bytes_of_row(w, n), a_row = test::bytes_of_row(k.act_type, n);
                            const size_t w_stride = w_row + 68, a_stride = a_row + 36, y_stride = rows + 3;
                            const auto packed =
                                test::weight_rows(w, rows, n, static_cast<uint32_t>(n + rows), from_floats);
                            std::vector<uint8_t> wb(w_stride * rows + 4, 0xCD);
                            uint8_t* w0 = wb.data() + 4;
                            for (int r = 0; r < rows; ++r)
                                std::memcpy(w0 + r * w_stride, packed.data() + r * w_row, w_row);
                            std::vector<uint8_t> ab(a_stride * toks, 0xCD);
                            const auto x =
                                test::gaussian(static_cast<size_t>(toks) * n, static_cast<uint32_t>(toks + 7));
                            for (int t = 0; t < toks; ++t) {
                                quantize_row(k.act_type, x.data() + static_cast<size_t>(t) * n,
                                             ab.data() + t * a_stride, n);
                            }
                            const float sentinel = -12345.0f;
                            std::vector<float> y(y_stride * toks, sentinel);
                            k.fn(n, rows, toks, w0, w_stride, ab.data(), a_stride, y.data(), y_stride);
                            int failures = 0;
                            for (int t = 0; t < toks; ++t) {
                                const auto a_f = test::dequantized(k.act_type, ab.data() + t * a_stride, n);
                                for (size_t r = 0; r < y_stride; ++r) {
                                    const float got = y[t * y_stride + r];
                                    if (r >= static_cast<size_t>(rows)) {
                                        ASSERT_EQ(got, sentinel) << what << " t=" << t << " r=" << r;
                                        continue;
                                    }
                                    const uint8_t* wr = w0 + r * w_stride;
                                    const uint8_t* ar = ab.data() + t * a_stride;
                                    float want = 0, reference = 0;
                                    dot.fn(n, &want, wr, ar);
                                    ref.fn(n, &reference, wr, ar);
                                    const auto w_f = test::dequantized(w, wr, n);
                                    double abs_sum = 0;
                                    for (int i = 0; i < n; ++i) abs_sum += std::fabs(double{w_f[i]} * a_f[i]);
                                    const bool ok = same_bits(got, want) &&
                                                    std::fabs(double{got} - reference) <= 1e-6 * abs_sum + 1e-30;
                                    if (!ok && failures++ < 5) {
                                        ADD_FAILURE() << what << " t=" << t << " r=" << r << ": got " << got
                                                      << ", the dot " << want << ", the reference " << reference;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if (tested == 0) GTEST_SKIP() << "no small-batch kernel on this CPU (" << cpu.describe() << ")";
}

TEST(GemmSmallBatch, NoneWhereTheDotIsScalar) {
    EXPECT_EQ(select_small_batch(GgmlType::Q8_0, CpuFeatures{}).fn, nullptr);
}

// Through ops::matmul, over the thread pool: each token of a batch of 2..8 (F16: up to 16, a draft
// model's check) gets what it gets alone, for every type with a small-batch kernel.
TEST(GemmSmallBatch, MatmulTokensGetTheirSingleTokenResults) {
    const CpuFeatures cpu = host_cpu_features();
    ops::ThreadPool pool(2);
    ops::Scratch scratch;
    int tested = 0;
    for (GgmlType w : test::kDotWeightTypes) {
        if (select_small_batch(w, cpu).fn == nullptr) continue;
        ++tested;
        const int rows = 130, cols = traits(w).block_elements == kQK ? 768 : 320;
        const auto packed = test::weight_rows(w, rows, cols, 3, true);
        const ops::WeightView view{w, rows, cols, packed.data(), 0};
        for (int toks : {2, 4, 5, 8, 9, 16}) {
            if (toks > small_batch_max_tok(w)) continue;  // past the small batches: the tiles
            const auto x = test::gaussian(static_cast<size_t>(toks) * cols, static_cast<uint32_t>(toks));
            std::vector<float> batched(static_cast<size_t>(toks) * rows);
            ops::matmul(view, x.data(), toks, batched.data(), pool, scratch);
            for (int t = 0; t < toks; ++t) {
                std::vector<float> alone(rows);
                ops::matmul(view, x.data() + static_cast<size_t>(t) * cols, 1, alone.data(), pool, scratch);
                for (int r = 0; r < rows; ++r) {
                    ASSERT_TRUE(same_bits(batched[static_cast<size_t>(t) * rows + r], alone[r]))
                        << traits(w).name << " toks=" << toks << " t=" << t << " r=" << r << ": "
                        << batched[static_cast<size_t>(t) * rows + r] << " vs " << alone[r];
                }
            }
        }
    }
    if (tested == 0) GTEST_SKIP() << "no small-batch kernel on this CPU (" << cpu.describe() << ")";
}

}  // namespace
}  // namespace fitllm::quant
