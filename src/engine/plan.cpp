#include "engine/plan.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

#include "backend/backend.h"
#include "fitllm/config.h"
#include "kv/cache.h"
#include "memory/pool.h"
#include "model/activations.h"
#include "model/expert_cache.h"
#include "model/layer_stream.h"
#include "model/offload.h"
#include "ops/attention.h"
#include "ops/attention_kv.h"
#include "ops/thread_pool.h"
#include "quant/dot.h"
#include "sampling/sampler.h"
#include "util/text.h"

namespace fitllm::engine {

namespace {

constexpr int kBlockSize = kv::CacheParams{}.block_size;  // the runtime's cache blocks
constexpr int kMinFitContext = 256;
constexpr uint64_t kPageBytes = 4096;

uint64_t row_bytes_or_throw(quant::GgmlType type, int64_t n, const std::string& what) {
    const auto bytes = quant::row_bytes(type, static_cast<uint64_t>(n));
    if (!bytes) {
        throw std::invalid_argument(what + ": " + std::to_string(n) + " values are not whole blocks of " +
                                    std::string(quant::type_name(static_cast<uint32_t>(type))));
    }
    return *bytes;
}

// "q8_0", as -ctk / -ctv spell it.
std::string type_str(quant::GgmlType t) {
    std::string s(quant::type_name(static_cast<uint32_t>(t)));
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

uint64_t round_up(uint64_t n, uint64_t to) {
    return (n + to - 1) / to * to;
}

}  // namespace

std::string expert_cache_shortfall(const Plan& p) {
    const model::Hparams& hp = p.shape.hp;
    const uint64_t rest = p.total() - p.weights_resident - p.expert_cache;
    return "the dense weights " + util::human_bytes(p.weights_resident) + " resident + the expert cache's " +
           std::to_string(p.n_expert_slots) + " slots x " + util::human_bytes(p.shape.expert_slot_bytes) + " = " +
           util::human_bytes(p.expert_cache) + " (at least " + std::to_string(model::min_expert_slots(hp)) + ": " +
           std::to_string(hp.n_expert_used) + " experts used x " + std::to_string(hp.n_layer) +
           " layers) + KV cache, scratch, outputs and overhead " + util::human_bytes(rest) + " = " +
           util::human_bytes(p.total()) + ", over the budget of " + util::human_bytes(p.params.budget) + " by " +
           util::human_bytes(p.total() - std::min(p.total(), p.params.budget));
}

int kv_cells(int n_ctx, int n_seq, bool context_shift) {
    return n_ctx + (n_seq > 1 ? n_seq * kBlockSize : 0) + (context_shift ? 2 * kBlockSize : 0);
}

int tensor_layer(std::string_view name) {
    if (!name.starts_with("blk.")) return -1;
    int il = 0;
    size_t i = 4;
    if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && il < 1'000'000; ++i) il = il * 10 + (name[i] - '0');
    return i < name.size() && name[i] == '.' ? il : -1;
}

ModelShape model_shape(const gguf::GgufFile& file) {
    ModelShape s;
    s.source = file.source();
    s.hp = model::read_hparams(file);
    s.file_bytes = file.size();
    s.metadata_bytes = std::min<uint64_t>(file.data_offset(), file.size());
    s.layer_bytes.assign(static_cast<size_t>(s.hp.n_layer), 0);
    s.layer_expert_bytes.assign(static_cast<size_t>(s.hp.n_layer), 0);
    s.layer_routed_bytes.assign(static_cast<size_t>(s.hp.n_layer), 0);
    s.layer_routed_device_bytes.assign(static_cast<size_t>(s.hp.n_layer), 0);
    s.layer_router_bytes.assign(static_cast<size_t>(s.hp.n_layer), 0);
    try {
        for (int il = 0; il < s.hp.n_layer; ++il) s.layer_stream_bytes.push_back(model::stream_buffer_bytes(file, il));
    } catch (const model::ModelError&) {
        s.layer_stream_bytes.clear();  // a layer without tensors: it cannot stream anyway
    }
    const bool has_output = file.find_tensor("output.weight") != nullptr;
    s.tied_output = !has_output;
    for (const gguf::TensorInfo& t : file.tensors()) {
        s.tensor_names.emplace_back(t.name);
        s.tensor_dims.push_back(static_cast<int>(t.n_dims));
        s.tensor_bytes.push_back(t.n_bytes);
        const int il = tensor_layer(t.name);
        if (il >= 0 && il < s.hp.n_layer) {
            s.layer_bytes[static_cast<size_t>(il)] += t.n_bytes;
            if (model::is_routed_block_tensor(t.name)) {
                s.layer_routed_bytes[static_cast<size_t>(il)] += t.n_bytes;
                if (model::is_router_tensor(t.name)) {  // never copied (model::device_tensor_names)
                    s.layer_router_bytes[static_cast<size_t>(il)] += t.n_bytes;
                } else {
                    s.layer_routed_device_bytes[static_cast<size_t>(il)] += model::device_copy_bytes(t.n_bytes);
                }
            }
            if (model::is_expert_tensor(t.name)) {
                s.layer_expert_bytes[static_cast<size_t>(il)] += t.n_bytes;
                s.expert_bytes += t.n_bytes;
            } else if (t.name.find("_shexp.") != std::string_view::npos) {
                s.shared_expert_bytes += t.n_bytes;
            }
            if (t.n_dims >= 2)
                s.matmuls.push_back({t.type, t.ne[0], false, t.name.find(".ffn_") != std::string_view::npos,
                                     static_cast<int>(s.tensor_names.size() - 1)});
        } else {
            s.global_bytes += t.n_bytes;
            const bool is_embd = t.name == "token_embd.weight";
            if (is_embd) {
                s.token_embd_bytes = t.n_bytes;
                s.token_embd_row_bytes = t.ne[1] > 0 ? t.n_bytes / static_cast<uint64_t>(t.ne[1]) : t.n_bytes;
            }
            if (t.name == "output.weight" || (!has_output && is_embd)) {
                s.matmuls.push_back({t.type, t.ne[0], true, false, static_cast<int>(s.tensor_names.size() - 1)});
            }
            if (t.name == "output.weight" || t.name == "output_norm.weight" || (!has_output && is_embd)) {
                s.output_bytes += t.n_bytes;
            }
        }
    }
    for (int n = 0; n <= s.hp.n_layer + 1; ++n)
        s.device_weight_bytes.push_back(model::device_weight_bytes(file, s.hp, n));
    if (s.hp.is_moe()) {
        try {
            s.expert_slot_bytes = model::expert_slot_bytes(file, s.hp);
        } catch (const model::ModelError&) {
            s.expert_slot_bytes = 0;  // experts the cache cannot slice: it is refused
        }
    }
    return s;
}

std::vector<model::TensorEntry> ModelShape::tensor_entries() const {
    std::vector<model::TensorEntry> entries;
    entries.reserve(tensor_names.size());
    for (size_t i = 0; i < tensor_names.size(); ++i)
        entries.push_back({tensor_names[i], i < tensor_dims.size() ? tensor_dims[i] : 2});
    return entries;
}

int ModelShape::tensor_index(std::string_view name) const {
    for (size_t i = 0; i < tensor_names.size(); ++i) {
        if (tensor_names[i] == name) return static_cast<int>(i);
    }
    throw std::logic_error("ModelShape: no tensor " + std::string(name));
}

uint64_t ModelShape::dense_bytes() const {
    uint64_t all = global_bytes;
    for (const uint64_t b : layer_bytes) all += b;
    return all - std::min(all, expert_bytes);
}

uint64_t kv_pool_bytes(int n_layer, int n_head_kv, int head_dim_k, int head_dim_v, int n_cells_rounded, int n_seq,
                       int block_size, quant::GgmlType type_k, quant::GgmlType type_v, int n_head_q, bool rotate,
                       bool charge_key_fit) {
    row_bytes_or_throw(type_k, head_dim_k, "K head");
    row_bytes_or_throw(type_v, head_dim_v, "V head");
    kv::CacheParams cp;
    cp.n_cells = n_cells_rounded;
    cp.n_seq_max = n_seq;
    cp.block_size = block_size;
    cp.type_k = type_k;
    cp.type_v = type_v;
    cp.rotate = rotate;
    cp.charge_key_fit = charge_key_fit;
    const std::vector<kv::LayerShape> layers(static_cast<size_t>(n_layer),
                                             {n_head_kv, head_dim_k, head_dim_v, n_head_q});
    return kv::KvCache::bytes_for(layers, cp);  // the cache's own count: cells, blocks, K/V, K transforms
}

std::vector<KvPoolPlan> kv_plan(const model::Hparams& hp, int n_cells, int n_seq, int n_batch, quant::GgmlType type_k,
                                quant::GgmlType type_v, uint64_t resident_limit, int n_device_layers, bool rotate) {
    // Per place (host, device): one pool for the full-attention layers, one per sliding window
    // that is smaller than the full pool (kv::ModelCache).
    kv::CacheParams cp;
    cp.n_cells = n_cells;
    cp.n_seq_max = n_seq;
    cp.type_k = type_k;
    cp.type_v = type_v;
    cp.rotate = rotate;
    const int capacity = static_cast<int>(round_up(static_cast<uint64_t>(n_cells), kBlockSize));
    const int first_device = hp.n_layer - std::clamp(n_device_layers, 0, hp.n_layer);
    std::map<std::pair<bool, int>, int> layers_per_pool;  // (on device, window (0: full)) -> layers
    std::pair<bool, int> first_pool;  // layer 0's, charged for the K transform's fit (kv::ModelCache)
    for (int il = 0; il < hp.n_layer; ++il) {
        const auto i = static_cast<size_t>(il);
        int w = i < hp.is_swa.size() && hp.is_swa[i] ? hp.sliding_window : 0;
        if (w > 0 && kv::ModelCache::window_pool_cells(cp, w, n_batch) >= capacity) w = 0;
        ++layers_per_pool[{il >= first_device, w}];
        if (il == 0) first_pool = {il >= first_device, w};
    }
    std::vector<KvPoolPlan> pools;
    for (const auto& [where, n_layer] : layers_per_pool) {
        KvPoolPlan pool;
        pool.on_device = where.first;
        pool.window = where.second;
        pool.n_layer = n_layer;
        pool.n_cells =
            pool.window > 0
                ? static_cast<int>(round_up(
                      static_cast<uint64_t>(kv::ModelCache::window_pool_cells(cp, pool.window, n_batch)), kBlockSize))
                : capacity;
        pool.bytes = kv_pool_bytes(n_layer, hp.n_head_kv, hp.head_dim, hp.head_dim_v, pool.n_cells, n_seq, kBlockSize,
                                   type_k, type_v, hp.n_head, rotate, where == first_pool);
        pools.push_back(pool);
    }
    // KV spill (kv/cache.h): on the host, the window pools stay in memory; the full-attention pool
    // keeps what the rest of the limit holds, as kv::ModelCache splits it.
    if (resident_limit > 0 && !pools.empty() && !pools.front().on_device && pools.front().window == 0) {
        uint64_t window_bytes = 0;
        for (size_t i = 1; i < pools.size(); ++i) {
            if (!pools[i].on_device) window_bytes += pools[i].bytes;
        }
        if (resident_limit <= window_bytes) {
            throw std::invalid_argument("the KV resident limit " + util::human_bytes(resident_limit) +
                                        " leaves nothing for the full-attention layers after the sliding-window "
                                        "pools' " +
                                        util::human_bytes(window_bytes));
        }
        KvPoolPlan& full = pools.front();
        kv::CacheParams fp = cp;
        fp.n_cells = full.n_cells;
        fp.spill_dir = "(plan)";  // only whether there is one matters to bytes_for
        fp.resident_limit = resident_limit - window_bytes;
        fp.charge_key_fit = pools.front().on_device == first_pool.first && pools.front().window == first_pool.second;
        const std::vector<kv::LayerShape> layers(static_cast<size_t>(full.n_layer),
                                                 {hp.n_head_kv, hp.head_dim, hp.head_dim_v, hp.n_head});
        const uint64_t resident = kv::KvCache::bytes_for(layers, fp);
        full.spilled = full.bytes - std::min(full.bytes, resident);
        full.bytes = std::min(full.bytes, resident);
    }
    return pools;
}

namespace {

// make_plan() for a settled number of offloaded layers (0..n_layer + 1).
Plan plan_for(const ModelShape& shape, const PlanParams& params) {
    const model::Hparams& hp = shape.hp;
    Plan p;
    p.shape = shape;
    p.params = params;

    // Placement: the last n_device layers run on the offload device (the output layer too when
    // n_gpu_layers > n_layer); of the rest, the last n_streamed_layers stream.
    const int n_device = std::min(params.n_gpu_layers, hp.n_layer);
    // Placement by tensor class (tensor_overrides; model::host_kept_tensors): what of the device's
    // share stays on the host. The rules' devices and patterns are checked without a device too.
    model::HostKept kept;
    if (!params.tensor_overrides.empty()) {
        kept = model::host_kept_tensors(shape.tensor_entries(), hp, n_device > 0 ? params.n_gpu_layers : 0,
                                        n_device > 0 ? params.device : std::string(), params.tensor_overrides);
    }
    const bool output_on_device = params.n_gpu_layers > hp.n_layer && !kept.output;
    const int first_device = hp.n_layer - n_device;
    const int first_streamed = first_device - std::min(params.n_streamed_layers, first_device);
    // Only layers left on the host stream (model::place_layers refuses more).
    p.params.n_streamed_layers = first_device - first_streamed;
    // A unified device reads its layers' weights in place (they stay resident on the host) and
    // charges its KV and scratch to the host's pools.
    const bool unified = !params.device.empty() && params.unified;

    // Weights: mapped; the first layers stay resident, the last n_streamed_layers stream through
    // a buffer of two layers; offloaded ones are copied to the device and leave the host.
    p.weights_resident = shape.global_bytes;
    if (output_on_device && !shape.tied_output && !unified) p.weights_resident -= shape.output_bytes;
    // Streaming (short of memory), the token embedding is read a row per token and not read in
    // whole (engine::prefault): a batch's rows, one or two pages each. Tied to the output, every
    // row is read at each step.
    if (params.n_streamed_layers > 0 && !shape.tied_output && shape.token_embd_bytes > 0) {
        const uint64_t rows =
            static_cast<uint64_t>(params.n_batch) * (round_up(shape.token_embd_row_bytes, kPageBytes) + kPageBytes);
        p.weights_resident -= shape.token_embd_bytes - std::min(shape.token_embd_bytes, rows);
    }
    uint64_t largest_streamed = 0;
    for (int il = 0; il < hp.n_layer; ++il) {
        const auto i = static_cast<size_t>(il);
        const uint64_t b = shape.layer_bytes[i];
        if (il >= first_device) {
            if (unified) p.weights_resident += b;  // read in place; else copied to the device (below)
            continue;
        } else if (il < first_streamed) {
            p.weights_resident += b;
        } else {
            p.weights_streamed += b;
            largest_streamed =
                std::max(largest_streamed, i < shape.layer_stream_bytes.size() ? shape.layer_stream_bytes[i] : b);
        }
    }
    if (params.n_gpu_layers > 0 && !unified) {
        const auto n = static_cast<size_t>(n_device + (output_on_device ? 1 : 0));
        p.device.weights = n < shape.device_weight_bytes.size() ? shape.device_weight_bytes[n] : 0;
    }
    if (unified) {
        for (int il = first_device; il < hp.n_layer; ++il) p.device.weights_in_place += shape.layer_bytes[size_t(il)];
        if (output_on_device) p.device.weights_in_place += shape.output_bytes;
    }
    // An offloaded layer's router stays on the host, which routes (model::is_router_tensor): in its
    // resident weights, wherever the experts run.
    for (int il = first_device; il < hp.n_layer; ++il) {
        const auto i = static_cast<size_t>(il);
        if (!kept.experts.empty() && kept.experts[i]) continue;  // counted with the kept block below
        if (unified) {
            p.device.weights_in_place -= shape.layer_router_bytes[i];
        } else {
            p.weights_resident += shape.layer_router_bytes[i];
        }
    }
    // Placement by tensor class: the routed-expert blocks kept on the host stay in its resident
    // weights and are not copied (model::DeviceWeights).
    if (n_device > 0 && !params.tensor_overrides.empty()) {
        const std::vector<bool>& host = kept.experts;
        for (int il = first_device; il < hp.n_layer; ++il) {
            const auto i = static_cast<size_t>(il);
            if (!host[i]) continue;
            ++p.device.n_host_expert_layers;
            p.device.host_experts += shape.layer_routed_bytes[i];
            if (unified) {
                p.device.weights_in_place -= shape.layer_routed_bytes[i];
            } else {
                p.device.weights -= shape.layer_routed_device_bytes[i];
                p.weights_resident += shape.layer_routed_bytes[i];
            }
        }
        // The other matrices kept on the host (KV-only offload: all of them): in its resident
        // weights, multiplied there (their rows cross through the host's activations, planned).
        for (const std::string& name : kept.matrices) {
            const auto i = static_cast<size_t>(shape.tensor_index(name));
            ++p.device.n_host_matrices;
            p.device.host_matrices += shape.tensor_bytes[i];
            if (unified) {
                p.device.weights_in_place -= shape.tensor_bytes[i];
            } else {
                p.device.weights -= model::device_copy_bytes(shape.tensor_bytes[i]);
                p.weights_resident += shape.tensor_bytes[i];
            }
        }
    }
    // The offloaded layers whose routed experts run on the device (copied with the layer, in its
    // weights above): their buffers in its scratch (model::device_scratch_bytes).
    const bool experts_on_device = hp.is_moe() && n_device > p.device.n_host_expert_layers;
    // As model::LayerStream charges its "staging" pool (model::stream_staging_bytes).
    p.stream_buffer =
        largest_streamed == 0 ? 0 : model::kStreamBuffers * memory::PoolBuffer<std::byte>::bytes_for(largest_streamed);

    // KV: kv::ModelCache's pools (see kv/cache.h); the offloaded layers' on the device.
    p.kv_pools = kv_plan(hp, kv_cells(params.n_ctx, params.n_seq, params.context_shift),
                         params.n_seq + params.n_cached_prompts, params.n_batch, params.type_k, params.type_v,
                         params.kv_resident_limit, params.kv_offload ? n_device : 0, params.kv_rotation);
    for (const KvPoolPlan& pool : p.kv_pools) {
        (pool.on_device ? p.device.kv : p.kv) += pool.bytes;
        if (pool.on_device && unified) p.kv += pool.bytes;  // the host's "kv" pool holds it
        p.kv_spilled += pool.spilled;
    }

    // Scratch: the forward pass's activations (model/activations.h) for n_batch tokens, the
    // batch's positions, and one ops::Scratch (its largest single request, 64 bytes of alignment).
    const auto nb = static_cast<uint64_t>(params.n_batch);
    const model::ActivationLayout layout = model::activation_layout(hp, params.n_batch);
    p.activations = layout.floats() * sizeof(float) + nb * sizeof(int32_t) * 2;  // + seq ids, positions
    // The offload device's matmuls: those of its layers and the output layer's when it is there,
    // less the matrices kept on the host (the host multiplies by them, with its own scratch).
    const std::unordered_set<std::string_view> host_matrices(kept.matrices.begin(), kept.matrices.end());
    const auto on_device = [&](const ModelShape::Matmul& m) {
        if (m.output) return output_on_device;
        const std::string& name = shape.tensor_names[static_cast<size_t>(m.tensor)];
        const int il = tensor_layer(name);
        if (il < first_device || host_matrices.contains(name)) return false;
        return !(model::is_routed_block_tensor(name) && static_cast<size_t>(il) < kept.experts.size() &&
                 kept.experts[static_cast<size_t>(il)]);
    };
    uint64_t device_matmul_scratch = 0;
    for (const ModelShape::Matmul& m : shape.matmuls) {
        const quant::GgmlType act = quant::dot_activation_type(m.type);
        if (act == quant::GgmlType::F32) continue;  // multiplies the floats as they are
        const auto rows = static_cast<uint64_t>(m.output ? std::min(params.n_outputs, params.n_batch)
                                                : m.ffn  ? layout.ffn_slice
                                                         : params.n_batch);
        const auto row = quant::row_bytes(act, static_cast<uint64_t>(m.cols));
        if (!row) continue;
        p.matmul_scratch = std::max(p.matmul_scratch, *row * rows);
        if (n_device > 0 && on_device(m)) device_matmul_scratch = std::max(device_matmul_scratch, *row * rows);
    }
    ops::AttentionParams ap;
    ap.n_head = hp.n_head;
    ap.n_head_kv = hp.n_head_kv;
    ap.head_dim = hp.head_dim;
    p.attention_scratch = ops::attention_kv_scratch_bytes(params.n_batch, ap, params.n_threads);
    p.scratch = p.activations + std::max(p.matmul_scratch, p.attention_scratch) + 64;

    p.logits = uint64_t(hp.n_vocab) * sizeof(float) * static_cast<uint64_t>(params.n_outputs);
    p.prompt_cache =
        params.prompt_cache_ram + params.prompt_cache_disk / fitllm::ContextConfig::kPromptCacheDiskIndexShare;
    p.samplers = static_cast<uint64_t>(params.n_seq) * sampling::Sampler::workspace_bytes(hp.n_vocab);
    // The scheduler's cached prompts (ContextConfig::n_cached_prompts) keep their tokens: at most
    // the context each.
    const uint64_t cached_prompt_tokens =
        static_cast<uint64_t>(params.n_cached_prompts) * static_cast<uint64_t>(params.n_ctx) * sizeof(int32_t);
    p.overhead = kFixedOverhead + kMetadataFactor * shape.metadata_bytes + p.samplers + cached_prompt_tokens;

    // The expert cache: the experts leave the resident weights for slots (make_plan refused it
    // with streamed or offloaded layers); auto: as many slots as the budget holds after the rest.
    if (params.expert_slots > 0 || params.expert_slots == PlanParams::kExpertSlotsAuto) {
        const int all = hp.n_expert * hp.n_layer;
        const uint64_t slot = shape.expert_slot_bytes;
        p.weights_resident -= std::min(p.weights_resident, shape.expert_bytes);
        int slots = params.expert_slots;
        if (slots == PlanParams::kExpertSlotsAuto) {
            const uint64_t rest = p.total();
            const uint64_t left = params.budget > rest ? params.budget - rest : 0;
            const uint64_t fit = left > model::kExpertAlign ? (left - model::kExpertAlign) / slot : 0;
            slots = static_cast<int>(std::min<uint64_t>(fit, static_cast<uint64_t>(all)));
            slots = std::max(slots, model::min_expert_slots(hp));
        }
        slots = std::min(slots, all);
        p.n_expert_slots = slots;
        p.expert_cache = model::expert_cache_bytes(slot, slots);
        p.experts_on_demand = shape.expert_bytes;
        p.expert_miss_rate = 1.0 - static_cast<double>(slots) / static_cast<double>(all);
        const double per_expert = static_cast<double>(shape.expert_bytes) / static_cast<double>(all);
        p.expert_read_per_token =
            static_cast<uint64_t>(static_cast<double>(hp.n_expert_used) * hp.n_layer * per_expert * p.expert_miss_rate);
    }

    if (!params.device.empty()) {
        p.device.name = params.device;
        p.device.capacity = params.vram;
        p.device.n_layer = n_device;
        p.device.output = output_on_device;
        if (n_device > 0) {
            // Its activations for n_batch tokens and the logits of n_outputs rows when the output
            // layer is there (model::device_scratch_bytes), and op scratch as the host's (the
            // virtual device runs the host's kernels). The crossings use the host's activations
            // and logits: nothing more on the host.
            p.device.scratch = model::device_scratch_bytes(hp, params.n_gpu_layers, params.n_batch, params.n_outputs,
                                                           /*output_on_host=*/!output_on_device, experts_on_device) +
                               std::max(device_matmul_scratch, p.attention_scratch) + 64;
            p.device_host = backend::host_bytes_for(params.device);
        }
        if (unified) {
            p.device.unified = true;
            p.device.capacity = 0;  // one budget: the host's
            p.scratch += p.device.scratch;
        }
    }
    return p;
}

}  // namespace

Plan make_plan(const ModelShape& shape, PlanParams params) {
    const model::Hparams& hp = shape.hp;
    if (params.n_ctx == 0) params.n_ctx = hp.n_ctx_train;
    if (params.n_outputs == 0) params.n_outputs = params.n_seq;
    if (params.n_threads <= 0) params.n_threads = ops::physical_core_count();  // as ops::ThreadPool
    const auto positive = [](int v, const char* what) {
        if (v < 1) throw std::invalid_argument(std::string(what) + " " + std::to_string(v) + " must be at least 1");
    };
    positive(params.n_ctx, "context size (-c)");
    positive(params.n_seq, "sequences (-np)");
    positive(params.n_batch, "batch size (-b)");
    positive(params.n_outputs, "output rows");
    if (params.n_cached_prompts < 0 || params.n_seq + params.n_cached_prompts > kv::kMaxSequences) {
        throw std::invalid_argument("sequences (-np) " + std::to_string(params.n_seq) + " and cached prompts " +
                                    std::to_string(params.n_cached_prompts) + ": together at most " +
                                    std::to_string(kv::kMaxSequences));
    }
    if (params.n_seq > kv::kMaxSequences) {
        throw std::invalid_argument("sequences (-np) " + std::to_string(params.n_seq) + " outside 1.." +
                                    std::to_string(kv::kMaxSequences));
    }
    for (const quant::GgmlType t : {params.type_k, params.type_v}) {
        if (!kv::is_kv_type(t)) throw std::invalid_argument("KV type " + type_str(t) + " is not one the cache stores");
    }
    params.n_streamed_layers = std::clamp(params.n_streamed_layers, 0, hp.n_layer);
    if (params.expert_slots > 0 || params.expert_slots == PlanParams::kExpertSlotsAuto) {
        const std::string what = params.expert_slots > 0
                                     ? "an expert cache of " + std::to_string(params.expert_slots) + " slots"
                                     : std::string("an expert cache");
        if (!hp.is_moe() || shape.expert_slot_bytes == 0) {
            throw std::invalid_argument(what + ": " + shape.source + " (" + hp.arch +
                                        ") has no routed experts to cache");
        }
        if (params.n_streamed_layers > 0) {
            throw std::invalid_argument(what + " does not go with streamed layers (--stream-layers " +
                                        std::to_string(params.n_streamed_layers) + ")");
        }
        if (!params.device.empty()) {
            throw std::invalid_argument(what + " does not go with an offload device (" + params.device +
                                        "): the cache serves the host's layers only, and offloaded layers' experts "
                                        "are on the device or kept mapped on the host (--cpu-moe)");
        }
        const int min_slots = model::min_expert_slots(hp);
        if (params.expert_slots > 0 && params.expert_slots < min_slots) {
            throw std::invalid_argument(what + " is too small: it needs at least " + std::to_string(min_slots) + " (" +
                                        std::to_string(hp.n_expert_used) + " experts used x " +
                                        std::to_string(hp.n_layer) + " layers, one token's experts)");
        }
    }
    if (params.device.empty()) {
        if (params.n_gpu_layers > 0) {
            throw std::invalid_argument("-ngl " + std::to_string(params.n_gpu_layers) +
                                        " offloads layers, but no device is given (--device)");
        }
        params.n_gpu_layers = 0;
        params.unified = false;
        return plan_for(shape, params);
    }
    if (params.unified) {
        params.vram = 0;  // one budget
        // Auto: every layer the host does not stream (memory is the same; the device computes faster).
        if (params.n_gpu_layers < 0) {
            params.n_gpu_layers = params.n_streamed_layers > 0 ? hp.n_layer - params.n_streamed_layers : hp.n_layer + 1;
        }
    }
    if (params.n_gpu_layers >= 0) {
        params.n_gpu_layers = std::min(params.n_gpu_layers, hp.n_layer + 1);
        return plan_for(shape, params);
    }
    // Auto: the most layers whose share fits the device (the output layer counts as one more).
    std::optional<Plan> best;
    for (int n = hp.n_layer + 1; n >= 0; --n) {
        params.n_gpu_layers = n;
        std::optional<Plan> q;
        try {
            q = plan_for(shape, params);
        } catch (const std::invalid_argument&) {
            if (n == 0) throw;
            continue;  // a placement the runtime refuses at n (a mixture of experts without --cpu-moe)
        }
        if (q->device.fits()) return *q;
        if (n == 0) best = std::move(q);
    }
    return *best;
}

Plan fit_plan(const ModelShape& shape, PlanParams params) {
    const model::Hparams& hp = shape.hp;
    // With the offloaded layers left to the plan (n_gpu_layers < 0), each new setting offloads as
    // many as the device then holds.
    const bool auto_offload = !params.device.empty() && params.n_gpu_layers < 0;
    const auto plan = [&](PlanParams q) {
        if (auto_offload) q.n_gpu_layers = -1;
        return make_plan(shape, q);
    };
    Plan p = plan(params);
    p.fitted = true;
    const uint64_t budget = p.params.budget;
    std::vector<FitStep> steps;
    if (auto_offload) {
        const DevicePlan& d = p.device;
        steps.push_back({"offload " + std::to_string(d.n_layer) + " of " + std::to_string(hp.n_layer) + " layers" +
                             (d.output ? " and the output layer" : "") + " to " + d.name,
                         d.unified ? d.name + " shares the host's memory (unified): every layer not streamed runs there"
                         : d.capacity == 0 ? "no --vram limit: every layer goes to the device"
                                           : "the most that fit its " + util::human_bytes(d.capacity) + " (" +
                                                 util::human_bytes(d.total()) + " planned there)"});
    }
    if (p.fits()) {
        p.fit_steps = std::move(steps);
        return p;
    }
    const auto over = [&](const Plan& q) {
        if (q.total() > budget) return "over budget by " + util::human_bytes(q.total() - budget);
        if (!q.device.fits()) {
            return q.device.name + " over its " + util::human_bytes(q.device.capacity) + " by " +
                   util::human_bytes(q.device.total() - q.device.capacity);
        }
        return std::string("fits");
    };

    // 1. Quantize K and V: same context, less memory per token; q8_0 costs little quality.
    for (const quant::GgmlType t : {quant::GgmlType::Q8_0, quant::GgmlType::Q4_0}) {
        if (p.fits()) break;
        PlanParams next = p.params;
        const auto smaller = [&](quant::GgmlType cur) {
            const auto a = quant::row_bytes(t, 32), b = quant::row_bytes(cur, 32);
            return a && b && *a < *b;
        };
        if (!smaller(next.type_k) && !smaller(next.type_v)) continue;
        if (hp.head_dim % 32 != 0 || hp.head_dim_v % 32 != 0) {
            steps.push_back({"KV cache stays " + type_str(next.type_k) + "/" + type_str(next.type_v),
                             "head size " + std::to_string(hp.head_dim) + " is not whole blocks of 32 values"});
            break;
        }
        if (smaller(next.type_k)) next.type_k = t;
        if (smaller(next.type_v)) next.type_v = t;
        Plan q = plan(next);
        const std::string from = type_str(p.params.type_k) + "/" + type_str(p.params.type_v);
        const std::string to = type_str(next.type_k) + "/" + type_str(next.type_v);
        if (q.total() >= p.total()) {
            // 4-bit keys carry a fixed part per layer (their fitted transform, kv/key_transform.h)
            // that a short context's cells do not pay back.
            steps.push_back({"KV cache stays " + from, to + " would take " + util::human_bytes(q.kv) + " against " +
                                                           util::human_bytes(p.kv) +
                                                           " (its K transforms outweigh what the cells save at this "
                                                           "context)"});
            continue;
        }
        steps.push_back({"KV cache " + from + " -> " + to,
                         over(p) + " with the KV cache taking " + util::human_bytes(p.kv) + "; quantizing it saves " +
                             util::human_bytes(p.total() - q.total()) + " and keeps the context of " +
                             std::to_string(p.params.n_ctx) + " tokens (" + over(q) + ")"});
        p = std::move(q);
    }

    // 2a. A mixture of experts: the dense weights resident, the routed experts in a cache of as
    // many slots as the budget holds (reading an expert on a miss costs less than streaming its
    // whole layer, every expert of it, at each token).
    if (!p.fits() && hp.is_moe() && p.params.expert_slots == PlanParams::kExpertSlotsNotSet &&
        p.params.n_streamed_layers == 0 && p.params.device.empty() && shape.expert_slot_bytes > 0) {
        PlanParams next = p.params;
        next.expert_slots = PlanParams::kExpertSlotsAuto;
        Plan q = plan(next);
        const int all = hp.n_expert * hp.n_layer;
        if (q.fits()) {
            steps.push_back(
                {"expert cache of " + std::to_string(q.n_expert_slots) + " of " + std::to_string(all) + " experts",
                 over(p) + " with every expert resident; the dense weights (" + util::human_bytes(shape.dense_bytes()) +
                     ") stay resident and the routed experts (" + util::human_bytes(shape.expert_bytes) +
                     ") are read from the file on demand into " + std::to_string(q.n_expert_slots) + " slots of " +
                     util::human_bytes(shape.expert_slot_bytes) + " (" + util::human_bytes(q.expert_cache) + ")"});
            p = std::move(q);
        } else {
            steps.push_back({"no expert cache", expert_cache_shortfall(q) + "; streaming whole layers instead"});
        }
    }

    // 2. Stream the last layers' weights: as few as needed (at least as many as asked for); not
    // with an expert cache.
    const int min_streamed = p.params.n_streamed_layers;
    const int max_streamed = p.n_expert_slots > 0 ? min_streamed : hp.n_layer;
    const auto fewest_streamed = [&](PlanParams base) -> std::optional<Plan> {
        for (int n = min_streamed; n <= max_streamed; ++n) {
            base.n_streamed_layers = n;
            Plan q = plan(base);
            if (q.fits()) return q;
        }
        return std::nullopt;
    };
    // The smallest plan over every number of streamed layers (ties: fewer layers); streaming
    // costs buffers, so with small layers it may never pay.
    const auto smallest_streamed = [&](PlanParams base) {
        base.n_streamed_layers = min_streamed;
        Plan best = plan(base);
        for (int n = min_streamed + 1; n <= max_streamed; ++n) {
            base.n_streamed_layers = n;
            Plan q = plan(base);
            if (q.total() < best.total()) best = std::move(q);
        }
        return best;
    };
    if (!p.fits() && p.n_expert_slots == 0) {
        const Plan before = p;
        p = fewest_streamed(p.params).value_or(smallest_streamed(p.params));
        if (p.params.n_streamed_layers > before.params.n_streamed_layers) {
            steps.push_back(
                {"stream the weights of " + std::to_string(p.params.n_streamed_layers) + " of " +
                     std::to_string(hp.n_layer) + " layers",
                 over(before) +
                     (before.params.n_streamed_layers == 0
                          ? std::string(" with every layer resident")
                          : " with " + std::to_string(before.params.n_streamed_layers) + " layers streamed") +
                     "; streaming " + util::human_bytes(p.weights_streamed) + " of weights through a " +
                     util::human_bytes(p.stream_buffer) + " buffer keeps the context (" + over(p) + ")" +
                     (auto_offload && p.device.unified ? "; the streamed layers run on the host, the other " +
                                                             std::to_string(p.device.n_layer) + " on " + p.device.name
                                                       : std::string())});
        } else {
            steps.push_back({"no more layers streamed", "the stream buffers (" +
                                                            util::human_bytes(plan([&] {
                                                                                  PlanParams all = p.params;
                                                                                  all.n_streamed_layers = hp.n_layer;
                                                                                  return all;
                                                                              }())
                                                                                  .stream_buffer) +
                                                            " for every layer) would cost more than they save"});
        }
    }

    // 3. Shorten the context, as the last resort, streaming as few layers as each length needs.
    if (!p.fits()) {
        const Plan before = p;
        PlanParams next = p.params;
        next.n_streamed_layers = min_streamed;
        const int floor_ctx = std::min(next.n_ctx, std::max(kMinFitContext, next.n_batch));
        bool found = false;
        while (next.n_ctx > floor_ctx && !found) {
            next.n_ctx = std::max(floor_ctx, next.n_ctx / 2);
            if (auto q = fewest_streamed(next)) {
                p = std::move(*q);
                found = true;
            }
        }
        if (found) {
            steps.push_back({"context " + std::to_string(before.params.n_ctx) + " -> " +
                                 std::to_string(p.params.n_ctx) + " tokens" +
                                 (p.params.n_streamed_layers
                                      ? ", streaming " + std::to_string(p.params.n_streamed_layers) + " layers"
                                      : std::string()),
                             over(before) + " even with the KV cache quantized and layers streamed; " +
                                 std::to_string(p.params.n_ctx) + " tokens is the longest context that fits"});
        } else {
            next.n_ctx = floor_ctx;
            p = smallest_streamed(next);
            steps.push_back({"nothing fits", "even " + std::to_string(floor_ctx) + " tokens of context with a " +
                                                 type_str(next.type_k) + "/" + type_str(next.type_v) +
                                                 " KV cache and " + std::to_string(p.params.n_streamed_layers) +
                                                 " of " + std::to_string(hp.n_layer) + " layers streamed needs " +
                                                 util::human_bytes(p.total()) + "; the budget is " +
                                                 util::human_bytes(budget) +
                                                 (p.device.fits() ? std::string() : " (and " + over(p) + ")")});
        }
    }
    p.fit_steps = std::move(steps);
    p.fitted = true;
    return p;
}

}  // namespace fitllm::engine
