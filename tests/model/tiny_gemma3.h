#pragma once
// A tiny random Gemma 3 model in memory (F32 weights), for tests that need a whole model but not
// a real one: 2 layers (both sliding-window with window 4: Gemma 3's pattern makes layers
// il % 6 < 5 local; n_layer = 6 adds the global one), n_embd 32, 2 query heads sharing 1 KV head
// of 16 dims, vocabulary 40.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf_writer.h"

namespace fitllm::test {

struct TinyGemma3Options {
    std::string arch = "gemma3";
    bool with_head_count = true;  // false: leave out gemma3.attention.head_count
    int64_t q_norm_size = 16;     // the shape written for blk.*.attn_q_norm.weight
    int64_t n_layer = 2;          // 6: five local layers and a global one
};

inline std::vector<std::byte> tiny_gemma3_bytes(const TinyGemma3Options& o = {}) {
    constexpr int64_t kEmbd = 32, kHeadDim = 16, kHeads = 2, kFf = 64, kVocab = 40;
    const int64_t kLayers = o.n_layer;
    gguf::GgufWriter w;
    w.add_string("general.architecture", o.arch);
    const std::string p = o.arch + ".";
    w.add<uint32_t>(p + "block_count", kLayers);
    w.add<uint32_t>(p + "embedding_length", kEmbd);
    w.add<uint32_t>(p + "feed_forward_length", kFf);
    w.add<uint32_t>(p + "context_length", 128);
    if (o.with_head_count) w.add<uint32_t>(p + "attention.head_count", kHeads);
    w.add<uint32_t>(p + "attention.head_count_kv", 1);
    w.add<uint32_t>(p + "attention.key_length", kHeadDim);
    w.add<uint32_t>(p + "attention.value_length", kHeadDim);
    w.add<float>(p + "attention.layer_norm_rms_epsilon", 1e-6f);
    w.add<float>(p + "rope.freq_base", 1e6f);
    w.add<uint32_t>(p + "attention.sliding_window", 4);

    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    const auto tensor = [&](const std::string& name, std::vector<int64_t> dims, float base) {
        int64_t n = 1;
        for (const int64_t d : dims) n *= d;
        std::vector<float> values(static_cast<size_t>(n));
        for (float& v : values) v = base + normal(rng);
        std::vector<std::byte> bytes(values.size() * sizeof(float));
        std::memcpy(bytes.data(), values.data(), bytes.size());
        w.add_tensor(name, quant::GgmlType::F32, dims, std::move(bytes));
    };
    tensor("token_embd.weight", {kEmbd, kVocab}, 0.0f);
    tensor("output_norm.weight", {kEmbd}, 1.0f);
    for (int il = 0; il < kLayers; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        tensor(b + "attn_norm.weight", {kEmbd}, 1.0f);
        tensor(b + "attn_q.weight", {kEmbd, kHeads * kHeadDim}, 0.0f);
        tensor(b + "attn_k.weight", {kEmbd, kHeadDim}, 0.0f);
        tensor(b + "attn_v.weight", {kEmbd, kHeadDim}, 0.0f);
        tensor(b + "attn_q_norm.weight", {o.q_norm_size}, 1.0f);
        tensor(b + "attn_k_norm.weight", {kHeadDim}, 1.0f);
        tensor(b + "attn_output.weight", {kHeads * kHeadDim, kEmbd}, 0.0f);
        tensor(b + "post_attention_norm.weight", {kEmbd}, 1.0f);
        tensor(b + "ffn_norm.weight", {kEmbd}, 1.0f);
        tensor(b + "ffn_gate.weight", {kEmbd, kFf}, 0.0f);
        tensor(b + "ffn_up.weight", {kEmbd, kFf}, 0.0f);
        tensor(b + "ffn_down.weight", {kFf, kEmbd}, 0.0f);
        tensor(b + "post_ffw_norm.weight", {kEmbd}, 1.0f);
    }
    return w.to_bytes();
}

}  // namespace fitllm::test
