// Diagnosis only (tools/ggml_layer_diff/README.md; not built by CMake): feeds llama.cpp's own
// intermediate tensors of Gemma 3 270M's layers 0 and 1 (dump_llama_cpp_tensors) into fitllm's
// ops, one op at a time, and counts the elements whose bits differ from llama.cpp's output of
// that op. Matmuls are not checked here (quant/ owns them; compare.py shows them in the pass).
//   usage: op_check_gemma3 DIR N_TOKENS   (DIR/out/*.bin from the dump, DIR/w_NAME.bin: the
//          F32 norm weights, written by the snippet in the README)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ops/activation.h"
#include "ops/attention_f16.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"

using namespace fitllm;
static std::string dir;

static std::vector<float> read(const std::string& name, bool header) {
    FILE* f = std::fopen((dir + "/" + name).c_str(), "rb");
    if (!f) {
        std::printf("missing %s\n", name.c_str());
        std::exit(1);
    }
    std::fseek(f, 0, SEEK_END);
    long bytes = std::ftell(f) - (header ? 32 : 0);
    std::fseek(f, header ? 32 : 0, SEEK_SET);
    std::vector<float> v(bytes / 4);
    if (std::fread(v.data(), 4, v.size(), f) != v.size()) std::exit(1);
    std::fclose(f);
    return v;
}
static std::vector<float> theirs(const std::string& n) {
    return read("out/" + n + ".bin", true);
}
static std::vector<float> weight(const std::string& n) {
    return read("w_" + n + ".bin", false);
}

static void report(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
    if (got.size() != want.size()) {
        std::printf("%-28s size %zu vs %zu\n", what, got.size(), want.size());
        return;
    }
    size_t differ = 0;
    double max_d = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (std::memcmp(&got[i], &want[i], 4) != 0) ++differ;
        max_d = std::max(max_d, std::fabs(double(got[i]) - want[i]));
    }
    std::printf("%-28s differ %6zu / %6zu  max|d| %.3g\n", what, differ, got.size(), max_d);
}

