// The KV cache on the device (kernels.h): storing K/V rows into cells and flash-style attention
// over the paged cells, with the host cache's visibility rules (ops::attention_kv).
#include <cmath>
#include <stdexcept>
#include <string>

#include "backend/cuda/common.cuh"

namespace fitllm::backend::cuda {
namespace {

constexpr int kMaxHeadDim = 256;

bool is_power_of_two(int n) {
    return n > 0 && (n & (n - 1)) == 0;
}

// kv::hadamard_transform on n floats of shared memory, by the whole thread block: the same
// butterflies in the same order, then the 1 / sqrt(n) scale, so the bits match the host's.
__device__ void hadamard_shared(float* x, int n, float scale) {
    for (int half = 1; half < n; half *= 2) {
        __syncthreads();
        for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
            const int lo = (p / half) * 2 * half + p % half, hi = lo + half;
            const float a = x[lo], b = x[hi];
            x[lo] = a + b;
            x[hi] = a - b;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] *= scale;
    __syncthreads();
}

// quant::fp32_to_bf16: round to nearest even, NaN made quiet.
__device__ uint16_t to_bf16(float f) {
    const uint32_t x = __float_as_uint(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// A thread block per row: the row into shared memory, shaped and each head rotated when asked,
// then each head written in the layout's type (a thread per block of 32 for the quantized ones).
__global__ void kv_store_kernel(KvLayout layout, float rotate_scale, const float* rows, const int32_t* cells) {
    extern __shared__ float row[];
    const int head_dim = layout.head_dim;
    const int width = layout.n_head_kv * head_dim;
    const float* src = rows + static_cast<int64_t>(blockIdx.x) * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        row[i] = layout.center != nullptr ? (src[i] - layout.center[i]) * layout.scale[i] : src[i];
    }
    if (layout.rotated) {
        for (int h = 0; h < layout.n_head_kv; ++h) hadamard_shared(row + h * head_dim, head_dim, rotate_scale);
    }
    __syncthreads();
    uint8_t* dst = static_cast<uint8_t*>(layout.data) + static_cast<int64_t>(cells[blockIdx.x]) * layout.row_bytes;
    const GgmlType type = layout.type;
    if (const int block_bytes = block32_bytes(type); block_bytes > 0) {
        const int n_blocks = width / 32, blocks_per_head = head_dim / 32;
        for (int blk = threadIdx.x; blk < n_blocks; blk += blockDim.x) {
            const int h = blk / blocks_per_head;
            encode_block32(type, row + 32 * blk, dst + h * layout.head_bytes + (blk % blocks_per_head) * block_bytes);
        }
        return;
    }
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        uint8_t* head = dst + (i / head_dim) * layout.head_bytes;
        const int e = i % head_dim;
        if (type == GgmlType::F32) {
            memcpy(head + 4 * e, &row[i], 4);
        } else {
            const uint16_t v = type == GgmlType::F16 ? __half_as_ushort(__float2half_rn(row[i])) : to_bf16(row[i]);
            memcpy(head + 2 * e, &v, 2);
        }
    }
}

// The inverse, a thread block per row: decoded into shared memory, each head un-rotated (the
// rotation is its own inverse), un-shaped as KeyTransform::undo (a product, then a sum).
__global__ void kv_load_kernel(KvLayout layout, float rotate_scale, const int32_t* cells, float* rows) {
    extern __shared__ float row[];
    const int head_dim = layout.head_dim;
    const int width = layout.n_head_kv * head_dim;
    const uint8_t* src =
        static_cast<const uint8_t*>(layout.data) + static_cast<int64_t>(cells[blockIdx.x]) * layout.row_bytes;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        row[i] = kv_elem(layout.type, src + (i / head_dim) * layout.head_bytes, i % head_dim);
    }
    if (layout.rotated) {
        for (int h = 0; h < layout.n_head_kv; ++h) hadamard_shared(row + h * head_dim, head_dim, rotate_scale);
    }
    __syncthreads();
    float* dst = rows + static_cast<int64_t>(blockIdx.x) * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        dst[i] = layout.inv_scale != nullptr ? add_rn(mul_rn(row[i], layout.inv_scale[i]), layout.center[i]) : row[i];
    }
}

constexpr int kAttnWarps = 4;
constexpr int kPerLane = kMaxHeadDim / 32;

