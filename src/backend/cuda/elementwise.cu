// Norms, RoPE and element-wise ops (kernels.h), each the CUDA form of its src/ops function.
#include <cmath>
#include <stdexcept>
#include <string>

#include "backend/cuda/common.cuh"

namespace fitllm::backend::cuda {
namespace {

constexpr int kThreads = 256;

// A block per row; the sum of squares in double, as ops::rms_norm.
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const float* x, const float* weight, float eps, int64_t n, float* y) {
    __shared__ double partial[kThreads / 32];
    const float* xr = x + blockIdx.x * n;
    float* yr = y + blockIdx.x * n;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) sum += static_cast<double>(xr[i]) * xr[i];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    double total = 0.0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
    const float scale = 1.0f / sqrtf(static_cast<float>(total / static_cast<double>(n)) + eps);
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
        yr[i] = weight != nullptr ? xr[i] * scale * weight[i] : xr[i] * scale;
    }
}

// A thread per (token, head, pair); the angle as ops::rope builds it: pos times the running float
// product of theta_ratio, divided by the pair's freq factor, times freq_scale.
// YaRN (ext_factor != 0 or attn_factor != 1) as ops::rope: the scaled angle mixed with the
// unscaled one per pair, cos and sin times mscale.
struct RopeYarn {
    float ext_factor, mscale, corr_low, corr_high;
};

__global__ void rope_kernel(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim, int half,
                            int first_stride, int second_offset, float theta_ratio, float freq_scale,
                            const float* freq_factors, RopeYarn yarn) {
    const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (id >= n_tok * n_head * half) return;
    const int i = static_cast<int>(id % half);
    const int64_t head = id / half;  // t * n_head + h
    const int64_t t = head / n_head;
    float theta = static_cast<float>(pos[t]);
    for (int k = 0; k < i; ++k) theta *= theta_ratio;
    float angle = theta;
    if (freq_factors != nullptr) angle /= freq_factors[i];
    float s, c;
    if (yarn.ext_factor == 0.0f && yarn.mscale == 1.0f) {
        angle *= freq_scale;
        sincosf(angle, &s, &c);
    } else {
        const float extrap = angle;
        angle = freq_scale * extrap;
        if (yarn.ext_factor != 0.0f) {
            const float y = (static_cast<float>(i) - yarn.corr_low) / fmaxf(0.001f, yarn.corr_high - yarn.corr_low);
            const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * yarn.ext_factor;
            angle = angle * (1.0f - mix) + extrap * mix;
        }
        sincosf(angle, &s, &c);
        s *= yarn.mscale;
        c *= yarn.mscale;
    }
    float* p = x + head * head_dim + i * first_stride;
    const float a0 = p[0], b0 = p[second_offset];
    p[0] = a0 * c - b0 * s;
    p[second_offset] = a0 * s + b0 * c;
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* y) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

__global__ void add_bias_kernel(float* x, const float* bias, int64_t total, int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < total) x[i] += bias[i % n];
}

__global__ void scale_kernel(float* x, int64_t n, float factor) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* y) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// ops::swiglu_oai: gpt-oss's clamped SwiGLU, x = min(gate, limit), u = clamp(up, -limit, limit),
// y = x * sigmoid(alpha * x) * (u + 1).
__global__ void swiglu_oai_kernel(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        const float x = fminf(gate[i], limit);
        const float u = fminf(fmaxf(up[i], -limit), limit);
        y[i] = x / (1.0f + expf(alpha * (-x))) * (u + 1.0f);
    }
}

// ops::gelu: 0 at or below -10, x at or above 10, else the tanh formula of x rounded to f16, the
// result rounded to f16 (llama.cpp's f16 table). The formula with the host's one fused
// multiply-add (1 + (0.044715 x) x, ops::gelu_tanh_exact) and no other.
__device__ float gelu_f16_table(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    const float xh = __half2float(__float2half_rn(x));
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    constexpr float kCubic = 0.044715f;
    const float inner = __fmul_rn(__fmul_rn(kSqrt2OverPi, xh), __fmaf_rn(__fmul_rn(kCubic, xh), xh, 1.0f));
    const float g = __fmul_rn(__fmul_rn(0.5f, xh), __fadd_rn(1.0f, tanhf(inner)));
    return __half2float(__float2half_rn(g));
}

__global__ void geglu_kernel(const float* gate, const float* up, int64_t n, float* y) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu_f16_table(gate[i]) * up[i];
}

