#pragma once
// A tiny random Llama, Qwen2, Qwen3 or Qwen3-MoE model in memory (F32 weights), and a naive
// reference forward pass over it in plain double-precision loops, written from the papers' formulas
// rather than from fitllm's ops: 2 layers, n_embd 32, 4 query heads sharing 2 KV heads of 8 dims
// (or head_dim), n_ff 48 (or expert_count experts of 16 hidden units), vocabulary 40.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "quant/ggml_type.h"

namespace fitllm::test {

struct TinyLlamaOptions {
    std::string arch = "llama";   // "llama", "qwen2", "qwen3" or "qwen3moe"
    bool tied = false;            // no output.weight: the output reuses token_embd
    bool rope_freqs = false;      // llama: write rope_freqs.weight (Llama 3.1 frequency factors)
    int64_t rope_freqs_size = 0;  // > 0: the number of values written for rope_freqs.weight
    bool qkv_bias = false;        // write blk.*.attn_{q,k,v}.bias (qwen2 needs them)
    float rope_scale = 0.0f;      // > 0: rope.scaling.type "linear" with this factor
    std::string scaling_type;     // non-empty: written as rope.scaling.type instead ("yarn": YaRN)
    int yarn_orig_ctx = 0;        // > 0: written as rope.scaling.original_context_length
    int n_rot = 0;                // > 0: written as rope.dimension_count
    int64_t k_bias_size = 16;     // the shape written for blk.*.attn_k.bias
    std::string skip;             // a tensor to leave out
    std::string extra;            // an extra F32 tensor of 4 values to write (e.g. blk.0.ffn_up.bias)
    bool with_vocab = false;      // write an SPM vocabulary of 40 tokens (for the CLI)
    uint32_t expert_count = 0;    // > 0: written as <arch>.expert_count
    uint32_t expert_used = 0;     // > 0: experts instead of the dense FFN (qwen3moe, llama: Mixtral), per token
    int64_t expert_ff = 0;        // > 0: the experts' tensors have this many hidden units, not kTinyFfExp
    bool qk_norm = false;         // write blk.*.attn_{q,k}_norm.weight (qwen3 needs them)
    int head_dim = 0;             // > 0: written as attention.key_length / value_length
    quant::GgmlType ffn_up_type = quant::GgmlType::F32;  // another type: ffn_up.weight's bytes are random
};

inline int64_t tiny_head_dim(const TinyLlamaOptions& o);

inline constexpr int64_t kTinyEmbd = 32, kTinyHeads = 4, kTinyHeadsKv = 2, kTinyHeadDim = 8, kTinyFf = 48,
                         kTinyVocab = 40, kTinyLayers = 2;
inline constexpr int64_t kTinyFfExp = 16;  // hidden units per expert
inline constexpr float kTinyRopeBase = 10000.0f;
inline constexpr float kTinyEps = 1e-5f;

inline std::vector<std::byte> tiny_llama_bytes(const TinyLlamaOptions& o = {}) {
    gguf::GgufWriter w;
    w.add_string("general.architecture", o.arch);
    const std::string p = o.arch + ".";
    w.add<uint32_t>(p + "block_count", kTinyLayers);
    w.add<uint32_t>(p + "embedding_length", kTinyEmbd);
    // Mixtral ("llama" with experts): its experts are feed_forward_length wide.
    w.add<uint32_t>(p + "feed_forward_length", o.arch == "llama" && o.expert_used > 0 ? kTinyFfExp : kTinyFf);
    w.add<uint32_t>(p + "context_length", 128);
    w.add<uint32_t>(p + "attention.head_count", kTinyHeads);
    w.add<uint32_t>(p + "attention.head_count_kv", kTinyHeadsKv);
    w.add<float>(p + "attention.layer_norm_rms_epsilon", kTinyEps);
    w.add<float>(p + "rope.freq_base", kTinyRopeBase);
    if (o.n_rot > 0) w.add<uint32_t>(p + "rope.dimension_count", static_cast<uint32_t>(o.n_rot));
    if (o.head_dim > 0) {
        w.add<uint32_t>(p + "attention.key_length", static_cast<uint32_t>(o.head_dim));
        w.add<uint32_t>(p + "attention.value_length", static_cast<uint32_t>(o.head_dim));
    }
    if (o.rope_scale > 0.0f || !o.scaling_type.empty()) {
        w.add_string(p + "rope.scaling.type", o.scaling_type.empty() ? "linear" : o.scaling_type);
    }
    if (o.rope_scale > 0.0f) w.add<float>(p + "rope.scaling.factor", o.rope_scale);
    if (o.yarn_orig_ctx > 0) w.add<uint32_t>(p + "rope.scaling.original_context_length", o.yarn_orig_ctx);
    if (o.expert_count > 0) w.add<uint32_t>(p + "expert_count", o.expert_count);
    if (o.expert_used > 0) {
        w.add<uint32_t>(p + "expert_used_count", o.expert_used);
        w.add<uint32_t>(p + "expert_feed_forward_length", kTinyFfExp);
    }
    if (o.with_vocab) {
        std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
        std::vector<float> scores = {0, 0, 0};
        std::vector<int32_t> types = {2, 3, 3};
        for (int i = 3; i < kTinyVocab; ++i) {
            const char c = static_cast<char>('a' + (i - 3) % 26);
            tokens.push_back(i - 3 < 26 ? std::string("\xE2\x96\x81") + c : std::string(1, c));
            scores.push_back(-static_cast<float>(i));
            types.push_back(1);
        }
        w.add_string("tokenizer.ggml.model", "llama");
        w.add_string_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
        w.add_array<float>("tokenizer.ggml.scores", scores);
        w.add_array<int32_t>("tokenizer.ggml.token_type", types);
        w.add<uint32_t>("tokenizer.ggml.bos_token_id", 1);
        w.add<uint32_t>("tokenizer.ggml.eos_token_id", 2);
    }

    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    const auto tensor = [&](const std::string& name, std::vector<int64_t> dims, float base) {
        if (name == o.skip) return;
        int64_t n = 1;
        for (const int64_t d : dims) n *= d;
        std::vector<float> values(static_cast<size_t>(n));
        for (float& v : values) v = base + normal(rng);
        std::vector<std::byte> bytes(values.size() * sizeof(float));
        if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());  // (a 0-sized one: no pointers)
        w.add_tensor(name, quant::GgmlType::F32, dims, std::move(bytes));
    };
    const int64_t head_dim = tiny_head_dim(o);
    const int64_t q_dim = kTinyHeads * head_dim, kv_dim = kTinyHeadsKv * head_dim;
    tensor("token_embd.weight", {kTinyEmbd, kTinyVocab}, 0.0f);
    tensor("output_norm.weight", {kTinyEmbd}, 1.0f);
    if (!o.tied) tensor("output.weight", {kTinyEmbd, kTinyVocab}, 0.0f);
    if (o.rope_freqs) {
        // Divisors 1, 2, 4, 8 (Llama 3.1 leaves high frequencies alone and slows the low ones).
        const int64_t n_rot = o.n_rot > 0 ? o.n_rot : head_dim;
        std::vector<float> factors(static_cast<size_t>(o.rope_freqs_size > 0 ? o.rope_freqs_size : n_rot / 2));
        for (size_t i = 0; i < factors.size(); ++i) factors[i] = static_cast<float>(1 << i);
        std::vector<std::byte> bytes(factors.size() * sizeof(float));
        std::memcpy(bytes.data(), factors.data(), bytes.size());
        if (o.skip != "rope_freqs.weight") {
            w.add_tensor("rope_freqs.weight", quant::GgmlType::F32, std::vector<int64_t>{int64_t(factors.size())},
                         std::move(bytes));
        }
    }
    for (int il = 0; il < kTinyLayers; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        tensor(b + "attn_norm.weight", {kTinyEmbd}, 1.0f);
        tensor(b + "attn_q.weight", {kTinyEmbd, q_dim}, 0.0f);
        tensor(b + "attn_k.weight", {kTinyEmbd, kv_dim}, 0.0f);
        tensor(b + "attn_v.weight", {kTinyEmbd, kv_dim}, 0.0f);
        if (o.qkv_bias) {
            tensor(b + "attn_q.bias", {q_dim}, 0.0f);
            tensor(b + "attn_k.bias", {o.k_bias_size}, 0.0f);
            tensor(b + "attn_v.bias", {kv_dim}, 0.0f);
        }
        if (o.qk_norm) {
            tensor(b + "attn_q_norm.weight", {head_dim}, 1.0f);
            tensor(b + "attn_k_norm.weight", {head_dim}, 1.0f);
        }
        tensor(b + "attn_output.weight", {q_dim, kTinyEmbd}, 0.0f);
        tensor(b + "ffn_norm.weight", {kTinyEmbd}, 1.0f);
        if (o.expert_used > 0) {
            const int64_t n_expert = o.expert_count;
            const int64_t ff = o.expert_ff > 0 ? o.expert_ff : kTinyFfExp;
            tensor(b + "ffn_gate_inp.weight", {kTinyEmbd, n_expert}, 0.0f);
            tensor(b + "ffn_gate_exps.weight", {kTinyEmbd, ff, n_expert}, 0.0f);
            tensor(b + "ffn_up_exps.weight", {kTinyEmbd, ff, n_expert}, 0.0f);
            tensor(b + "ffn_down_exps.weight", {ff, kTinyEmbd, n_expert}, 0.0f);
            continue;
        }
        tensor(b + "ffn_gate.weight", {kTinyEmbd, kTinyFf}, 0.0f);
        if (o.ffn_up_type == quant::GgmlType::F32) {
            tensor(b + "ffn_up.weight", {kTinyEmbd, kTinyFf}, 0.0f);
        } else {
            const auto row = quant::row_bytes(o.ffn_up_type, kTinyEmbd);
            std::vector<std::byte> bytes(static_cast<size_t>(*row * kTinyFf));
            for (std::byte& v : bytes) v = static_cast<std::byte>(rng() & 0x3F);
            w.add_tensor(b + "ffn_up.weight", o.ffn_up_type, std::vector<int64_t>{kTinyEmbd, kTinyFf},
                         std::move(bytes));
        }
        tensor(b + "ffn_down.weight", {kTinyFf, kTinyEmbd}, 0.0f);
    }
    if (!o.extra.empty()) tensor(o.extra, {4}, 0.0f);
    return w.to_bytes();
}