struct AttnParams {
    GgmlType type_k, type_v;
    const uint8_t* k;
    const uint8_t* v;
    size_t k_row_bytes, k_head_bytes, v_row_bytes, v_head_bytes;
    bool rotated_k, rotated_v;
    float rotate_scale;
    KvAttentionArgs a;
};

// A thread block per (query head, token); its warps take turns over chunks of 32 cells of the
// sequence's blocks, find the visible ones with one ballot, and keep an online softmax each (lane l
// holds elements l, l + 32, ... of q and of the V sum); the warps' partial sums merge at the end.
__global__ void __launch_bounds__(kAttnWarps * 32) attention_kernel(const float* q, float* out, AttnParams p) {
    __shared__ float q_s[kMaxHeadDim];
    __shared__ float acc_s[kAttnWarps][kMaxHeadDim];
    __shared__ float m_s[kAttnWarps], l_s[kAttnWarps];
    const KvAttentionArgs& a = p.a;
    const int h = blockIdx.x, t = blockIdx.y;
    const int d = a.head_dim;
    const int g = h / (a.n_head / a.n_head_kv);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float* qh = q + (static_cast<int64_t>(t) * a.n_head + h) * d;
    __shared__ float bias_s;  // soft-capping with centred K: scale * (q . c) back before the cap
    for (int i = threadIdx.x; i < d; i += blockDim.x) q_s[i] = qh[i];
    if (threadIdx.x < 32) {
        float dot = 0.0f;
        if (a.k_center != nullptr && a.softcap > 0.0f) {
            for (int i = threadIdx.x; i < d; i += 32) dot += qh[i] * a.k_center[g * d + i];
        }
        dot = warp_sum(dot);
        if (threadIdx.x == 0) bias_s = dot * a.scale;
    }
    if (a.q_scale != nullptr) {
        __syncthreads();
        for (int i = threadIdx.x; i < d; i += blockDim.x) q_s[i] *= a.q_scale[g * d + i];
    }
    if (p.rotated_k) hadamard_shared(q_s, d, p.rotate_scale);
    __syncthreads();
    const float bias = bias_s;
    float qr[kPerLane], acc[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
        qr[k] = lane + 32 * k < d ? q_s[lane + 32 * k] : 0.0f;
        acc[k] = 0.0f;
    }
    const int32_t seq = a.q_seq[t], q_pos = a.q_pos[t];
    const int32_t b_begin = a.seq_blocks[seq], b_end = a.seq_blocks[seq + 1];
    const int64_t n_cells = static_cast<int64_t>(b_end - b_begin) * a.block_size;
    const uint64_t seq_bit = uint64_t{1} << seq;
    float m = -INFINITY, l = 0.0f;

    for (int64_t chunk = static_cast<int64_t>(warp) * 32; chunk < n_cells; chunk += kAttnWarps * 32) {
        const int64_t i = chunk + lane;
        int32_t cell = -1;
        bool visible = false;
        if (i < n_cells) {
            cell = a.blocks[b_begin + i / a.block_size] * a.block_size + static_cast<int32_t>(i % a.block_size);
            if (cell < a.capacity && (a.cell_seqs[cell] & seq_bit) != 0) {
                const int32_t pos = a.cell_pos[cell];
                visible = pos <= q_pos && (a.sliding_window <= 0 ||
                                           static_cast<int64_t>(pos) > static_cast<int64_t>(q_pos) - a.sliding_window);
            }
        }
        uint32_t ballot = __ballot_sync(0xFFFFFFFFu, visible);
        while (ballot != 0) {
            const int src = __ffs(ballot) - 1;
            ballot &= ballot - 1;
            const int32_t c = __shfl_sync(0xFFFFFFFFu, cell, src);
            const uint8_t* kh = p.k + static_cast<int64_t>(c) * p.k_row_bytes + g * p.k_head_bytes;
            float partial = 0.0f;
#pragma unroll
            for (int k = 0; k < kPerLane; ++k) {
                if (lane + 32 * k < d) partial += qr[k] * kv_elem(p.type_k, kh, lane + 32 * k);
            }
            float s = warp_sum(partial) * a.scale;
            if (a.softcap > 0.0f) s = a.softcap * tanhf((s + bias) / a.softcap);
            if (s > m) {
                const float correction = expf(m - s);  // 0 for the first visible cell
                l *= correction;
#pragma unroll
                for (int k = 0; k < kPerLane; ++k) acc[k] *= correction;
                m = s;
            }
            const float weight = expf(s - m);
            l += weight;
            const uint8_t* vh = p.v + static_cast<int64_t>(c) * p.v_row_bytes + g * p.v_head_bytes;
#pragma unroll
            for (int k = 0; k < kPerLane; ++k) {
                if (lane + 32 * k < d) acc[k] += weight * kv_elem(p.type_v, vh, lane + 32 * k);
            }
        }
    }

    // Merge the warps' (m, l, acc) under the largest m.
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
        if (lane + 32 * k < d) acc_s[warp][lane + 32 * k] = acc[k];
    }
    if (lane == 0) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
    __syncthreads();
    float m_all = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w) m_all = fmaxf(m_all, m_s[w]);
    float l_all = 0.0f, factor[kAttnWarps];
    for (int w = 0; w < kAttnWarps; ++w) {
        factor[w] = m_s[w] == -INFINITY ? 0.0f : expf(m_s[w] - m_all);
        l_all += l_s[w] * factor[w];
    }
    const float inv_l = l_all > 0.0f ? 1.0f / l_all : 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < kAttnWarps; ++w) sum += acc_s[w][i] * factor[w];
        q_s[i] = sum * inv_l;  // q_s is free again
    }
    if (p.rotated_v) hadamard_shared(q_s, d, p.rotate_scale);
    __syncthreads();
    float* oh = out + (static_cast<int64_t>(t) * a.n_head + h) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) oh[i] = q_s[i];
}

