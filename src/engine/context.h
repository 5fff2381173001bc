#pragma once
// A context's memory, made the one way the plan counts it (engine/plan.h, kv_cells): the KV
// cache of a ContextConfig and the rows of logits it returns, each charged to a device's pool
// before it is allocated (memory::BudgetError, nothing allocated, when it has no room).
//
//   kv::ModelCache cache = engine::make_cache(model, context, &host);
//   memory::PoolBuffer<float> logits = engine::make_logits(model, context.n_seq, &host);
//
// Engine::make_cache / make_logits call these with the engine's model and budget; tests call them
// on a model of their own (device nullptr: nothing charged).
#include "fitllm/config.h"
#include "kv/cache.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/model.h"
#include "quant/ggml_type.h"

namespace fitllm::engine {

quant::GgmlType ggml_type(KvType type);
// KvType of a ggml type the cache stores; throws ConfigError for others.
KvType kv_type(quant::GgmlType type);

// Throws ConfigError naming the setting when a context config is out of range or contradicts
// itself: n_ctx < 0, n_seq outside 1..kv::kMaxSequences, n_batch < 1, n_keep < 0 or (with a
// context shift) leaving no room, a context shift with several sequences, kv_resident without
// kv_spill_dir.
void check(const ContextConfig& context);

// The cache parameters of a context: kv_cells() cells, context.n_seq sequences, its K/V types,
// rotation and spill. max_position: the positions one sequence's tokens take at most (for the K
// transform's fit; 0: context.n_ctx).
kv::CacheParams cache_params(const ContextConfig& context, int max_position = 0);

// model.make_cache() for the context, for batches of max(n_batch, n_seq) tokens, its bytes charged
// to device's "kv" pool (device nullptr: uncharged).
kv::ModelCache make_cache(const model::Model& model, const ContextConfig& context, memory::Device* device,
                          int max_position = 0);

// rows x n_vocab floats charged to device's "logits" pool (device nullptr: uncharged).
memory::PoolBuffer<float> make_logits(const model::Model& model, int rows, memory::Device* device);

// device's pool of that name, or (device nullptr) the pool of a device without a limit.
memory::Pool& pool_of(memory::Device* device, const char* name);

// "K f16, V f16" or "K q4_0, V q4_0, rotated": for summary lines.
std::string describe_kv(const ContextConfig& context);

}  // namespace fitllm::engine
