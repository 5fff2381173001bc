#include "model/model.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/backend.h"
#include "memory/pool.h"
#include "model/architecture.h"

namespace fitllm::model {

std::unique_ptr<Model> Model::load(const gguf::GgufFile& file, const LoadOptions& options) {
    Hparams hp = read_hparams(file);  // refuses architectures without a forward pass
    if (options.n_streamed_layers < 0 || options.n_streamed_layers > hp.n_layer) {
        throw std::invalid_argument(file.source() + ": cannot stream " + std::to_string(options.n_streamed_layers) +
                                    " layers of " + std::to_string(hp.n_layer));
    }
    return find_architecture(hp.arch)->load(file, std::move(hp), options);
}

std::vector<kv::LayerShape> Model::cache_layers() const {
    const Hparams& hp = hparams();
    return std::vector<kv::LayerShape>(static_cast<size_t>(hp.n_layer),
                                       kv::LayerShape{hp.n_head_kv, hp.head_dim, hp.head_dim_v, hp.n_head});
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
    const CachePlacement placement = cache_placement();
    if (placement.device == nullptr) return kv::ModelCache(cache_layers(), cache_windows(), params, n_batch);
    backend::Backend& dev = *placement.device;
    kv::ModelCache cache(cache_layers(), cache_windows(), params, n_batch, placement.layer_device,
                         {&dev.memory().pool(memory::pool_names::kKv)}, {dev.holds_kv_storage()});
    // Each pool the device's layers use, once; let go when the cache goes.
    std::vector<int> attached;
    for (const int il : placement.device_layers) {
        const int p = cache.pool_of(il);
        if (std::find(attached.begin(), attached.end(), p) != attached.end()) continue;
        attached.push_back(p);
        kv::KvCache& pool = cache.pool(p);
        dev.attach_kv(pool, cache.pool_device(p) > 0);
        cache.on_close([&dev, &pool] { dev.detach_kv(pool); });
    }
    return cache;
}

}  // namespace fitllm::model
