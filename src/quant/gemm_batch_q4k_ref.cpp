// The scalar reference of the batch order of Q4_K and Q2_K (see gemm_batch_q4k.h): the definition
// of its arithmetic, in the style of dot_ref.cpp. Compiled for the baseline ISA.
#include <cmath>

#include "quant/blocks.h"
#include "quant/gemm_batch_q4k.h"

namespace fitllm::quant::detail {
namespace {

template <typename T>
const T* as(const void* p) {
    return static_cast<const T*>(p);
}

// The integer sums of one chunk of a super-block: sum scale_j q y over its elements and
// sum min_j sum(y) over its sub-blocks (y's bsums not trusted: recomputed from the quants).
struct ChunkSums {
    int scaled = 0;
    int mins = 0;
};

template <typename Block>
ChunkSums sub_block_sums(const Block& x, const BlockQ8_K& y, int begin, int len, int scale, int min) {
    ChunkSums s;
    int y_sum = 0;
    for (int e = begin; e < begin + len; ++e) {
        s.scaled += scale * quant_of(x, e) * y.qs[e];
        y_sum += y.qs[e];
    }
    s.mins = min * y_sum;
    return s;
}

// Q4_K: 4 chunks of 64, each the sub-blocks 2c and 2c + 1 of 32.
struct Q4K {
    using Block = BlockQ4_K;
    static constexpr int kChunks = 4;
    static ChunkSums chunk(const BlockQ4_K& x, const BlockQ8_K& y, int c) {
        const KScalesMins sm = unpack_q4k_scales(x.scales);
        ChunkSums r;
        for (int j = 2 * c; j < 2 * c + 2; ++j) {
            const ChunkSums s = sub_block_sums(x, y, 32 * j, 32, sm.scales[j], sm.mins[j]);
            r.scaled += s.scaled;
            r.mins += s.mins;
        }
        return r;
    }
};

// Q2_K: 2 chunks of 128, each the sub-blocks 8c .. 8c + 7 of 16.
struct Q2K {
    using Block = BlockQ2_K;
    static constexpr int kChunks = 2;
    static ChunkSums chunk(const BlockQ2_K& x, const BlockQ8_K& y, int c) {
        ChunkSums r;
        for (int j = 8 * c; j < 8 * c + 8; ++j) {
            const ChunkSums s = sub_block_sums(x, y, 16 * j, 16, x.scales[j] & 0x0F, x.scales[j] >> 4);
            r.scaled += s.scaled;
            r.mins += s.mins;
        }
        return r;
    }
};

template <typename K>
float dot_batch_order(int n, const void* w, const void* a) {
    const auto* x = as<typename K::Block>(w);
    const auto* y = as<BlockQ8_K>(a);
    float acc = 0.0f, acc_mins = 0.0f;
    for (int i = 0; i < n / kQK; ++i) {
        const float d = fp16_to_fp32(x[i].d) * y[i].d;
        const float dmin = fp16_to_fp32(x[i].dmin) * y[i].d;
        for (int c = 0; c < K::kChunks; ++c) {
            const ChunkSums s = K::chunk(x[i], y[i], c);
            acc = std::fma(static_cast<float>(s.scaled), d, acc);
            acc_mins = std::fma(static_cast<float>(s.mins), dmin, acc_mins);
        }
    }
    return acc - acc_mins;
}

template <typename K>
void gemm(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride, float* y,
          size_t y_stride) {
    const auto* wb = as<uint8_t>(w);
    const auto* ab = as<uint8_t>(act);
    for (int t = 0; t < n_tok; ++t) {
        for (int r = 0; r < n_rows; ++r) {
            y[static_cast<size_t>(t) * y_stride + r] =
                dot_batch_order<K>(n, wb + static_cast<size_t>(r) * w_stride, ab + static_cast<size_t>(t) * act_stride);
        }
    }
}

// llama.cpp's rule (repack.cpp: ggml_repack_get_optimal_repack_type, forward_mul_mat_one_chunk),
// asked of the token's run (its sequence's tokens in the batch) as select_batch_order_gemm does:
// for a batch of one sequence (a prompt) the two are the same.
bool repacked_applies(int64_t weight_rows, int64_t /*weight_cols*/, int32_t run_len, int32_t run_pos) {
    return weight_rows % 8 == 0 && run_pos < run_len - run_len % 4;
}

}  // namespace

BatchOrderGemm repacked_batch_order(GgmlType weight_type, const CpuFeatures& features) {
    const Isa best = features.best_isa();
    GemmKernel k;
    if (best >= Isa::Avx512) {
        k = gemm_batch_q4k_avx512(weight_type, best >= Isa::Avx512Vnni);
    } else if (best >= Isa::Avx2) {
        k = gemm_batch_q4k_avx2(weight_type);  // Q4_K only: llama.cpp repacks Q2_K on AVX-512 CPUs
    }
    if (k.fn == nullptr) return {};
    BatchOrderGemm b;
    b.kernel = k;
    b.applies = repacked_applies;
    return b;
}

GemmFn gemm_batch_q4k_ref(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q4_K:
            return gemm<Q4K>;
        case GgmlType::Q2_K:
            return gemm<Q2K>;
        default:
            return nullptr;
    }
}

}  // namespace fitllm::quant::detail
