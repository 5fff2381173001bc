// Decode speed of a model whose last layers stream from the file (model::LoadOptions), for
// bench/memcap_vs_llama_cpp.py under a memory cap: prefaults the resident part, then one prompt
// of P random tokens (pp) and N single-token steps (tg), as the llama.cpp side does.
//
//   build/bench/layer_stream_bench -m MODEL --stream-layers N [-p 16] [-n 16] [-t 2] [--buffered]
//
// Prints a JSON array like `fitllm bench -o json` ({"test": "pp16", "avg_ts": ...}, ...) on
// stdout and the pools' peaks on stderr.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/prefault.h"
#include "gguf/gguf_reader.h"
#include "memory/device.h"
#include "model/layer_stream.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "util/text.h"

using namespace fitllm;

namespace {

int usage() {
    std::fprintf(stderr, "usage: layer_stream_bench -m MODEL [--stream-layers N] [-p P] [-n N] [-t T] [--buffered]\n");
    return 2;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    std::string path;
    int n_streamed = 0, n_prompt = 16, n_gen = 16, n_threads = 2;
    bool direct = true;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
        const char* v = nullptr;
        if (a == "--buffered") {
            direct = false;
        } else if ((a == "-m" || a == "--stream-layers" || a == "-p" || a == "-n" || a == "-t") && (v = next())) {
            if (a == "-m") path = v;
            if (a == "--stream-layers") n_streamed = std::atoi(v);
            if (a == "-p") n_prompt = std::atoi(v);
            if (a == "-n") n_gen = std::atoi(v);
            if (a == "-t") n_threads = std::atoi(v);
        } else {
            return usage();
        }
    }
    if (path.empty() || n_prompt < 1 || n_gen < 1 || n_threads < 1) return usage();
    try {
        auto file = gguf::GgufFile::open(path);
        memory::Device host("host", UINT64_MAX);
        const auto t_load = std::chrono::steady_clock::now();
        auto model =
            model::Model::load(file, {.device = &host, .n_streamed_layers = n_streamed, .stream_direct_io = direct});
        const uint64_t prefaulted = engine::prefault(file, *model);
        const double load_s = seconds_since(t_load);
        ops::ThreadPool pool(n_threads);
        kv::ModelCache cache = model->make_cache({.n_cells = n_prompt + n_gen + 16}, n_prompt);
        std::mt19937 rng(42);
        std::uniform_int_distribution<int32_t> token(0, model->n_vocab() - 1);
        std::vector<float> logits(static_cast<size_t>(model->n_vocab()));

        std::vector<int32_t> prompt(static_cast<size_t>(n_prompt)), positions(prompt.size());
        for (size_t i = 0; i < prompt.size(); ++i) {
            prompt[i] = token(rng);
            positions[i] = static_cast<int32_t>(i);
        }
        auto t0 = std::chrono::steady_clock::now();
        model->forward(prompt, positions, cache, logits.data(), false, pool);
        const double pp_s = seconds_since(t0);
        t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n_gen; ++i) {
            const int32_t t = token(rng), pos = n_prompt + i;
            model->forward(std::span(&t, 1), std::span(&pos, 1), cache, logits.data(), false, pool);
        }
        const double tg_s = seconds_since(t0);

        uint64_t streamed = 0;
        for (const model::FileRange& r : model->streamed_ranges()) streamed += r.length;
        std::fprintf(stderr,
                     "%d of %d layers streamed (%s per pass, %s), resident %s prefaulted in %.1f s; pools: %s\n",
                     n_streamed, model->hparams().n_layer, util::human_bytes(streamed).c_str(),
                     direct ? "O_DIRECT when possible" : "buffered", util::human_bytes(prefaulted).c_str(), load_s,
                     host.breakdown().c_str());
        std::printf(
            "[{\"test\": \"pp%d\", \"avg_ts\": %.4f, \"stream_layers\": %d},\n"
            " {\"test\": \"tg%d\", \"avg_ts\": %.4f, \"stream_layers\": %d}]\n",
            n_prompt, n_prompt / pp_s, n_streamed, n_gen, n_gen / tg_s, n_streamed);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "layer_stream_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