inline int64_t tiny_head_dim(const TinyLlamaOptions& o) {
    return o.head_dim > 0 ? o.head_dim : kTinyHeadDim;
}

// The reference: every token of `tokens` (at positions 0, 1, ...) through the model in double
// precision, straight from the formulas. Returns n_tok * n_vocab logits, token-major.
//   h = x * w / sqrt(mean(x^2) + eps)                                  (RMSNorm)
//   q, k, v = Wq h + bq, Wk h + bk, Wv h + bv; Qwen3: each head of q and k RMS-normed
//   RoPE: pair i of a head turns by pos * scale * base^(-2i / n_rot) / factor[i]; Llama pairs
//         dims (2i, 2i+1), Qwen2 (NeoX) pairs (i, i + n_rot/2). YaRN (the paper's formulas):
//         the angle mixes scaled and unscaled along a ramp over the pairs whose wavelength fits
//         32 .. 1 times into the original context; cos and sin grow by 1 + 0.1 ln(1 / scale)
//   attn = softmax(q·k / sqrt(head_dim)) v over positions <= pos, query head h reading KV head
//          h / (n_head / n_head_kv)
//   x += Wo attn;  x += Wdown (silu(Wgate h) * Wup h) with h = RMSNorm(x)
//   Qwen3-MoE: p = softmax(Wrouter h); x += sum over the expert_used largest p_e of
//              p_e / (sum of those p) * Wdown_e (silu(Wgate_e h) * Wup_e h)
//   logits = Wout RMSNorm(x), Wout = token_embd when there is no output.weight
inline std::vector<float> reference_logits(const gguf::GgufFile& file, const TinyLlamaOptions& o,
                                           std::span<const int32_t> tokens) {
    const auto weight = [&](const std::string& name) -> const float* {
        const gguf::TensorInfo* t = file.find_tensor(name);
        return t ? reinterpret_cast<const float*>(t->data.data()) : nullptr;
    };
    using Vec = std::vector<double>;
    const auto matvec = [](const float* w, const Vec& x, int64_t rows) {  // w: [rows, x.size()]
        Vec y(static_cast<size_t>(rows), 0.0);
        for (int64_t r = 0; r < rows; ++r) {
            for (size_t c = 0; c < x.size(); ++c)
                y[static_cast<size_t>(r)] += w[r * int64_t(x.size()) + int64_t(c)] * x[c];
        }
        return y;
    };
    const auto rmsnorm = [](const Vec& x, const float* w) {
        double ss = 0.0;
        for (const double v : x) ss += v * v;
        const double s = 1.0 / std::sqrt(ss / double(x.size()) + double(kTinyEps));
        Vec y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
        return y;
    };
    const auto add_bias = [](Vec& x, const float* b) {
        if (b) {
            for (size_t i = 0; i < x.size(); ++i) x[i] += b[i];
        }
    };
    const bool neox = o.arch == "qwen2" || o.arch == "qwen3" || o.arch == "qwen3moe";
    const int64_t head_dim = tiny_head_dim(o);
    const int n_rot = o.n_rot > 0 ? o.n_rot : int(head_dim);
    const double scale = o.rope_scale > 0.0f && o.scaling_type != "none" ? 1.0 / o.rope_scale : 1.0;
    const float* factors = weight("rope_freqs.weight");
    const bool yarn = o.scaling_type == "yarn";
    const double orig_ctx = o.yarn_orig_ctx > 0 ? o.yarn_orig_ctx : 128;  // else the context length
    const auto corr_dim = [&](double beta) {
        return n_rot * std::log(orig_ctx / (beta * 2 * M_PI)) / (2 * std::log(double(kTinyRopeBase)));
    };
    const double yarn_low = std::max(0.0, std::floor(corr_dim(32)));
    const double yarn_high = std::min(n_rot - 1.0, std::ceil(corr_dim(1)));
    const double mscale = yarn ? 1.0 + 0.1 * std::log(1.0 / scale) : 1.0;
    const auto rope = [&](Vec& x, int n_head, int pos) {
        for (int h = 0; h < n_head; ++h) {
            double* head = x.data() + h * head_dim;
            for (int i = 0; i < n_rot / 2; ++i) {
                double theta = pos * scale * std::pow(double(kTinyRopeBase), -2.0 * i / n_rot);
                if (yarn) {
                    const double mix =
                        1.0 - std::clamp((i - yarn_low) / std::max(0.001, yarn_high - yarn_low), 0.0, 1.0);
                    theta = theta * (1 - mix) + theta / scale * mix;
                }
                if (factors) theta /= factors[i];
                const int a = neox ? i : 2 * i;
                const int b = neox ? i + n_rot / 2 : 2 * i + 1;
                const double x0 = head[a], x1 = head[b];
                head[a] = mscale * (x0 * std::cos(theta) - x1 * std::sin(theta));
                head[b] = mscale * (x0 * std::sin(theta) + x1 * std::cos(theta));
            }
        }
    };

    const auto head_norm = [&](Vec& x, int n_head, const float* w) {
        if (!w) return;
        for (int h = 0; h < n_head; ++h) {
            const Vec head(x.begin() + h * head_dim, x.begin() + (h + 1) * head_dim);
            const Vec normed = rmsnorm(head, w);
            std::copy(normed.begin(), normed.end(), x.begin() + h * head_dim);
        }
    };
    const int64_t q_dim = kTinyHeads * head_dim, kv_dim = kTinyHeadsKv * head_dim;
    const float* embd = weight("token_embd.weight");
    const float* out_w = weight("output.weight") ? weight("output.weight") : embd;
    std::vector<std::vector<Vec>> keys(kTinyLayers), values(kTinyLayers);
    std::vector<float> logits;
    for (size_t t = 0; t < tokens.size(); ++t) {
        const int pos = static_cast<int>(t);
        Vec x(embd + tokens[t] * kTinyEmbd, embd + (tokens[t] + 1) * kTinyEmbd);
        for (int il = 0; il < kTinyLayers; ++il) {
            const std::string b = "blk." + std::to_string(il) + ".";
            Vec h = rmsnorm(x, weight(b + "attn_norm.weight"));
            Vec q = matvec(weight(b + "attn_q.weight"), h, q_dim);
            Vec k = matvec(weight(b + "attn_k.weight"), h, kv_dim);
            Vec v = matvec(weight(b + "attn_v.weight"), h, kv_dim);
            add_bias(q, weight(b + "attn_q.bias"));
            add_bias(k, weight(b + "attn_k.bias"));
            add_bias(v, weight(b + "attn_v.bias"));
            head_norm(q, kTinyHeads, o.qk_norm ? weight(b + "attn_q_norm.weight") : nullptr);
            head_norm(k, kTinyHeadsKv, o.qk_norm ? weight(b + "attn_k_norm.weight") : nullptr);
            rope(q, kTinyHeads, pos);
            rope(k, kTinyHeadsKv, pos);
            keys[il].push_back(k);
            values[il].push_back(v);

            Vec attn(static_cast<size_t>(q_dim), 0.0);
            for (int hd = 0; hd < kTinyHeads; ++hd) {
                const int g = hd / (kTinyHeads / kTinyHeadsKv);
                std::vector<double> score(t + 1);
                double max_score = -1e300;
                for (size_t s = 0; s <= t; ++s) {
                    double dot = 0.0;
                    for (int d = 0; d < head_dim; ++d) dot += q[hd * head_dim + d] * keys[il][s][g * head_dim + d];
                    score[s] = dot / std::sqrt(double(head_dim));
                    max_score = std::max(max_score, score[s]);
                }
                double sum = 0.0;
                for (double& sc : score) sum += (sc = std::exp(sc - max_score));
                for (size_t s = 0; s <= t; ++s) {
                    for (int d = 0; d < head_dim; ++d) {
                        attn[hd * head_dim + d] += score[s] / sum * values[il][s][g * head_dim + d];
                    }
                }
            }
            const Vec o_proj = matvec(weight(b + "attn_output.weight"), attn, kTinyEmbd);
            for (int i = 0; i < kTinyEmbd; ++i) x[i] += o_proj[i];

            h = rmsnorm(x, weight(b + "ffn_norm.weight"));
            if (o.expert_used > 0) {
                Vec p = matvec(weight(b + "ffn_gate_inp.weight"), h, o.expert_count);
                const double max_p = *std::max_element(p.begin(), p.end());
                double sum = 0.0;
                for (double& e : p) sum += (e = std::exp(e - max_p));
                for (double& e : p) e /= sum;
                std::vector<int> order(p.size());
                std::iota(order.begin(), order.end(), 0);
                std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return p[a] > p[c]; });
                double chosen = 0.0;
                for (uint32_t r = 0; r < o.expert_used; ++r) chosen += p[order[r]];
                for (uint32_t r = 0; r < o.expert_used; ++r) {
                    const int64_t e = order[r];
                    const int64_t gate_size = kTinyFfExp * kTinyEmbd;
                    const Vec gate = matvec(weight(b + "ffn_gate_exps.weight") + e * gate_size, h, kTinyFfExp);
                    const Vec up = matvec(weight(b + "ffn_up_exps.weight") + e * gate_size, h, kTinyFfExp);
                    Vec act(static_cast<size_t>(kTinyFfExp));
                    for (int i = 0; i < kTinyFfExp; ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
                    const Vec down = matvec(weight(b + "ffn_down_exps.weight") + e * gate_size, act, kTinyEmbd);
                    for (int i = 0; i < kTinyEmbd; ++i) x[i] += p[order[r]] / chosen * down[i];
                }
                continue;
            }
            const Vec gate = matvec(weight(b + "ffn_gate.weight"), h, kTinyFf);
            const Vec up = matvec(weight(b + "ffn_up.weight"), h, kTinyFf);
            Vec act(static_cast<size_t>(kTinyFf));
            for (int i = 0; i < kTinyFf; ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
            const Vec down = matvec(weight(b + "ffn_down.weight"), act, kTinyEmbd);
            for (int i = 0; i < kTinyEmbd; ++i) x[i] += down[i];
        }
        const Vec row = matvec(out_w, rmsnorm(x, weight("output_norm.weight")), kTinyVocab);
        logits.insert(logits.end(), row.begin(), row.end());
    }
    return logits;
}

}  // namespace fitllm::test