size_t head_bytes_of(GgmlType type, int head_dim) {
    const auto bytes = quant::row_bytes(type, static_cast<uint64_t>(head_dim));
    return bytes ? static_cast<size_t>(*bytes) : 0;
}

void check_layout(const char* function, const KvLayout& layout, bool (*supports)(GgmlType)) {
    const std::string f(function);
    if (!supports(layout.type)) {
        throw std::invalid_argument(f + ": K/V type " + std::string(quant::traits(layout.type).name) +
                                    " has no CUDA kernel here");
    }
    if (layout.n_head_kv <= 0 || layout.head_dim <= 0 || layout.head_dim > kMaxHeadDim) {
        throw std::invalid_argument(f + ": " + std::to_string(layout.n_head_kv) + " heads of " +
                                    std::to_string(layout.head_dim) + " values (head size 1.." +
                                    std::to_string(kMaxHeadDim) + ")");
    }
    const size_t head = head_bytes_of(layout.type, layout.head_dim);
    if (head == 0 || layout.head_bytes < head ||
        layout.row_bytes < layout.head_bytes * static_cast<size_t>(layout.n_head_kv - 1) + head) {
        throw std::invalid_argument(f + ": head of " + std::to_string(layout.head_dim) + " " +
                                    std::string(quant::traits(layout.type).name) + " values does not fit head_bytes " +
                                    std::to_string(layout.head_bytes) + " / row_bytes " +
                                    std::to_string(layout.row_bytes));
    }
    if (layout.rotated && !is_power_of_two(layout.head_dim)) {
        throw std::invalid_argument(f + ": a rotated head needs a power-of-two size, not " +
                                    std::to_string(layout.head_dim));
    }
}

}  // namespace

bool kv_store_supports(GgmlType type) {
    return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16 || block32_bytes(type) > 0;
}

bool kv_read_supports(GgmlType type) {
    return kv_store_supports(type);
}

namespace {

// kv_store's and kv_load's checks; the shared memory (a row of floats) of their launch.
size_t check_rows(const char* function, const KvLayout& layout, int64_t n_rows) {
    check_layout(function, layout, kv_store_supports);
    if (n_rows < 0 || n_rows > 0x7FFFFFFF) {
        throw std::invalid_argument(std::string(function) + ": " + std::to_string(n_rows) + " rows");
    }
    if ((layout.center == nullptr) != (layout.scale == nullptr) ||
        (layout.inv_scale != nullptr && layout.center == nullptr)) {
        throw std::invalid_argument(std::string(function) + ": a K transform needs its centre and its scales");
    }
    const size_t shared = static_cast<size_t>(layout.n_head_kv) * layout.head_dim * sizeof(float);
    if (shared > 48 * 1024) {
        throw std::invalid_argument(std::string(function) + ": a row of " +
                                    std::to_string(layout.n_head_kv * layout.head_dim) +
                                    " values is more than one thread block's 48 KiB of shared memory");
    }
    return shared;
}

}  // namespace