__global__ void softcap_kernel(float* x, int64_t n, float cap, float inv_cap) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] * inv_cap);
}

void check_count(const char* function, int64_t n) {
    if (n < 0) throw std::invalid_argument(std::string(function) + ": negative count " + std::to_string(n));
}

}  // namespace

void rms_norm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t n, float* y, Stream s) {
    check_count("cuda::rms_norm", n_rows);
    if (n <= 0) throw std::invalid_argument("cuda::rms_norm: row length " + std::to_string(n) + " must be positive");
    if (n_rows == 0) return;
    if (n_rows > 0x7FFFFFFF) throw std::invalid_argument("cuda::rms_norm: too many rows");
    rms_norm_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, as_stream(s)>>>(x, weight, eps, n, y);
    FITLLM_CUDA_LAUNCHED("rms_norm_kernel");
}

void rope(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim, const RopeArgs& args, Stream s) {
    if (args.n_dims <= 0 || args.n_dims % 2 != 0 || args.n_dims > head_dim) {
        throw std::invalid_argument("cuda::rope: n_dims " + std::to_string(args.n_dims) + " must be even and in 1.." +
                                    std::to_string(head_dim) + " (head_dim)");
    }
    check_count("cuda::rope", n_tok);
    if (n_tok == 0 || n_head <= 0) return;
    const int half = args.n_dims / 2;
    // On the host with std::pow, as ops::rope, so the running product starts from the same bits.
    const float theta_ratio = std::pow(args.freq_base, -2.0f / static_cast<float>(args.n_dims));
    const int64_t total = n_tok * n_head * half;
    const float mscale = args.ext_factor != 0.0f ? args.attn_factor * (1.0f + 0.1f * std::log(1.0f / args.freq_scale))
                                                 : args.attn_factor;
    const RopeYarn yarn{args.ext_factor, mscale, args.corr_low, args.corr_high};
    rope_kernel<<<blocks_for(total, kThreads), kThreads, 0, as_stream(s)>>>(
        x, pos, n_tok, n_head, head_dim, half, args.neox ? 1 : 2, args.neox ? half : 1, theta_ratio, args.freq_scale,
        args.freq_factors, yarn);
    FITLLM_CUDA_LAUNCHED("rope_kernel");
}

void add(const float* a, const float* b, int64_t n, float* y, Stream s) {
    check_count("cuda::add", n);
    if (n == 0) return;
    add_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(s)>>>(a, b, n, y);
    FITLLM_CUDA_LAUNCHED("add_kernel");
}

void add_bias(float* x, const float* bias, int64_t n_tok, int64_t n, Stream s) {
    check_count("cuda::add_bias", n_tok);
    check_count("cuda::add_bias", n);
    if (n_tok == 0 || n == 0) return;
    add_bias_kernel<<<blocks_for(n_tok * n, kThreads), kThreads, 0, as_stream(s)>>>(x, bias, n_tok * n, n);
    FITLLM_CUDA_LAUNCHED("add_bias_kernel");
}

void scale(float* x, int64_t n, float factor, Stream s) {
    check_count("cuda::scale", n);
    if (n == 0) return;
    scale_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(s)>>>(x, n, factor);
    FITLLM_CUDA_LAUNCHED("scale_kernel");
}

void swiglu(const float* gate, const float* up, int64_t n, float* y, Stream s) {
    check_count("cuda::swiglu", n);
    if (n == 0) return;
    swiglu_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(s)>>>(gate, up, n, y);
    FITLLM_CUDA_LAUNCHED("swiglu_kernel");
}

void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y, Stream s) {
    check_count("cuda::swiglu_oai", n);
    if (n == 0) return;
    swiglu_oai_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(s)>>>(gate, up, n, alpha, limit, y);
    FITLLM_CUDA_LAUNCHED("swiglu_oai_kernel");
}

void geglu(const float* gate, const float* up, int64_t n, float* y, Stream s) {
    check_count("cuda::geglu", n);
    if (n == 0) return;
    geglu_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(s)>>>(gate, up, n, y);
    FITLLM_CUDA_LAUNCHED("geglu_kernel");
}

void softcap(float* x, int64_t n, float cap, Stream s) {
    check_count("cuda::softcap", n);
    if (n == 0) return;
    softcap_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(s)>>>(x, n, cap, 1.0f / cap);
    FITLLM_CUDA_LAUNCHED("softcap_kernel");
}

}  // namespace fitllm::backend::cuda
