#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace fitllm::ops {
namespace {

// Keys scored per step of the online softmax: enough to amortize the rescaling of the output
// accumulator, few enough that the scores stay in registers / L1.
constexpr int64_t kKeyTile = 64;

// q·k with 8 independent partial sums: without -ffast-math the compiler keeps one running sum
// in order, a chain of dependent adds; eight chains let it use the vector units.
float dot_f32(const float* a, const float* b, int n) {
    float partial[8] = {};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int lane = 0; lane < 8; ++lane) partial[lane] += a[i + lane] * b[i + lane];
    }
    float sum = 0.0f;
    for (float p : partial) sum += p;
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

bool visible(int32_t key_pos, int32_t query_pos, int sliding_window) {
    if (key_pos > query_pos) return false;
    return sliding_window <= 0 || static_cast<int64_t>(key_pos) > static_cast<int64_t>(query_pos) - sliding_window;
}

// Per-thread working memory of attend_heads for up to `heads` query heads.
struct HeadState {
    float* acc;          // [heads][head_dim]: the weighted sum of V under the running maximum
    float* scores;       // [heads][kKeyTile]
    float* running_max;  // [heads]
    float* running_sum;  // [heads]

    static int64_t floats(int heads, int64_t head_dim) {
        const int64_t n = heads * (head_dim + kKeyTile + 2);
        return (n + 15) / 16 * 16;  // whole cache lines, so threads never share one
    }
    HeadState(float* base, int heads, int64_t head_dim)
        : acc(base),
          scores(acc + heads * head_dim),
          running_max(scores + heads * kKeyTile),
          running_sum(running_max + heads) {}
};

// n_heads consecutive query heads (q and out rows head_dim apart) that share one kv head, all at
// position q_pos, against every key. Each K and V row is loaded once for all of them, which is the
// point of grouped-query attention: n_head / n_head_kv times less K/V traffic.
void attend_heads(const float* q, int n_heads, int32_t q_pos, const float* k, const float* v, const int32_t* kv_pos,
                  int64_t n_kv, int64_t kv_row_stride, const AttentionParams& p, HeadState st, float* out) {
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    const int d = p.head_dim;
    std::fill(st.acc, st.acc + n_heads * d, 0.0f);
    std::fill(st.running_max, st.running_max + n_heads, kMasked);
    std::fill(st.running_sum, st.running_sum + n_heads, 0.0f);

    for (int64_t j0 = 0; j0 < n_kv; j0 += kKeyTile) {
        const int64_t j1 = std::min(n_kv, j0 + kKeyTile);
        bool any_visible = false;
        for (int64_t j = j0; j < j1; ++j) {
            const bool seen = visible(kv_pos[j], q_pos, p.sliding_window);
            any_visible |= seen;
            const float* kj = k + j * kv_row_stride;
            for (int h = 0; h < n_heads; ++h) {
                float s = kMasked;
                if (seen) {
                    s = dot_f32(q + h * d, kj, d) * p.scale;
                    if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
                }
                st.scores[h * kKeyTile + (j - j0)] = s;
            }
        }
        if (!any_visible) continue;

        // Rescale what each head accumulated under its old maximum to the new one, and turn the
        // scores into weights under it.
        for (int h = 0; h < n_heads; ++h) {
            float* scores = st.scores + h * kKeyTile;
            float new_max = st.running_max[h];
            for (int64_t j = 0; j < j1 - j0; ++j) new_max = std::max(new_max, scores[j]);
            const float correction = std::exp(st.running_max[h] - new_max);  // 0 on the first visible tile
            st.running_max[h] = new_max;
            float sum = st.running_sum[h] * correction;
            for (int i = 0; i < d; ++i) st.acc[h * d + i] *= correction;
            for (int64_t j = 0; j < j1 - j0; ++j) {
                scores[j] = scores[j] == kMasked ? 0.0f : std::exp(scores[j] - new_max);
                sum += scores[j];
            }
            st.running_sum[h] = sum;
        }
        for (int64_t j = j0; j < j1; ++j) {
            if (!visible(kv_pos[j], q_pos, p.sliding_window)) continue;
            const float* vj = v + j * kv_row_stride;
            for (int h = 0; h < n_heads; ++h) {
                const float weight = st.scores[h * kKeyTile + (j - j0)];
                float* acc = st.acc + h * d;
                for (int i = 0; i < d; ++i) acc[i] += weight * vj[i];
            }
        }
    }
    for (int h = 0; h < n_heads; ++h) {
        const float ms = p.sinks ? apply_sink(p.sinks[h], st.running_max[h], st.running_sum[h]) : 1.0f;
        const float inv = st.running_sum[h] > 0.0f ? 1.0f / st.running_sum[h] : 0.0f;
        for (int i = 0; i < d; ++i) out[h * d + i] = st.acc[h * d + i] * ms * inv;
    }
}

// Query heads per task: all heads of a group share the K/V reads, but with few kv heads (Gemma 3
// 270M has one) a whole group per task would leave threads idle during decode. Take the largest
// divisor of the group that still gives every thread two tasks, or 1.
int heads_per_task(int64_t n_tok, int n_head_kv, int group, int n_threads) {
    for (int m = group; m > 1; --m) {
        if (group % m == 0 && n_tok * n_head_kv * (group / m) >= 2 * static_cast<int64_t>(n_threads)) return m;
    }
    return 1;
}

}  // namespace

void check_attention_params(const char* function, const AttentionParams& params) {
    if (params.n_head <= 0 || params.n_head_kv <= 0 || params.head_dim <= 0 || params.n_head % params.n_head_kv != 0) {
        throw std::invalid_argument(std::string(function) + ": n_head " + std::to_string(params.n_head) +
                                    " must be a positive multiple of n_head_kv " + std::to_string(params.n_head_kv) +
                                    " and head_dim " + std::to_string(params.head_dim) + " positive");
    }
}

void attention(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
               const int32_t* kv_pos, int64_t n_kv, const AttentionParams& params, float* out, ThreadPool& pool,
               Scratch& scratch) {
    check_attention_params("attention", params);
    if (n_tok <= 0) return;
    const int group = params.n_head / params.n_head_kv;
    const int64_t d = params.head_dim;
    const int64_t kv_row_stride = params.n_head_kv * d;

    const int per_task = heads_per_task(n_tok, params.n_head_kv, group, pool.size());
    const int64_t per_thread = HeadState::floats(per_task, d);
    auto* thread_scratch =
        reinterpret_cast<float*>(scratch.bytes(static_cast<size_t>(per_thread * pool.size()) * sizeof(float)));

    // Task = (token, block of per_task query heads); a block never straddles two kv heads.
    const int blocks_per_token = params.n_head / per_task;
    pool.parallel_for(n_tok * blocks_per_token, [&](int64_t begin, int64_t end, int thread_idx) {
        const HeadState state(thread_scratch + thread_idx * per_thread, per_task, d);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t t = task / blocks_per_token;
            const int h0 = static_cast<int>(task % blocks_per_token) * per_task;
            const int64_t g = h0 / group;
            const int64_t row = t * params.n_head + h0;
            AttentionParams p = params;
            if (p.sinks) p.sinks += h0;  // attend_heads' head h is h0 + h
            attend_heads(q + row * d, per_task, q_pos[t], k + g * d, v + g * d, kv_pos, n_kv, kv_row_stride, p, state,
                         out + row * d);
        }
    });
}

}  // namespace fitllm::ops
