#pragma once
// The plan (docs/architecture.md, idea 3): from a GGUF header alone, the bytes a run will take on each
// device — weights (resident or streamed), KV cache, scratch, outputs, overhead — for a context,
// batch, sequence count and KV type, and whether that fits the budget. fit_plan() changes the
// settings until it does: it quantizes the KV cache first, then streams weights, and shortens
// the context only as the last resort, saying what it chose and why.
//
//   auto file = gguf::GgufFile::open(path);
//   engine::ModelShape shape = engine::model_shape(file);
//   engine::Plan p = engine::make_plan(shape, {.n_ctx = 8192, .budget = memory::parse_size("1G")});
//   if (!p.fits()) p = engine::fit_plan(shape, p.params);
//
// The KV numbers follow kv::ModelCache's pools byte for byte (KvCache::bytes()); the scratch
// numbers follow model/decoder.h's Activations and ops' scratch sizes for a batch of n_batch.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "model/tensor_override.h"
#include "quant/ggml_type.h"

namespace fitllm::model {
struct TensorEntry;  // model/offload.h
}  // namespace fitllm::model

namespace fitllm::engine {

// What the plan needs from a model file, read once.
struct ModelShape {
    std::string source;  // the file
    model::Hparams hp;
    uint64_t file_bytes = 0;
    uint64_t metadata_bytes = 0;        // the header, metadata and tensor infos (before the data section)
    uint64_t global_bytes = 0;          // tensors outside the layers: embeddings, output, final norm
    std::vector<uint64_t> layer_bytes;  // blk.<i>.* tensors, per layer
    // The staging buffer streaming layer i takes (model::stream_buffer_bytes: its file range,
    // aligned for O_DIRECT); empty: layer_bytes stand in for it.
    std::vector<uint64_t> layer_stream_bytes;
    // The matrices a forward pass multiplies activations with (layer weights and the output
    // projection), as the types and widths that size ops::matmul's activation scratch.
    struct Matmul {
        quant::GgmlType type;
        int64_t cols;
        bool output;  // the output projection: n_outputs rows instead of n_batch
        bool ffn;     // a feed-forward matrix: the rows of an FFN slice (model::ffn_slice_tokens)
        int tensor;   // its index in tensor_names
    };
    std::vector<Matmul> matmuls;
    // The token embedding (looked up a row per token) and the output layer (output norm and
    // matrix; with tied embeddings the matrix is the token embedding itself).
    uint64_t token_embd_bytes = 0;
    uint64_t token_embd_row_bytes = 0;
    bool tied_output = false;
    uint64_t output_bytes = 0;  // output norm + output matrix (the token embedding when tied)
    // What an offload device's "weights" pool holds with the last n layers there (index n,
    // 0..n_layer + 1; model::device_weight_bytes).
    std::vector<uint64_t> device_weight_bytes;
    // Mixture of experts: the routed experts' tensors (blk.<i>.ffn_{gate,up,down}_exps.weight,
    // model::is_expert_tensor), in layer_bytes too; the rest of the file is the dense part
    // (attention, norms, embeddings, output, router, shared experts).
    uint64_t expert_bytes = 0;                 // all layers'
    std::vector<uint64_t> layer_expert_bytes;  // per layer
    uint64_t shared_expert_bytes = 0;          // of the dense part: the shared experts' (ffn_*_shexp), qwen2moe's
    uint64_t expert_slot_bytes = 0;            // one expert cache slot (model::expert_slot_bytes); 0: no experts
    // Placement by tensor class (PlanParams::tensor_overrides): the file's tensor names, and per
    // layer its routed-expert block (router and ffn_{gate,up,down}_exps, model::is_routed_block_tensor)
    // as file bytes and as the device's copies of them (model::device_copy_bytes each).
    std::vector<std::string> tensor_names;
    std::vector<int> tensor_dims;                            // of each tensor in tensor_names
    std::vector<uint64_t> tensor_bytes;                      // of each tensor in tensor_names, in the file
    std::vector<model::TensorEntry> tensor_entries() const;  // names and dims, for model::host_kept_tensors
    int tensor_index(std::string_view name) const;           // in tensor_names; std::logic_error when none
    std::vector<uint64_t> layer_routed_bytes;
    std::vector<uint64_t> layer_routed_device_bytes;  // less the router (never copied)
    std::vector<uint64_t> layer_router_bytes;         // the router's (model::is_router_tensor), in the file
    uint64_t dense_bytes() const;                     // tensor bytes less expert_bytes
};

// The layer of a tensor: "blk.12.attn_q.weight" -> 12; -1 for tensors outside the layers.
int tensor_layer(std::string_view name);

// Throws model::ModelError for what model::read_hparams refuses.
ModelShape model_shape(const gguf::GgufFile& file);

struct PlanParams {
    int n_ctx = 2048;          // tokens the context holds, all sequences together (-c); 0: the model's training context
    int n_seq = 1;             // sequences sharing the cache (-np)
    int n_cached_prompts = 0;  // more sequence ids: the prompts the scheduler keeps (ContextConfig)
    uint64_t prompt_cache_ram = 0;   // host bytes for kept prompts evicted from the KV cache (ContextConfig)
    uint64_t prompt_cache_disk = 0;  // file bytes below them (ContextConfig; their token lists in host memory)
    bool context_shift = false;      // the cache keeps room for a context shift's holes (kv_cells)
    int n_batch = 512;               // tokens per forward pass (-b)
    int n_outputs = 0;               // rows of logits per forward pass; 0: one per sequence
    quant::GgmlType type_k = quant::GgmlType::F16;  // -ctk
    quant::GgmlType type_v = quant::GgmlType::F16;  // -ctv
    bool kv_rotation = true;                        // --no-kv-rotation: false (kv::CacheParams::rotate)
    int n_threads = 0;                              // for the attention scratch; 0: the physical cores
    uint64_t budget = 0;                            // host bytes
    int n_streamed_layers = 0;                      // the last n layers stream instead of staying resident
    uint64_t kv_resident_limit = 0;  // KV spill (--kv-spill-dir, --kv-resident): K/V bytes kept in memory; 0: all
    // The expert cache (model/expert_cache.h) of a mixture-of-experts model: the routed experts
    // in this many slots charged to the budget, read from the file on demand, the dense weights
    // resident. 0 (and kExpertSlotsNotSet): none, every expert resident; kExpertSlotsAuto: as many
    // slots as the budget holds after the rest of the plan (at least model::min_expert_slots,
    // at most every expert). fit_plan() picks the cache itself when it is kExpertSlotsNotSet.
    // Not with streamed or offloaded layers.
    int expert_slots = kExpertSlotsNotSet;
    static constexpr int kExpertSlotsNotSet = -2;
    static constexpr int kExpertSlotsAuto = -1;
    // Offload (docs/architecture.md idea 6): a device (--device; empty: none) that runs the last
    // n_gpu_layers layers (-ngl; more than n_layer: the output layer too), holding their weights
    // and, with kv_offload, their KV cache. n_gpu_layers < 0: as many as fit vram (all when vram
    // is 0). vram: the device's capacity (--vram); 0: no limit known.
    std::string device;
    int n_gpu_layers = 0;
    uint64_t vram = 0;
    bool kv_offload = true;
    // Tensors of offloaded layers kept on the host (--override-tensor / -ot, --cpu-moe, --n-cpu-moe;
    // model/tensor_override.h): an offloaded layer splits at its routed-expert block, which stays
    // in the host's resident weights and runs there (model::experts_on_host refuses other splits).
    std::vector<model::TensorOverride> tensor_overrides;
    // The device shares the host's memory (backend::Backend::unified(), --unified): its layers
    // read their weights in place (they stay in weights_resident), its KV and scratch are the
    // host's (in Plan::kv and Plan::scratch), and there is one budget (vram is ignored). With
    // n_gpu_layers < 0 every layer that does not stream runs there (and the output layer, when
    // none streams).
    bool unified = false;
};

// The cells a KV cache gets for a context of n_ctx tokens: n_ctx, plus a block for each sequence
// when several share the cache (each may hold a partly used last block), plus two blocks with a
// context shift (the partly emptied blocks at the edges of the range it drops). The plan and every
// cache a context makes (engine::Engine::make_cache) take their cells from here.
int kv_cells(int n_ctx, int n_seq, bool context_shift);

// One pool of the KV cache (kv::ModelCache): the full-attention layers, or the layers of one
// sliding window.
struct KvPoolPlan {
    int window = 0;  // 0: full attention
    int n_layer = 0;
    int n_cells = 0;         // rounded to blocks
    uint64_t bytes = 0;      // in memory (KvCache::bytes())
    uint64_t spilled = 0;    // K/V that lives in the spill file instead (kv_resident_limit)
    bool on_device = false;  // the KV of offloaded layers, on the offload device
};

// What the offload device holds: the weights of its layers, their KV cache (kv_offload) and the
// working memory of a forward pass through them.
// Unified (PlanParams::unified): the device's share is part of the host's numbers (weights 0,
// kv and scratch counted in Plan::kv and Plan::scratch too) and has no capacity of its own.
struct DevicePlan {
    std::string name;
    uint64_t capacity = 0;  // 0: no limit known
    int n_layer = 0;        // the last n_layer layers run on it
    bool output = false;    // and the output layer
    bool unified = false;
    uint64_t weights = 0;
    uint64_t weights_in_place = 0;  // unified: the file bytes of its tensors, read in place (host's resident weights)
    // Of its layers, those whose routed-expert blocks stay on the host (tensor_overrides), and those
    // blocks' file bytes (in the host's weights_resident, not in weights).
    int n_host_expert_layers = 0;
    uint64_t host_experts = 0;
    // Other weight matrices of its layers kept on the host (tensor_overrides, e.g. -ot '.*=CPU': KV-only
    // offload), multiplied there: how many, and their file bytes (in weights_resident, not in weights).
    int n_host_matrices = 0;
    uint64_t host_matrices = 0;
    uint64_t kv = 0;
    uint64_t scratch = 0;
    uint64_t total() const { return weights + kv + scratch; }
    bool fits() const { return unified || capacity == 0 || total() <= capacity; }
};

// What fit_plan() changed, and why.
struct FitStep {
    std::string change;  // "KV cache f16 -> q8_0"
    std::string reason;  // "over budget by 312 MiB; saves 256 MiB"
};

struct Plan {
    ModelShape shape;
    PlanParams params;  // as planned: n_ctx resolved, and after fit_plan() the chosen settings