void kv_store(const KvLayout& layout, const float* rows, const int32_t* cells, int64_t n_rows, Stream s) {
    const size_t shared = check_rows("cuda::kv_store", layout, n_rows);
    if (n_rows == 0) return;
    kv_store_kernel<<<static_cast<unsigned>(n_rows), 256, shared, as_stream(s)>>>(
        layout, 1.0f / std::sqrt(static_cast<float>(layout.head_dim)), rows, cells);
    FITLLM_CUDA_LAUNCHED("kv_store_kernel");
}

void kv_load(const KvLayout& layout, const int32_t* cells, int64_t n_rows, float* rows, Stream s) {
    const size_t shared = check_rows("cuda::kv_load", layout, n_rows);
    if (n_rows == 0) return;
    if (layout.center != nullptr && layout.inv_scale == nullptr) {
        throw std::invalid_argument("cuda::kv_load: a shaped K needs inv_scale to be read back");
    }
    kv_load_kernel<<<static_cast<unsigned>(n_rows), 256, shared, as_stream(s)>>>(
        layout, 1.0f / std::sqrt(static_cast<float>(layout.head_dim)), cells, rows);
    FITLLM_CUDA_LAUNCHED("kv_load_kernel");
}

void encode_row_on_host(GgmlType type, const float* x, int64_t n, void* out) {
    const int block_bytes = block32_bytes(type);
    if (block_bytes == 0 || n % 32 != 0) {
        throw std::invalid_argument("cuda::encode_row_on_host: no block encoder for " +
                                    std::string(quant::traits(type).name) + " (or " + std::to_string(n) +
                                    " values, not whole blocks of 32)");
    }
    auto* bytes = static_cast<uint8_t*>(out);
    for (int64_t b = 0; b < n / 32; ++b) encode_block32(type, x + 32 * b, bytes + b * block_bytes);
}

void attention_kv(const float* q, int64_t n_tok, const KvLayout& k, const KvLayout& v, const KvAttentionArgs& args,
                  float* out, Stream s) {
    check_layout("cuda::attention_kv (K)", k, kv_read_supports);
    check_layout("cuda::attention_kv (V)", v, kv_read_supports);
    if (args.n_head <= 0 || args.n_head_kv <= 0 || args.n_head % args.n_head_kv != 0 || k.n_head_kv != args.n_head_kv ||
        v.n_head_kv != args.n_head_kv || k.head_dim != args.head_dim || v.head_dim != args.head_dim) {
        throw std::invalid_argument("cuda::attention_kv: " + std::to_string(args.n_head) + " query heads over " +
                                    std::to_string(args.n_head_kv) + " kv heads of " + std::to_string(args.head_dim) +
                                    " values do not match the layer's K (" + std::to_string(k.n_head_kv) + " x " +
                                    std::to_string(k.head_dim) + ") and V (" + std::to_string(v.n_head_kv) + " x " +
                                    std::to_string(v.head_dim) + ")");
    }
    if (args.block_size <= 0 || args.capacity <= 0) {
        throw std::invalid_argument("cuda::attention_kv: block size " + std::to_string(args.block_size) +
                                    " and capacity " + std::to_string(args.capacity) + " must be positive");
    }
    if (n_tok < 0 || n_tok > 65535) {
        throw std::invalid_argument("cuda::attention_kv: " + std::to_string(n_tok) + " tokens (at most 65535 a call)");
    }
    if (n_tok == 0) return;
    AttnParams p{};
    p.type_k = k.type;
    p.type_v = v.type;
    p.k = static_cast<const uint8_t*>(k.data);
    p.v = static_cast<const uint8_t*>(v.data);
    p.k_row_bytes = k.row_bytes;
    p.k_head_bytes = k.head_bytes;
    p.v_row_bytes = v.row_bytes;
    p.v_head_bytes = v.head_bytes;
    p.rotated_k = k.rotated;
    p.rotated_v = v.rotated;
    p.rotate_scale = 1.0f / std::sqrt(static_cast<float>(args.head_dim));
    p.a = args;
    const dim3 grid(static_cast<unsigned>(args.n_head), static_cast<unsigned>(n_tok));
    attention_kernel<<<grid, kAttnWarps * 32, 0, as_stream(s)>>>(q, out, p);
    FITLLM_CUDA_LAUNCHED("attention_kernel");
}

}  // namespace fitllm::backend::cuda
