// Tokenization throughput of fitllm on one text file, printed as one JSON line so that
// bench/tokenize_vs_llama_cpp.py can set it beside llama.cpp's in the same run.
//
//   build/bench/tokenize_bench MODEL.gguf TEXT_FILE [REPEATS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gguf/gguf_reader.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s MODEL.gguf TEXT_FILE [REPEATS]\n", argv[0]);
        return 2;
    }
    const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
    std::ifstream in(argv[2], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    try {
        const auto load_start = std::chrono::steady_clock::now();
        const auto file = fitllm::gguf::GgufFile::open(argv[1]);
        const auto tok = fitllm::tokenizer::Tokenizer::from_gguf(file);
        const double load_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start).count();
        double best_s = 1e30;
        size_t n_tokens = 0;
        for (int r = 0; r < repeats; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            const auto ids = tok.tokenize(text, true, false);
            best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            n_tokens = ids.size();
        }
        std::printf("{\"bytes\": %zu, \"tokens\": %zu, \"best_s\": %.6f, \"mb_per_s\": %.3f, \"load_ms\": %.2f}\n",
                    text.size(), n_tokens, best_s, text.size() / 1e6 / best_s, load_ms);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tokenize_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
