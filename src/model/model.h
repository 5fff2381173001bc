#pragma once
// A loaded model: hyper-parameters, weights bound to the mapped file, and a forward pass.
//
//   const auto file = gguf::GgufFile::open(path);
//   auto model = model::Model::load(file);           // file must outlive model
//   kv::KvCache cache = model->make_cache(2048);
//   model->forward(ids, positions, cache, logits.data(), /*all_logits=*/false, pool);
#include <cstdint>
#include <memory>
#include <span>

#include "gguf/gguf_reader.h"
#include "kv/kv_cache.h"
#include "model/hparams.h"
#include "ops/thread_pool.h"

namespace fitllm::model {

class Model {
public:
    virtual ~Model() = default;

    // Reads the hyper-parameters and binds the weights of a supported architecture. The model
    // keeps views into `file`, which must outlive it. Throws ModelError naming the key or tensor.
    static std::unique_ptr<Model> load(const gguf::GgufFile& file);

    virtual const Hparams& hparams() const = 0;
    int n_vocab() const { return hparams().n_vocab; }

    // A cache with room for n_ctx tokens, shaped for this model.
    kv::KvCache make_cache(int n_ctx) const;

    // Runs tokens (at the given positions, one per token) through the model, appending their K/V
    // to `cache`. logits_out receives n_vocab floats for the last token, or n_tok * n_vocab
    // (token-major) when all_logits. Working memory is kept between calls and only grows, so
    // repeated calls with at most as many tokens allocate nothing. Not thread-safe.
    virtual void forward(std::span<const int32_t> tokens, std::span<const int32_t> positions, kv::KvCache& cache,
                         float* logits_out, bool all_logits, ops::ThreadPool& pool) = 0;
};

// The forward pass of each architecture (one file each).
std::unique_ptr<Model> make_gemma3(const gguf::GgufFile& file, Hparams hp);
std::unique_ptr<Model> make_llama(const gguf::GgufFile& file, Hparams hp);
std::unique_ptr<Model> make_qwen2(const gguf::GgufFile& file, Hparams hp);

}  // namespace fitllm::model
