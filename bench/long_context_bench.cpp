// A long context through one model, for bench/long_context_128k.py: a synthetic prompt of
// N_PROMPT random tokens fed in batches of N_BATCH, then N_GEN decode steps at that depth, with
// the KV cache quantized and/or spilled as asked. Prints a progress line per batch to stderr and
// one JSON line at the end (speeds, the cache's bytes in memory and on disk, peak RSS).
//
// --fill N instead of -p: the cache gets N cells of random K/V written directly (stored, rotated,
// quantized and spilled like a prompt's, N_BATCH at a time, layer by layer with the forward
// pass's will_attend calls), in O(N) instead of the prompt's O(N^2) attention, so decoding at a
// depth of 128k tokens can be measured without hours of prompt processing. Decode speed and
// memory do not depend on what the cells hold; the logits are meaningless either way.
//
//   build/bench/long_context_bench MODEL.gguf -c 131088 (-p 131072 | --fill 131072) -n 16 [-b 2048]
//       [-t 2] [-ctk q8_0 -ctv q8_0] [--kv-spill-dir DIR --kv-resident SIZE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "memory/budget.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/model.h"
#include "ops/thread_pool.h"

namespace {

using namespace fitllm;

long vm_kib(const char* key) {
    FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    const size_t n = std::strlen(key);
    while (std::fgets(line, sizeof line, f)) {
        if (std::strncmp(line, key, n) == 0) v = std::atol(line + n);
    }
    std::fclose(f);
    return v;
}

double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

[[noreturn]] void usage(const char* argv0) {
    std::fprintf(stderr,
                 "usage: %s MODEL.gguf -c N_CTX -p N_PROMPT -n N_GEN [-b N_BATCH] [-t THREADS] [-ctk T] [-ctv T] "
                 "[--kv-spill-dir DIR --kv-resident SIZE]\n",
                 argv0);
    std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) usage(argv[0]);
    const std::string model_path = argv[1];
    int n_ctx = 131072, n_prompt = 0, n_fill = 0, n_gen = 16, n_batch = 2048, n_threads = 2;
    kv::CacheParams cp;
    try {
        for (int i = 2; i < argc; ++i) {
            const std::string a = argv[i];
            if (i + 1 >= argc) usage(argv[0]);
            const std::string v = argv[++i];
            if (a == "-c")
                n_ctx = std::stoi(v);
            else if (a == "-p")
                n_prompt = std::stoi(v);
            else if (a == "--fill")
                n_fill = std::stoi(v);
            else if (a == "-n")
                n_gen = std::stoi(v);
            else if (a == "-b")
                n_batch = std::stoi(v);
            else if (a == "-t")
                n_threads = std::stoi(v);
            else if (a == "-ctk")
                cp.type_k = kv::kv_type_from_name(v);
            else if (a == "-ctv")
                cp.type_v = kv::kv_type_from_name(v);
            else if (a == "--kv-spill-dir")
                cp.spill_dir = v;
            else if (a == "--kv-resident")
                cp.resident_limit = memory::parse_size(v);
            else
                usage(argv[0]);
        }
        if ((n_prompt > 0) == (n_fill > 0)) usage(argv[0]);
        if (n_prompt + n_fill + n_gen > n_ctx) {
            std::fprintf(stderr, "-p %d / --fill %d + -n %d do not fit in -c %d\n", n_prompt, n_fill, n_gen, n_ctx);
            return 2;
        }
        const auto t_load = std::chrono::steady_clock::now();
        const auto file = gguf::GgufFile::open(model_path);
        const auto model = model::Model::load(file);
        ops::ThreadPool pool(n_threads);
        // The cache charges a pool of its own device, so the JSON says what it charged.
        memory::Device host("host", UINT64_MAX);
        cp.pool = &host.pool(memory::pool_names::kKv);
        cp.n_cells = n_ctx;
        kv::ModelCache cache = model->make_cache(cp, n_batch);
        const double load_s = since(t_load);
        std::fprintf(stderr, "cache: %.1f MiB in memory, %.1f MiB spill file, %d pools\n", cache.bytes() / 1048576.0,
                     cache.spill_file_bytes() / 1048576.0, cache.n_pools());

        std::mt19937 rng(42);
        std::uniform_int_distribution<int32_t> token(0, model->n_vocab() - 1);
        std::vector<int32_t> tokens(static_cast<size_t>(n_batch)), pos(static_cast<size_t>(n_batch));
        std::vector<float> logits(static_cast<size_t>(model->n_vocab()));

        const auto t_prompt = std::chrono::steady_clock::now();
        for (int begin = 0; begin < n_prompt; begin += n_batch) {
            const int n = std::min(n_batch, n_prompt - begin);
            for (int i = 0; i < n; ++i) {
                tokens[static_cast<size_t>(i)] = token(rng);
                pos[static_cast<size_t>(i)] = begin + i;
            }
            model->forward(std::span(tokens.data(), static_cast<size_t>(n)),
                           std::span(pos.data(), static_cast<size_t>(n)), cache, logits.data(), false, pool);
            std::fprintf(stderr, "prompt %d %.3f rss_kib %ld\n", begin + n, since(t_prompt), vm_kib("VmRSS:"));
        }
        // The fill: random K/V rows (one set, reused for every batch and layer: the values do not
        // matter, storing them does), placed and stored as a forward pass would.
        const std::vector<kv::LayerShape> shapes = model->cache_layers();
        std::vector<float> k_rows, v_rows;
        std::vector<kv::SeqId> seq0(static_cast<size_t>(n_batch), 0);
        if (n_fill > 0) {
            size_t width_k = 0, width_v = 0;
            for (const kv::LayerShape& s : shapes) {
                width_k = std::max(width_k, static_cast<size_t>(s.n_head_kv * s.head_dim_k));
                width_v = std::max(width_v, static_cast<size_t>(s.n_head_kv * s.head_dim_v));
            }
            std::normal_distribution<float> normal;
            k_rows.resize(static_cast<size_t>(n_batch) * width_k);
            v_rows.resize(static_cast<size_t>(n_batch) * width_v);
            for (float& x : k_rows) x = normal(rng);
            for (float& x : v_rows) x = normal(rng);
        }
        for (int begin = 0; begin < n_fill; begin += n_batch) {
            const int n = std::min(n_batch, n_fill - begin);
            for (int i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = begin + i;
            cache.place(std::span(seq0.data(), static_cast<size_t>(n)), std::span(pos.data(), static_cast<size_t>(n)));
            for (int il = 0; il < static_cast<int>(shapes.size()); ++il) {
                const int p = cache.pool_of(il);
                cache.pool(p).store(cache.index_in_pool(il), cache.cells(p), k_rows.data(), v_rows.data());
                cache.will_attend(il);
            }
            cache.end_batch();
            std::fprintf(stderr, "fill %d %.3f rss_kib %ld\n", begin + n, since(t_prompt), vm_kib("VmRSS:"));
        }
        const double prompt_s = since(t_prompt);
        const int depth = n_prompt + n_fill;

        const auto t_gen = std::chrono::steady_clock::now();
        for (int i = 0; i < n_gen; ++i) {
            const int32_t t = token(rng);
            const int32_t p = depth + i;
            model->forward(std::span(&t, 1), std::span(&p, 1), cache, logits.data(), false, pool);
            std::fprintf(stderr, "decode %d %.3f\n", i + 1, since(t_gen));
        }
        const double gen_s = since(t_gen);
        std::printf(
            "{\"n_ctx\": %d, \"n_prompt\": %d, \"n_fill\": %d, \"n_batch\": %d, \"prompt_s\": %.3f, "
            "\"prompt_tok_s\": %.2f, "
            "\"n_gen\": %d, \"gen_s\": %.3f, \"gen_tok_s\": %.3f, \"load_s\": %.3f, \"kv_memory_bytes\": %zu, "
            "\"kv_spill_file_bytes\": %llu, \"kv_pool_peak_bytes\": %llu, \"vm_hwm_kib\": %ld, \"threads\": %d}\n",
            n_ctx, n_prompt, n_fill, n_batch, prompt_s, depth / prompt_s, n_gen, gen_s, n_gen > 0 ? n_gen / gen_s : 0.0,
            load_s, cache.bytes(), static_cast<unsigned long long>(cache.spill_file_bytes()),
            static_cast<unsigned long long>(cp.pool->peak()), vm_kib("VmHWM:"), n_threads);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "long_context_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
