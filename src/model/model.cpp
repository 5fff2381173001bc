#include "model/model.h"

namespace fitllm::model {

std::unique_ptr<Model> Model::load(const gguf::GgufFile& file) {
    Hparams hp = read_hparams(file);  // refuses architectures without a forward pass
    if (hp.arch == "llama") return make_llama(file, std::move(hp));
    if (hp.arch == "qwen2") return make_qwen2(file, std::move(hp));
    return make_gemma3(file, std::move(hp));
}

std::vector<kv::LayerShape> Model::cache_layers() const {
    const Hparams& hp = hparams();
    return std::vector<kv::LayerShape>(static_cast<size_t>(hp.n_layer),
                                       kv::LayerShape{hp.n_head_kv, hp.head_dim, hp.head_dim_v});
}

std::vector<int> Model::cache_windows() const {
    const Hparams& hp = hparams();
    std::vector<int> windows(static_cast<size_t>(hp.n_layer), 0);
    for (int il = 0; il < hp.n_layer; ++il) {
        const auto i = static_cast<size_t>(il);
        if (i < hp.is_swa.size() && hp.is_swa[i]) windows[i] = hp.sliding_window;
    }
    return windows;
}

kv::ModelCache Model::make_cache(const kv::CacheParams& params, int n_batch) const {
    return kv::ModelCache(cache_layers(), cache_windows(), params, n_batch);
}

}  // namespace fitllm::model