    uint64_t weights_resident = 0;  // mapped and kept in memory
    uint64_t weights_streamed = 0;  // read from the file layer by layer, not counted in the total
    uint64_t stream_buffer = 0;     // model::kStreamBuffers buffers of the largest streamed layer
    // The expert cache (PlanParams::expert_slots): n_expert_slots slots of shape.expert_slot_bytes
    // (expert_cache bytes, charged to the "experts" pool, in weights()); the experts then leave
    // weights_resident and are read from the file on a miss (experts_on_demand, not in the
    // total). expert_miss_rate and expert_read_per_token: what a token is expected to read,
    // assuming uniform, independent routing (each of a layer's experts as likely, token after
    // token), under which a least-recently-used cache of S of the N experts hits S / N of the
    // lookups: n_expert_used x n_layer x the average expert's bytes x (1 - S / N).
    int n_expert_slots = 0;
    uint64_t expert_cache = 0;
    uint64_t experts_on_demand = 0;
    double expert_miss_rate = 0.0;
    uint64_t expert_read_per_token = 0;
    uint64_t kv = 0;          // in memory
    uint64_t kv_spilled = 0;  // in the spill file, not in the total
    std::vector<KvPoolPlan> kv_pools;
    uint64_t activations = 0;        // model/activations.h layout + batch positions, for n_batch tokens
    uint64_t matmul_scratch = 0;     // the largest quantized activation block of one matmul
    uint64_t attention_scratch = 0;  // ops::attention_kv_scratch_bytes
    uint64_t scratch = 0;            // activations + max(matmul, attention) scratch
    uint64_t logits = 0;             // n_vocab floats per output row
    uint64_t prompt_cache = 0;       // kept prompts' K/V rows in host memory (PlanParams::prompt_cache_ram), and
                                     // the token lists of those on disk (prompt_cache_disk / its index share)
    uint64_t overhead = 0;           // see kFixedOverhead
    uint64_t samplers = 0;           // of the overhead: the sequences' samplers' candidate lists
    // Host memory the offload device's path keeps (backend::host_bytes_for: a CUDA device's pinned
    // staging buffer), charged to the host's "staging" pool; fixed, whatever the context.
    uint64_t device_host = 0;

