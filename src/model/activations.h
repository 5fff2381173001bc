#pragma once
// How the decoder-only forward passes (llama.cpp, gemma.cpp, phi3.cpp) lay out a batch's activations in
// host memory (model/decoder.h Activations), so that memory::plan reserves what a pass holds.
//
// Three buffers, most of them reused from one step of a layer to the next:
//   x     [n, n_embd]                 the residual stream
//   cur   [n, max(n_embd, attn)]      the normed x; then attention's output; then the FFN's output
//   work  the attention block: q [n, q], k [n, k], v [n, v] side by side, then the output
//         projection [n, n_embd] where q was (k and v are in the cache by then); the FFN block:
//         gate and up [slice, n_ff] each, for one slice of the batch's tokens at a time; a
//         mixture-of-experts block (hp.is_moe(): no dense gate and up) the MoeLayout's buffers.
// (q, k, v, attn: n_head * head_dim, n_head_kv * head_dim, n_head_kv * head_dim_v,
// n_head * head_dim_v floats per token.)
#include <algorithm>
#include <cstdint>

#include "model/hparams.h"

namespace fitllm::model {

// The feed-forward block runs over a batch in slices of at most this many tokens, so that its
// gate and up rows (2 x n_ff floats per token, the widest activations) take a slice's room, not a
// batch's. The price: the tiled matmul kernels unpack each weight tile once per slice, so a
// 512-token batch runs ~4% slower than with 256-token slices (single thread, llama-156m Q8_0),
// which would hold 2.25 MiB more for that model.
inline constexpr int kFfnSliceTokens = 128;

// Tokens per FFN slice of a batch of n: n when it is at most kFfnSliceTokens, else equal slices
// (the last one shorter by less than their number), none short enough to leave the tiled kernels.
inline int ffn_slice_tokens(int n) {
    if (n <= kFfnSliceTokens) return std::max(n, 1);
    const int n_slices = (n + kFfnSliceTokens - 1) / kFfnSliceTokens;
    return (n + n_slices - 1) / n_slices;
}

// A mixture-of-experts FFN block's buffers in work for a slice of s tokens (model/moe.h), as
// offsets in floats: the router's probabilities [s, n_expert]; each token's chosen experts [s, k]
// (their ids as float values, exact below 2^24) and their weights [s, k]; the rows routed to one
// expert [s] (token * k + rank, as float values); the expert's input rows [s, n_embd] (then its
// output rows); its gate and up [s, n_ff_exp] each; every chosen expert's weighted output
// [s, k, n_embd], summed per token in rank order as llama.cpp sums them. k = n_expert_used.
// With a shared expert (qwen2moe, hp.n_ff_shexp > 0), which runs first: its gate and up
// [s, n_ff_shexp] each from the start (over the routed experts' buffers, free then), then its
// output [s, n_embd] and gate values [s] past both (they wait for the routed experts' sum).
struct MoeLayout {
    uint64_t probs = 0, ids = 0, weights = 0, rows = 0, in = 0, gate = 0, up = 0, outs = 0;
    uint64_t sh_gate = 0, sh_up = 0, sh_out = 0, sh_w = 0;
    uint64_t floats = 0;  // all of them
};

inline MoeLayout moe_layout(const Hparams& hp, uint64_t slice) {
    const auto k = static_cast<uint64_t>(hp.n_expert_used);
    MoeLayout m;
    m.ids = slice * uint64_t(hp.n_expert);
    m.weights = m.ids + slice * k;
    m.rows = m.weights + slice * k;
    m.in = m.rows + slice;
    m.gate = m.in + slice * uint64_t(hp.n_embd);
    m.up = m.gate + slice * uint64_t(hp.n_ff_exp);
    m.outs = m.up + slice * uint64_t(hp.n_ff_exp);
    m.floats = m.outs + slice * k * uint64_t(hp.n_embd);
    if (hp.n_ff_shexp > 0) {
        m.sh_up = slice * uint64_t(hp.n_ff_shexp);
        m.sh_out = std::max(m.floats, 2 * m.sh_up);
        m.sh_w = m.sh_out + slice * uint64_t(hp.n_embd);
        m.floats = m.sh_w + slice;
    }
    return m;
}

// Floats of each buffer for a batch of n tokens, and where q, k, v, gate and up start in work.
struct ActivationLayout {
    uint64_t x = 0, cur = 0, work = 0;
    uint64_t k_offset = 0, v_offset = 0, up_offset = 0;  // in work; q, the output projection and gate at 0
    int ffn_slice = 0;                                   // tokens per FFN slice
    MoeLayout moe;                                       // in work, for a slice (mixture of experts)

    uint64_t floats() const { return x + cur + work; }
};

inline ActivationLayout activation_layout(const Hparams& hp, int n_tok) {
    const auto n = static_cast<uint64_t>(std::max(n_tok, 0));
    const auto E = static_cast<uint64_t>(hp.n_embd);
    const uint64_t q = uint64_t(hp.n_head) * uint64_t(hp.head_dim);
    const uint64_t k = uint64_t(hp.n_head_kv) * uint64_t(hp.head_dim);
    const uint64_t v = uint64_t(hp.n_head_kv) * uint64_t(hp.head_dim_v);
    const uint64_t attn = uint64_t(hp.n_head) * uint64_t(hp.head_dim_v);
    ActivationLayout l;
    l.ffn_slice = ffn_slice_tokens(n_tok);
    const auto slice = static_cast<uint64_t>(std::min(l.ffn_slice, n_tok < 0 ? 0 : n_tok));
    l.x = n * E;
    l.cur = n * std::max(E, attn);
    l.k_offset = n * q;
    l.v_offset = n * (q + k);
    if (hp.is_moe()) {
        l.moe = moe_layout(hp, slice);
        l.work = std::max(n * std::max(q + k + v, E), l.moe.floats);
        return l;
    }
    l.work = std::max(n * std::max(q + k + v, E), 2 * slice * uint64_t(hp.n_ff));
    l.up_offset = slice * uint64_t(hp.n_ff);
    return l;
}

}  // namespace fitllm::model
