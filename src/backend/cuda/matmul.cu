// Dequantizing matrix products (kernels.h: matmul). One kernel pair per weight type, both built on
// Decoder<T>::decode8 (common.cuh), so each type's layout is written once.
#include <stdexcept>
#include <string>

#include "backend/cuda/common.cuh"

namespace fitllm::backend::cuda {
namespace {

// Matrix-vector (decode and small batches): a warp per weight row; lane l decodes elements
// 8 l .. 8 l + 7 of each 256-value stretch, so a warp reads a k-quant super-block (or 8 legacy
// blocks) as one contiguous run, and every decoded weight is used for all tokens.
constexpr int kVecMaxTokens = 8;
constexpr int kVecWarps = 4;  // rows per thread block

template <GgmlType T>
__global__ void __launch_bounds__(kVecWarps * 32)
    matvec_kernel(const uint8_t* w, int64_t rows, int64_t cols, size_t stride, const float* x, int n_tok, float* y) {
    const int lane = threadIdx.x % 32;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kVecWarps + threadIdx.x / 32;
    if (r >= rows) return;
    const uint8_t* row = w + r * stride;
    float acc[kVecMaxTokens] = {};
    for (int64_t e = 8 * lane; e < cols; e += 256) {
        float wv[8];
        decode8_of_row<T>(row, e, wv);
#pragma unroll
        for (int t = 0; t < kVecMaxTokens; ++t) {
            if (t < n_tok) {
                const float* xt = x + t * cols + e;
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[t] += wv[i] * xt[i];
            }
        }
    }
#pragma unroll
    for (int t = 0; t < kVecMaxTokens; ++t) {
        if (t < n_tok) {
            const float sum = warp_sum(acc[t]);
            if (lane == 0) y[t * rows + r] = sum;
        }
    }
}

// Matrix-matrix (prompts): a thread block computes 64 rows x 64 tokens, walking the columns 32 at
// a time; each of its 256 threads decodes 8 weights and loads 8 activations of the step into
// shared memory, then accumulates a 4 x 4 patch of the output.
constexpr int kTileRows = 64, kTileToks = 64, kTileK = 32, kTileThreads = 256;

template <GgmlType T>
__global__ void __launch_bounds__(kTileThreads)
    matmul_tiled_kernel(const uint8_t* w, int64_t rows, int64_t cols, size_t stride, const float* x, int64_t n_tok,
                        float* y) {
    __shared__ float ws[kTileK][kTileRows + 1];
    __shared__ float xs[kTileK][kTileToks + 1];
    const int tid = threadIdx.x;
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
    const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTileToks;
    const int load_row = tid / 4, load_col = (tid % 4) * 8;  // what this thread loads per step
    const int64_t w_row = r0 + load_row, x_tok = t0 + load_row;
    const uint8_t* w_ptr = w_row < rows ? w + w_row * stride : nullptr;
    const float* x_ptr = x_tok < n_tok ? x + x_tok * cols : nullptr;
    const int ty = tid / 16, tx = tid % 16;  // this thread's output patch: rows 4 ty.., tokens 4 tx..
    float acc[4][4] = {};

    for (int64_t k0 = 0; k0 < cols; k0 += kTileK) {
        float v[8];
        if (w_ptr != nullptr) {
            decode8_of_row<T>(w_ptr, k0 + load_col, v);
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) ws[load_col + i][load_row] = v[i];
#pragma unroll
        for (int i = 0; i < 8; ++i) xs[load_col + i][load_row] = x_ptr != nullptr ? x_ptr[k0 + load_col + i] : 0.0f;
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < kTileK; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = ws[k][4 * ty + i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = xs[k][4 * tx + j];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int64_t t = t0 + 4 * tx + j;
        if (t >= n_tok) continue;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int64_t r = r0 + 4 * ty + i;
            if (r < rows) y[t * rows + r] = acc[i][j];
        }
    }
}

}  // namespace

bool matmul_supports(GgmlType type) {
    return dispatch_type(type, [](auto) {});
}

void matmul(GgmlType type, const void* w, int64_t rows, int64_t cols, size_t row_stride, const float* x, int64_t n_tok,
            float* y, Stream s) {
    if (!matmul_supports(type)) {
        throw std::invalid_argument("cuda::matmul: weight type " + std::string(quant::traits(type).name) +
                                    " has no CUDA kernel");
    }
    const auto packed = quant::row_bytes(type, static_cast<uint64_t>(cols));
    if (cols <= 0 || cols % 8 != 0 || !packed) {
        throw std::invalid_argument("cuda::matmul: a row of " + std::to_string(cols) + " " +
                                    std::string(quant::traits(type).name) +
                                    " values is not whole blocks (and a multiple of 8)");
    }
    const size_t stride = row_stride != 0 ? row_stride : static_cast<size_t>(*packed);
    if (stride < *packed) {
        throw std::invalid_argument("cuda::matmul: row stride " + std::to_string(stride) + " is below the row's " +
                                    std::to_string(*packed) + " bytes");
    }
    if (rows <= 0 || n_tok <= 0) return;
    const auto* wb = static_cast<const uint8_t*>(w);
    const cudaStream_t stream = as_stream(s);
    dispatch_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        if (n_tok > kVecMaxTokens && cols % kTileK == 0) {
            const dim3 grid(blocks_for(rows, kTileRows), blocks_for(n_tok, kTileToks));
            matmul_tiled_kernel<T><<<grid, kTileThreads, 0, stream>>>(wb, rows, cols, stride, x, n_tok, y);
            FITLLM_CUDA_LAUNCHED("matmul_tiled_kernel");
            return;
        }
        for (int64_t t = 0; t < n_tok; t += kVecMaxTokens) {
            const int n = static_cast<int>(n_tok - t < kVecMaxTokens ? n_tok - t : kVecMaxTokens);
            matvec_kernel<T><<<blocks_for(rows, kVecWarps), kVecWarps * 32, 0, stream>>>(wb, rows, cols, stride,
                                                                                         x + t * cols, n, y + t * rows);
            FITLLM_CUDA_LAUNCHED("matvec_kernel");
        }
    });
}

void decode_row_on_host(GgmlType type, const void* row, int64_t n, float* out) {
    const auto* bytes = static_cast<const uint8_t*>(row);
    const bool done = dispatch_type(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        for (int64_t e = 0; e + 8 <= n; e += 8) decode8_of_row<T>(bytes, e, out + e);
    });
    if (done) return;
    if (!kv_read_supports(type)) {
        throw std::invalid_argument("cuda::decode_row_on_host: no decoding for " +
                                    std::string(quant::traits(type).name));
    }
    for (int64_t e = 0; e < n; ++e) out[e] = kv_elem(type, bytes, static_cast<int>(e));
}

}  // namespace fitllm::backend::cuda