    // The offload device's share; name empty (and every number 0) without one.
    DevicePlan device;

    uint64_t weights() const { return weights_resident + stream_buffer + expert_cache; }
    uint64_t total() const {  // the host's
        return weights() + kv + scratch + logits + prompt_cache + overhead + device_host;
    }
    bool fits() const { return total() <= params.budget && device.fits(); }

    std::vector<FitStep> fit_steps;  // empty unless fit_plan() changed something (or chose the offload)
    bool fitted = false;             // fit_plan() ran
    // > 0: a draft model's plan (engine::Engine::load with a draft model): draft_slots copies of
    // its KV cache and its row of logits (serve: a draft session per slot), and no runtime or
    // samplers in the overhead (the model's plan has them).
    int draft_slots = 0;
};

// What the plan adds besides weights, KV, scratch and outputs: kFixedOverhead for the executable,
// the C++ runtime and the thread pool's stacks, plus kMetadataFactor times the GGUF metadata
// bytes (mapped, and the tokenizer's vocabulary, merges and lookup tables built from it), plus
// a sampler's candidate list per sequence (sampling::Sampler::workspace_bytes: n_vocab
// candidates each).
// Measured with `fitllm run` / `fitllm tokenize` under /usr/bin/time: the tiny test model's whole
// run peaks at 6.4 MiB; the demo model's tokenizer (262144 tokens, 6.2 MiB of metadata) adds
// 38 MiB over `fitllm inspect`, about 6x its metadata.
inline constexpr uint64_t kFixedOverhead = uint64_t{8} << 20;
inline constexpr uint64_t kMetadataFactor = 8;

// The plan for these settings; n_gpu_layers < 0 (with a device) resolves to the most layers the
// device holds within vram. Throws std::invalid_argument for settings the runtime refuses
// (non-positive sizes, a KV type that is not one, head sizes that are not whole blocks of it,
// layers offloaded without a device).
Plan make_plan(const ModelShape& shape, PlanParams params);

// make_plan(), then, while it does not fit: quantize K/V (f16 -> q8_0 -> q4_0); for a mixture of
// experts (expert_slots not set, nothing streamed or offloaded), an expert cache of as many slots
// as the budget holds when the fewest fit (then no layer streams); else stream the
// weights of the last layers (as few as needed, at least params.n_streamed_layers), and only then halve the context
// (down to 256 cells or n_batch), streaming as few layers as that context needs. With a device and
// n_gpu_layers < 0, every setting offloads as many layers as the device holds (the first step
// says how many). Each change is a FitStep. The result may still not fit (fits() false; the last
// step says why).
Plan fit_plan(const ModelShape& shape, PlanParams params);

// Why an expert cache plan (n_expert_slots > 0) is over its budget, with the numbers: the dense
// weights, the slots and their bytes (and the fewest the cache takes), the rest, the total.
std::string expert_cache_shortfall(const Plan& p);

// The pools of the kv::ModelCache that Model::make_cache() builds for n_cells cells, n_seq
// sequences and batches of n_batch tokens, with their bytes (KvCache::bytes() of each); with a
// resident_limit (KV spill), what stays in memory and what goes to the spill file. Throws
// std::invalid_argument for a limit the cache refuses.
// n_device_layers: the last layers whose KV lives on the offload device (pools of their own,
// on_device); the resident limit applies to the host's pools. rotate: kv::CacheParams::rotate
// (--no-kv-rotation: false), which with a quantized K adds the K transforms' bytes.
std::vector<KvPoolPlan> kv_plan(const model::Hparams& hp, int n_cells, int n_seq, int n_batch, quant::GgmlType type_k,
                                quant::GgmlType type_v, uint64_t resident_limit = 0, int n_device_layers = 0,
                                bool rotate = true);

// The KV bytes of one kv::KvCache pool, as KvCache::bytes() counts them (it asks it); n_head_q:
// the query heads (kv::LayerShape); charge_key_fit: kv::CacheParams's (one pool of a model has it).
uint64_t kv_pool_bytes(int n_layer, int n_head_kv, int head_dim_k, int head_dim_v, int n_cells_rounded, int n_seq,
                       int block_size, quant::GgmlType type_k, quant::GgmlType type_v, int n_head_q = 0,
                       bool rotate = true, bool charge_key_fit = true);

}  // namespace fitllm::engine
