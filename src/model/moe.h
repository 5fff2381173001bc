#pragma once
// A mixture-of-experts feed-forward block (Qwen3-MoE; llama.cpp's build_moe_ffn with softmax
// gating): a router scores the n_expert experts of the layer for each token, the n_expert_used
// best are run, and their outputs are summed with the router's weights. gpt-oss
// (Hparams::gpt_oss_experts) instead takes the k largest scores (plus the router bias), weighs them
// by a softmax over those k, and runs down(swiglu_oai(gate h + b, up h + b)) + b per expert.
//
//   probs   = softmax(router · h)                         [n_expert] per token (router_softmax)
//   chosen  = the k largest probs, best first              (k = n_expert_used)
//   weights = probs[chosen] / sum(probs[chosen])           (times expert_weights_scale, if set)
//   out     = sum over rank r of weights[r] * down_e(silu(gate_e · h) * up_e · h),  e = chosen[r]
//
// A slice of tokens is grouped by expert: each expert's tokens go through its three matrices as
// one batch (the tiled kernels for many, matrix-vector for one), in the single-token arithmetic
// that llama.cpp's mul_mat_id uses on the CPU. Runs on the host. Internal to model/.
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "model/activations.h"
#include "model/expert_cache.h"
#include "model/hparams.h"
#include "ops/matmul.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"
#include "ops/weight_view.h"

namespace fitllm::model {

// The most experts a layer may have, and a token may use (llama.cpp's LLAMA_MAX_EXPERTS is 512).
inline constexpr int kMaxExperts = 512;
inline constexpr int kMaxExpertsUsed = 64;

// One layer's routed experts: each of the three expert tensors is seen as one matrix of the
// experts' matrices stacked (TensorBinder::experts). gpt-oss has biases: the router's, and one
// vector per expert for each matrix (expert e's at e * its rows), nullptr elsewhere.
struct MoeWeights {
    ops::WeightView router;              // [n_expert, n_embd]
    ops::WeightView gate_exps;           // n_expert x [n_ff_exp, n_embd]
    ops::WeightView up_exps;             // n_expert x [n_ff_exp, n_embd]
    ops::WeightView down_exps;           // n_expert x [n_embd, n_ff_exp]
    const float* router_b = nullptr;     // [n_expert]
    const float* gate_exps_b = nullptr;  // [n_expert, n_ff_exp]
    const float* up_exps_b = nullptr;    // [n_expert, n_ff_exp]
    const float* down_exps_b = nullptr;  // [n_expert, n_embd]
};

// gpt-oss's SwiGLU constants (llama.cpp's build_moe_ffn, LLM_FFN_SWIGLU_OAI_MOE; not in the file).
inline constexpr float kSwigluOaiAlpha = 1.702f;
inline constexpr float kSwigluOaiLimit = 7.0f;

// Expert e's matrix of `rows` rows in a stacked view.
inline ops::WeightView expert_matrix(const ops::WeightView& stacked, int e, int64_t rows) {
    ops::WeightView w = stacked;
    w.rows = rows;
    w.data = stacked.row(int64_t{e} * rows);
    return w;
}

// The router's probabilities from its scores (n of them), in place: a softmax as llama.cpp's CPU
// backend computes a row with AVX-512 (ggml_vec_soft_max_f32): exp as ops::exp_ggml_simd in
// groups of 16 whose sum is reduced as _mm512_reduce_add_ps does, std::exp for the last n % 16,
// the sum in double, then each value times 1 / sum. Routing turns a last-bit difference into
// another expert now and then, so the bits matter.
void router_softmax(float* p, int n);

// The k experts of one token's probabilities (n of them), best first (the lower index first
// among equals), and their weights: the probabilities normalized to sum 1 (the sum clamped
// below at 2^-14 as llama.cpp does; normalize false, qwen2moe: the probabilities as they are),
// then scaled by `scale` unless it is 0 or 1.
void route_token(const float* probs, int n, int k, float scale, int32_t* chosen, float* weights, bool normalize = true);

// The routing of moe_ffn: the router's scores of h [m, n_embd] (host), the k experts of each token
// and their weights, in work (l.ids, l.weights; l.probs used on the way).
void moe_route(const Hparams& hp, const MoeWeights& w, const float* h, int m, float* work, const MoeLayout& l,
               std::span<const ops::TokenPlace> places, ops::ThreadPool& pool, ops::Scratch& scratch);

// The block over m tokens (m <= the layout's slice): h [m, n_embd] holds the normed input and
// receives the output. work: the activations' work buffer, laid out as `l` says. places: the
// tokens' places for the router's matmul (empty: single-token order).
// experts: an expert cache (model/expert_cache.h) that gives layer il's experts' matrices
// instead of w's mapped ones (the same bytes, read into its slots); nullptr: w's.
void moe_ffn(const Hparams& hp, const MoeWeights& w, float* h, int m, float* work, const MoeLayout& l,
             std::span<const ops::TokenPlace> places, ops::ThreadPool& pool, ops::Scratch& scratch,
             ExpertCache* experts = nullptr, int il = 0);

// A device's buffers for an offloaded layer's routed experts over a slice of s tokens
// (DeviceActivations; model::device_scratch_bytes): in [s, n_embd], gate and up [s, n_ff_exp],
// outs [k, s, n_embd] (each rank's weighted outputs, k = n_expert_used).
struct DeviceMoeBuffers {
    float* in = nullptr;
    float* gate = nullptr;
    float* up = nullptr;
    float* outs = nullptr;
};

// The routed experts of an offloaded layer on its device, after moe_route() chose them on the host:
// h [m, n_embd] on the device holds the normed input and receives the weighted sum; w's expert
// tensors (and gpt-oss's expert biases) are the device's copies. Per expert that a token chose:
// its tokens' rows gathered, the matmuls on its slice of the 3-D tensors, the activation, each row
// times its weight; then the ranks summed per token, in moe_ffn's order (the virtual device gives
// its bits). work: the host's, with moe_route()'s results (l.rows used on the way).
void moe_experts_on_device(backend::Backend& dev, const Hparams& hp, const MoeWeights& w, float* h, int m, float* work,
                           const MoeLayout& l, const DeviceMoeBuffers& b);

}  // namespace fitllm::model
