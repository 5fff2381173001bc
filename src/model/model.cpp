#include "model/model.h"

namespace fitllm::model {

std::unique_ptr<Model> Model::load(const gguf::GgufFile& file) {
    Hparams hp = read_hparams(file);  // refuses architectures without a forward pass
    if (hp.arch == "llama") return make_llama(file, std::move(hp));
    if (hp.arch == "qwen2") return make_qwen2(file, std::move(hp));
    return make_gemma3(file, std::move(hp));
}

kv::KvCache Model::make_cache(int n_ctx) const {
    const Hparams& hp = hparams();
    return kv::KvCache(hp.n_layer, n_ctx, hp.n_head_kv, hp.head_dim, hp.head_dim_v);
}

}  // namespace fitllm::model
