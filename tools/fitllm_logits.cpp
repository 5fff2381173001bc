// fitllm's logits after prompts of token ids, for tools/f64_reference.py:
//   fitllm_logits MODEL.gguf < PROMPTS
// reads one prompt per line (token ids separated by spaces), runs each through a fresh session
// (n_batch 512, 2 threads, a context of at least 2048, the default f16 KV cache: what
// tests/model/generated_golden_test.cpp checks against llama.cpp) and writes one line per prompt: the n_vocab logits
// after its last token, each with 9 significant digits (a float's value exactly).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "ops/thread_pool.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s MODEL.gguf < PROMPTS (one line of token ids per prompt)\n", argv[0]);
        return 2;
    }
    try {
        const fitllm::gguf::GgufFile file = fitllm::gguf::GgufFile::open(argv[1]);
        const std::unique_ptr<fitllm::model::Model> model = fitllm::model::Model::load(file);
        fitllm::ops::ThreadPool pool(2);
        std::string line;
        while (std::getline(std::cin, line)) {
            std::istringstream in(line);
            std::vector<int32_t> ids;
            for (int32_t id; in >> id;) ids.push_back(id);
            if (ids.empty()) continue;
            // At least llama.cpp's side's 2048 (f64_reference.py): what depends on the context
            // size (Phi-3's LongRoPE factors) then agrees.
            const int n_ctx = std::max(static_cast<int>(ids.size() + 8), 2048);
            fitllm::engine::Session session(*model, {.n_ctx = n_ctx, .n_batch = 512}, pool);
            const std::span<const float> logits = session.feed(ids);
            for (size_t i = 0; i < logits.size(); ++i)
                std::printf(i ? " %.9g" : "%.9g", static_cast<double>(logits[i]));
            std::printf("\n");
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fitllm_logits: %s\n", e.what());
        return 1;
    }
    return 0;
}
