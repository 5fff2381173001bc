#include "ops/rope.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "ops/cpu.h"

namespace fitllm::ops {
namespace {

// The rotation as llama.cpp's CPU build computes it: its compiler contracts x0 * cos - x1 * sin
// and x0 * sin + x1 * cos into one FMA each (the second product rounded, then the fused
// multiply-add), so the results differ from the two-rounding form in the last bit. __builtin_fmaf
// is the instruction where the target has FMA and libm's correctly rounded fmaf otherwise: the same
// bits either way, the first only faster.
[[gnu::always_inline]] inline void rope_impl(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim,
                                             const RopeParams& params) {
    const int half = params.n_dims / 2;
    const float theta_ratio = std::pow(params.freq_base, -2.0f / static_cast<float>(params.n_dims));
    // Pair i is (x[2i], x[2i+1]) in normal mode, (x[i], x[i + half]) in NeoX mode.
    const int first_stride = params.mode == RopeMode::Normal ? 2 : 1;
    const int second_offset = params.mode == RopeMode::Normal ? 1 : half;

    const bool yarn = params.ext_factor != 0.0f;
    const bool scaled = yarn || params.attn_factor != 1.0f;
    // llama.cpp's rope_yarn: mscale grows with the context extension where the mix is on.
    const float mscale =
        yarn ? params.attn_factor * (1.0f + 0.1f * std::log(1.0f / params.freq_scale)) : params.attn_factor;
    for (int64_t t = 0; t < n_tok; ++t) {
        float theta = static_cast<float>(pos[t]);
        for (int i = 0; i < half; ++i) {
            float angle = theta;
            if (params.freq_factors != nullptr) angle /= params.freq_factors[i];
            float c, s;
            if (!scaled) {
                angle *= params.freq_scale;
                c = std::cos(angle);
                s = std::sin(angle);
            } else {
                const float extrap = angle;
                angle = params.freq_scale * extrap;
                if (yarn) {
                    const float y = (static_cast<float>(i) - params.corr_low) /
                                    std::max(0.001f, params.corr_high - params.corr_low);
                    const float mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * params.ext_factor;
                    angle = angle * (1.0f - mix) + extrap * mix;
                }
                c = std::cos(angle) * mscale;
                s = std::sin(angle) * mscale;
            }
            for (int h = 0; h < n_head; ++h) {
                float* head = x + (t * n_head + h) * head_dim;
                float& a = head[i * first_stride];
                float& b = head[i * first_stride + second_offset];
                const float a0 = a;
                const float b0 = b;
                a = __builtin_fmaf(a0, c, -(b0 * s));
                b = __builtin_fmaf(a0, s, b0 * c);
            }
            theta *= theta_ratio;
        }
    }
}

__attribute__((target("fma"))) void rope_fma(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim,
                                             const RopeParams& params) {
    rope_impl(x, pos, n_tok, n_head, head_dim, params);
}

void rope_baseline(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim, const RopeParams& params) {
    rope_impl(x, pos, n_tok, n_head, head_dim, params);
}

}  // namespace

RopeParams rotation_only(RopeParams p) {
    // rope_impl's mscale: attn_factor * (1 + 0.1 ln(1 / freq_scale)) with YaRN, attn_factor without.
    p.attn_factor = p.ext_factor != 0.0f ? 1.0f / (1.0f + 0.1f * std::log(1.0f / p.freq_scale)) : 1.0f;
    return p;
}

void rope(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim, const RopeParams& params) {
    const int n_dims = params.n_dims;
    if (n_dims <= 0 || n_dims % 2 != 0 || n_dims > head_dim) {
        throw std::invalid_argument("rope: n_dims " + std::to_string(n_dims) + " must be even and in 1.." +
                                    std::to_string(head_dim) + " (head_dim)");
    }
    if (cpu().fma) {
        rope_fma(x, pos, n_tok, n_head, head_dim, params);
    } else {
        rope_baseline(x, pos, n_tok, n_head, head_dim, params);
    }
}

void yarn_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float* low,
                    float* high) {
    // The pair whose wavelength 2 pi / theta_i fits n_rot times into n_ctx_orig positions.
    const auto corr_dim = [&](float n_rot) {
        return static_cast<float>(n_dims) *
               std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2.0f * static_cast<float>(M_PI))) /
               (2.0f * std::log(freq_base));
    };
    *low = std::max(0.0f, std::floor(corr_dim(beta_fast)));
    *high = std::min(static_cast<float>(n_dims - 1), std::ceil(corr_dim(beta_slow)));
}

kv::RopeFrame rope_frame(const RopeParams& params, int head_dim) {
    kv::RopeFrame frame;
    const int half = std::min(params.n_dims, head_dim) / 2;
    for (int i = 0; i < half; ++i) {
        frame.first.push_back(params.mode == RopeMode::Normal ? 2 * i : i);
        frame.second.push_back(params.mode == RopeMode::Normal ? 2 * i + 1 : i + half);
        double theta = std::pow(static_cast<double>(params.freq_base), -2.0 * i / params.n_dims);
        if (params.freq_factors != nullptr) theta /= params.freq_factors[i];
        double scale = params.freq_scale;
        if (params.ext_factor != 0.0f) {
            const double y = (i - params.corr_low) / std::max(0.001, double{params.corr_high} - params.corr_low);
            const double mix = (1.0 - std::min(1.0, std::max(0.0, y))) * params.ext_factor;
            scale = scale * (1.0 - mix) + mix;
        }
        frame.theta.push_back(theta * scale);
    }
    return frame;
}

}  // namespace fitllm::ops
