// Attention with llama.cpp's f16 accumulation, and its f16 rounding helper.
#include "ops/attention_f16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "quant/blocks.h"

namespace fitllm::ops {
namespace {

float via_half(float x) {
    return quant::fp16_to_fp32(quant::fp32_to_fp16(x));
}

TEST(AttentionF16, RoundToF16MatchesTheReferenceConversion) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> any_bits;
    for (int i = 0; i < 200000; ++i) {
        uint32_t bits = any_bits(rng);
        if (i % 2) bits = (bits & 0x807FFFFFu) | ((100u + bits % 60u) << 23);  // mostly the f16 range
        float x;
        std::memcpy(&x, &bits, sizeof x);
        if (std::isnan(x)) continue;
        ASSERT_EQ(round_to_f16(x), via_half(x)) << "bits " << std::hex << bits;
    }
    for (const float x : {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 6.1035156e-05f, 5.9604645e-08f,
                          2.9802322e-08f, 8.9406967e-08f, 1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f}) {
        EXPECT_EQ(round_to_f16(x), via_half(x)) << x;
    }
    EXPECT_TRUE(std::isnan(round_to_f16(std::numeric_limits<float>::quiet_NaN())));
}

// With f16-representable inputs the result stays within f16 accumulation error of the float op.
TEST(AttentionF16, AgreesWithFloatAttentionToHalfPrecision) {
    const int n_tok = 5, n_kv = 9, n_head = 4, n_head_kv = 2, d = 64;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(n_tok * n_head * d), k(n_kv * n_head_kv * d), v(n_kv * n_head_kv * d);
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = via_half(normal(rng));
    for (float& x : v) x = via_half(normal(rng));
    std::vector<int32_t> q_pos = {4, 5, 6, 7, 8}, kv_pos = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    AttentionParams p{.n_head = n_head, .n_head_kv = n_head_kv, .head_dim = d, .scale = 0.125f, .sliding_window = 3};
    ThreadPool pool(2);
    Scratch scratch;
    std::vector<float> expected(q.size()), got(q.size());
    attention(q.data(), q_pos.data(), n_tok, k.data(), v.data(), kv_pos.data(), n_kv, p, expected.data(), pool,
              scratch);
    attention_f16(q.data(), q_pos.data(), n_tok, k.data(), v.data(), kv_pos.data(), n_kv, p, got.data(), pool, scratch);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-2f) << i;
}

}  // namespace
}  // namespace fitllm::ops
