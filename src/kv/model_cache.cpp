// kv::ModelCache (kv/cache.h): the KV pools of one model, which layers each holds, and the calls
// that go to all of them.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kv/cache.h"
#include "memory/pool.h"
#include "util/round.h"
#include "util/text.h"

namespace fitllm::kv {

int ModelCache::window_pool_cells(const CacheParams& params, int window, int n_batch) {
    const int64_t bs = std::max(params.block_size, 1);
    const int64_t blocks = int64_t{params.n_seq_max} * ((window + bs - 1) / bs + 2) + (n_batch + bs - 1) / bs;
    return static_cast<int>(std::min<int64_t>(blocks * bs, INT_MAX - bs));
}

namespace {

// The pools of a ModelCache (kv/cache.h): which layers each holds, with which parameters.
struct PoolSetup {
    int capacity = 0;
    std::vector<int> pool_of, index_in_pool;
    std::vector<std::vector<LayerShape>> layers;
    std::vector<CacheParams> params;
    std::vector<int> device;  // per pool
};

PoolSetup plan_pools(const std::vector<LayerShape>& layers, const std::vector<int>& layer_window, CacheParams params,
                     int n_batch, const std::vector<int>& layer_device,
                     const std::vector<memory::Pool*>& device_pools) {
    if (layers.size() != layer_window.size()) {
        throw std::invalid_argument("ModelCache: " + std::to_string(layers.size()) + " layer shapes but " +
                                    std::to_string(layer_window.size()) + " layer windows");
    }
    if (!layer_device.empty() && layer_device.size() != layers.size()) {
        throw std::invalid_argument("ModelCache: " + std::to_string(layers.size()) + " layer shapes but " +
                                    std::to_string(layer_device.size()) + " layer devices");
    }
    if (n_batch < 1)
        throw std::invalid_argument("ModelCache: n_batch " + std::to_string(n_batch) + " must be at least 1");
    if (params.block_size < 1) {
        throw std::invalid_argument("KvCache: block_size " + std::to_string(params.block_size) + " must be at least 1");
    }
    params.window = 0;
    // Window pools hold fewer cells than the positions their tokens take.
    if (params.n_positions <= 0) params.n_positions = params.n_cells;
    PoolSetup setup;
    setup.capacity = static_cast<int>(util::round_up<int64_t>(std::max(params.n_cells, 1), params.block_size));

    // The pool of each layer, keyed by its window (0: full attention) and its device (0: the host).
    // A window pool that would be no smaller than the full one is the full one.
    std::vector<std::pair<int, int>> keys(layer_window.size());
    for (size_t il = 0; il < layer_window.size(); ++il) {
        const int w = layer_window[il];
        if (w < 0) {
            throw std::invalid_argument("ModelCache: layer " + std::to_string(il) + " has window " + std::to_string(w));
        }
        const int d = layer_device.empty() ? 0 : layer_device[il];
        if (d < 0 || static_cast<size_t>(d) > device_pools.size() || (d > 0 && device_pools[d - 1] == nullptr)) {
            throw std::invalid_argument("ModelCache: layer " + std::to_string(il) + " is on device " +
                                        std::to_string(d) + ", which has no pool");
        }
        keys[il] = {w > 0 && ModelCache::window_pool_cells(params, w, n_batch) < setup.capacity ? w : 0, d};
    }
    std::vector<std::pair<int, int>> pool_keys = keys;
    std::sort(pool_keys.begin(), pool_keys.end());  // full attention (0) first, the host's first
    pool_keys.erase(std::unique(pool_keys.begin(), pool_keys.end()), pool_keys.end());

    setup.pool_of.assign(layers.size(), 0);
    setup.index_in_pool.assign(layers.size(), 0);
    setup.layers.resize(pool_keys.size());
    setup.params.assign(pool_keys.size(), params);
    uint64_t window_pool_bytes = 0;  // the host's
    // One K fit at a time: its working memory is charged to the pool of the first widest K head.
    size_t widest = 0;
    for (size_t il = 1; il < layers.size(); ++il) {
        if (layers[il].head_dim_k > layers[widest].head_dim_k) widest = il;
    }
    for (size_t p = 0; p < pool_keys.size(); ++p) {
        const auto [window, device] = pool_keys[p];
        for (size_t il = 0; il < layers.size(); ++il) {
            if (keys[il] != pool_keys[p]) continue;
            setup.pool_of[il] = static_cast<int>(p);
            setup.index_in_pool[il] = static_cast<int>(setup.layers[p].size());
            setup.layers[p].push_back(layers[il]);
        }
        setup.device.push_back(device);
        CacheParams& pp = setup.params[p];
        pp.window = window;
        pp.charge_key_fit = keys[widest] == pool_keys[p];
        if (device > 0) {
            // A device's pools charge its "kv" pool and stay in its memory (spill is the host's).
            pp.pool = device_pools[static_cast<size_t>(device - 1)];
            pp.spill_dir.clear();
            pp.resident_limit = 0;
        }
        if (window > 0) {
            // Window pools are small: they stay in memory, inside the resident limit.
            pp.n_cells = ModelCache::window_pool_cells(params, window, n_batch);
            pp.spill_dir.clear();
            pp.resident_limit = 0;
            if (device == 0) window_pool_bytes += KvCache::bytes_for(setup.layers[p], pp);
        }
    }
    if (!pool_keys.empty() && pool_keys.front() == std::pair{0, 0} && !params.spill_dir.empty() &&
        params.resident_limit > 0) {
        if (params.resident_limit <= window_pool_bytes) {
            throw std::invalid_argument("ModelCache: the KV resident limit " +
                                        util::human_bytes(params.resident_limit) +
                                        " leaves nothing for the full-attention layers after the sliding-window "
                                        "pools' " +
                                        util::human_bytes(window_pool_bytes));
        }
        setup.params.front().resident_limit = params.resident_limit - window_pool_bytes;
    }
    if (setup.layers.empty()) {  // no layers: the error KvCache gives
        setup.layers.emplace_back();
        setup.params.push_back(params);
        setup.device.push_back(0);
    }
    return setup;
}

}  // namespace

ModelCache::ModelCache(const std::vector<LayerShape>& layers, const std::vector<int>& layer_window, CacheParams params,
                       int n_batch, const std::vector<int>& layer_device,
                       const std::vector<memory::Pool*>& device_kv_pools, const std::vector<bool>& device_external) {
    n_positions_ = params.n_positions > 0 ? params.n_positions : params.n_cells;
    PoolSetup setup = plan_pools(layers, layer_window, std::move(params), n_batch, layer_device, device_kv_pools);
    for (size_t p = 0; p < setup.params.size(); ++p) {
        const int d = setup.device[p];
        setup.params[p].external_storage =
            d > 0 && static_cast<size_t>(d) <= device_external.size() && device_external[static_cast<size_t>(d - 1)];
    }
    capacity_ = setup.capacity;
    pool_of_ = std::move(setup.pool_of);
    index_in_pool_ = std::move(setup.index_in_pool);
    pool_device_ = std::move(setup.device);
    for (size_t p = 0; p < setup.layers.size(); ++p) pools_.emplace_back(std::move(setup.layers[p]), setup.params[p]);
    cells_.resize(pools_.size());
    for (auto& cells : cells_) cells.reserve(static_cast<size_t>(n_batch));
}

ModelCache::~ModelCache() {
    close_hooks_.run();
}

void ModelCache::on_close(std::function<void()> fn) {
    close_hooks_.add(std::move(fn));
}

void ModelCache::CloseHooks::run() noexcept {
    while (!fns_.empty()) {
        const std::function<void()> fn = std::move(fns_.back());
        fns_.pop_back();
        fn();
    }
}

size_t ModelCache::bytes_for(const std::vector<LayerShape>& layers, const std::vector<int>& layer_window,
                             const CacheParams& params, int n_batch) {
    const PoolSetup setup = plan_pools(layers, layer_window, params, n_batch, {}, {});
    size_t n = 0;
    for (size_t p = 0; p < setup.layers.size(); ++p) n += KvCache::bytes_for(setup.layers[p], setup.params[p]);
    return n;
}

std::vector<size_t> ModelCache::bytes_per_device(const std::vector<LayerShape>& layers,
                                                 const std::vector<int>& layer_window, const CacheParams& params,
                                                 int n_batch, const std::vector<int>& layer_device) {
    int n_devices = 1;
    for (const int d : layer_device) n_devices = std::max(n_devices, d + 1);
    // Stand-in pools: only their number matters to the layout.
    std::vector<memory::Pool*> pools(static_cast<size_t>(n_devices - 1), nullptr);
    memory::Device stand_in("plan", UINT64_MAX);
    for (auto& p : pools) p = &stand_in.pool("kv");
    const PoolSetup setup = plan_pools(layers, layer_window, params, n_batch, layer_device, pools);
    std::vector<size_t> bytes(static_cast<size_t>(n_devices), 0);
    for (size_t p = 0; p < setup.layers.size(); ++p) {
        bytes[static_cast<size_t>(setup.device[p])] += KvCache::bytes_for(setup.layers[p], setup.params[p]);
    }
    return bytes;
}

int ModelCache::pool_device(int pool) const {
    return pool_device_.at(static_cast<size_t>(pool));
}

int ModelCache::n_pools() const {
    return static_cast<int>(pools_.size());
}
KvCache& ModelCache::pool(int i) {
    return pools_.at(static_cast<size_t>(i));
}
const KvCache& ModelCache::pool(int i) const {
    return pools_.at(static_cast<size_t>(i));
}
int ModelCache::pool_of(int layer) const {
    return pool_of_.at(static_cast<size_t>(layer));
}
int ModelCache::index_in_pool(int layer) const {
    return index_in_pool_.at(static_cast<size_t>(layer));
}

void ModelCache::place(std::span<const SeqId> seq, std::span<const Pos> pos) {
    for (const KvCache& p : pools_) p.check_room(seq);
    for (size_t i = 0; i < pools_.size(); ++i) {
        cells_[i].resize(seq.size());
        pools_[i].place(seq, pos, cells_[i]);
    }
}

std::span<const int32_t> ModelCache::cells(int pool) const {
    return cells_.at(static_cast<size_t>(pool));
}

bool ModelCache::has_room(std::span<const SeqId> seq) const {
    try {
        for (const KvCache& p : pools_) p.check_room(seq);
    } catch (const KvCacheError&) {
        return false;
    }
    return true;
}

void ModelCache::end_batch() {
    for (KvCache& p : pools_) p.trim_window(window_slack_);
}

void ModelCache::seq_rm(SeqId seq, Pos p0, Pos p1) {
    for (KvCache& p : pools_) p.seq_rm(seq, p0, p1);
}
void ModelCache::seq_cp(SeqId src, SeqId dst, Pos p0, Pos p1) {
    for (KvCache& p : pools_) p.seq_cp(src, dst, p0, p1);
}
void ModelCache::seq_keep(SeqId seq) {
    for (KvCache& p : pools_) p.seq_keep(seq);
}
void ModelCache::seq_add(SeqId seq, Pos p0, Pos p1, Pos delta) {
    for (KvCache& p : pools_) p.seq_add(seq, p0, p1, delta);
}
void ModelCache::seq_div(SeqId seq, Pos p0, Pos p1, int d) {
    for (KvCache& p : pools_) p.seq_div(seq, p0, p1, d);
}
void ModelCache::clear() {
    for (KvCache& p : pools_) p.clear();
}
Pos ModelCache::seq_pos_min(SeqId seq) const {
    return pools_.front().seq_pos_min(seq);
}
Pos ModelCache::seq_pos_max(SeqId seq) const {
    return pools_.front().seq_pos_max(seq);
}
int ModelCache::capacity() const {
    return capacity_;
}
size_t ModelCache::bytes() const {
    size_t n = 0;
    for (const KvCache& p : pools_) n += p.bytes();
    return n;
}
uint64_t ModelCache::spill_file_bytes() const {
    uint64_t n = 0;
    for (const KvCache& p : pools_) n += p.spill_file_bytes();
    return n;
}
void ModelCache::will_attend(int layer) const {
    pools_[static_cast<size_t>(pool_of(layer))].will_attend(index_in_pool(layer));
}
bool ModelCache::has_k_shift() const {
    return std::any_of(pools_.begin(), pools_.end(), [](const KvCache& p) { return p.has_k_shift(); });
}
void ModelCache::clear_k_shift() {
    for (KvCache& p : pools_) p.clear_k_shift();
}

}  // namespace fitllm::kv