int main(int argc, char** argv) {
    if (argc < 3) {
        std::printf("usage: %s DIR N_TOKENS\n", argv[0]);
        return 2;
    }
    // Gemma 3 270M; layers 0 and 1 are sliding-window layers (RoPE base 10000, window 512).
    const int E = 640, H = 4, HKV = 1, D = 256;
    dir = argv[1];
    const int n_tok = std::atoi(argv[2]);
    const float eps = 1e-6f;
    ops::ThreadPool pool(2);
    ops::Scratch scratch;
    for (int il = 0; il < 2; ++il) {
        const std::string l = std::to_string(il), b = "blk." + l + ".";
        std::printf("-- layer %d\n", il);
        // Norms.
        {
            auto x = il == 0 ? theirs("inp_scaled_SCALE") : theirs("l_out-0_ADD");
            std::vector<float> y(x.size());
            ops::rms_norm(x.data(), weight(b + "attn_norm.weight").data(), eps, n_tok, E, y.data());
            report(("attn_norm-" + l).c_str(), y, theirs("attn_norm-" + l + "_MUL"));
        }
        for (const char* qk : {"Q", "K"}) {
            const int heads = qk[0] == 'Q' ? H : HKV;
            auto x = theirs(std::string(qk) + "cur-" + l + "_MUL_MAT");
            std::vector<float> y(x.size());
            ops::rms_norm(x.data(), weight(b + (qk[0] == 'Q' ? "attn_q_norm.weight" : "attn_k_norm.weight")).data(),
                          eps, int64_t{n_tok} * heads, D, y.data());
            report((std::string(qk) + "cur_normed-" + l).c_str(), y,
                   theirs(std::string(qk) + "cur_normed-" + l + "_MUL"));
            auto r = theirs(std::string(qk) + "cur_normed-" + l + "_MUL");
            std::vector<int32_t> pos(n_tok);
            for (int t = 0; t < n_tok; ++t) pos[t] = t;
            ops::RopeParams p;
            p.mode = ops::RopeMode::Neox;
            p.n_dims = D;
            p.freq_base = 10000.0f;  // layers 0 and 1 are sliding-window layers
            ops::rope(r.data(), pos.data(), n_tok, heads, D, p);
            report((std::string(qk) + "rope-" + l).c_str(), r, theirs(std::string(qk) + "cur-" + l + "_ROPE"));
        }
        // Attention over llama.cpp's rotated Q, K and V (K, V rounded to f16 as its cache does).
        {
            auto q = theirs("Qcur-" + l + "_ROPE");
            auto k = theirs("Kcur-" + l + "_ROPE");
            auto v = theirs("Vcur-" + l + "_MUL_MAT");
            for (float& x : q) x *= 0.0625f;
            for (float& x : k) x = ops::round_to_f16(x);
            for (float& x : v) x = ops::round_to_f16(x);
            std::vector<int32_t> pos(n_tok);
            for (int t = 0; t < n_tok; ++t) pos[t] = t;
            ops::AttentionParams ap{.n_head = H, .n_head_kv = HKV, .head_dim = D, .scale = 1.0f, .sliding_window = 512};
            for (auto kernel :
                 {ops::AttentionF16Kernel::Best, ops::AttentionF16Kernel::Avx2, ops::AttentionF16Kernel::OneQuery}) {
                std::vector<float> out(q.size());
                ops::attention_f16(q.data(), pos.data(), n_tok, k.data(), v.data(), pos.data(), n_tok, ap, out.data(),
                                   pool, scratch, kernel);
                const char* names[] = {"kqv_out (Best)", "kqv_out (Avx2)", "kqv_out (OneQuery)"};
                report((std::string(names[static_cast<int>(kernel)]) + "-" + l).c_str(), out,
                       theirs("kqv_out-" + l + "_RESHAPE"));
            }
        }
        // Residual adds, GeGLU, post norms.
        {
            auto x = il == 0 ? theirs("inp_scaled_SCALE") : theirs("l_out-0_ADD");
            auto a = theirs("attn_post_norm-" + l + "_MUL");
            std::vector<float> y(x.size());
            ops::add(x.data(), a.data(), x.size(), y.data());
            report(("sa_out-" + l).c_str(), y, theirs("sa_out-" + l + "_ADD"));
            auto s = theirs("sa_out-" + l + "_ADD");
            ops::rms_norm(s.data(), weight(b + "ffn_norm.weight").data(), eps, n_tok, E, y.data());
            report(("ffn_norm-" + l).c_str(), y, theirs("ffn_norm-" + l + "_MUL"));
            auto g = theirs("ffn_gate-" + l + "_MUL_MAT");
            auto u = theirs("ffn_up-" + l + "_MUL_MAT");
            std::vector<float> gg(g.size());
            ops::geglu(g.data(), u.data(), g.size(), gg.data());
            report(("ffn_geglu-" + l).c_str(), gg, theirs("ffn_geglu-" + l + "_GEGLU"));
            {
                auto t = theirs("ffn_geglu-" + l + "_GEGLU");
                for (size_t i = 0; i < gg.size(); ++i) {
                    if (std::memcmp(&gg[i], &t[i], 4) != 0) {
                        std::printf("   geglu[%zu] gate %.9g up %.9g ours %.9g theirs %.9g\n", i, g[i], u[i], gg[i],
                                    t[i]);
                    }
                }
            }
            auto fo = theirs("ffn_out-" + l + "_MUL_MAT");
            ops::rms_norm(fo.data(), weight(b + "post_ffw_norm.weight").data(), eps, n_tok, E, y.data());
            report(("ffn_post_norm-" + l).c_str(), y, theirs("ffn_post_norm-" + l + "_MUL"));
            auto fp = theirs("ffn_post_norm-" + l + "_MUL");
            ops::add(s.data(), fp.data(), s.size(), y.data());
            report(("l_out-" + l).c_str(), y, theirs("l_out-" + l + "_ADD"));
        }
    }
}
