#include "engine/context.h"

#include <algorithm>
#include <limits>
#include <string>

#include "engine/plan.h"
#include "fitllm/error.h"

namespace fitllm::engine {

quant::GgmlType ggml_type(KvType type) {
    switch (type) {
        case KvType::f32:
            return quant::GgmlType::F32;
        case KvType::f16:
            return quant::GgmlType::F16;
        case KvType::bf16:
            return quant::GgmlType::BF16;
        case KvType::q8_0:
            return quant::GgmlType::Q8_0;
        case KvType::q4_0:
            return quant::GgmlType::Q4_0;
        case KvType::q4_1:
            return quant::GgmlType::Q4_1;
        case KvType::q5_0:
            return quant::GgmlType::Q5_0;
        case KvType::q5_1:
            return quant::GgmlType::Q5_1;
        case KvType::iq4_nl:
            return quant::GgmlType::IQ4_NL;
    }
    throw ConfigError("KV type " + std::to_string(static_cast<int>(type)) + " is not one");
}

KvType kv_type(quant::GgmlType type) {
    for (const KvType t : {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::q4_0, KvType::q4_1,
                           KvType::q5_0, KvType::q5_1, KvType::iq4_nl}) {
        if (ggml_type(t) == type) return t;
    }
    throw ConfigError(std::string(quant::type_name(static_cast<uint32_t>(type))) + " is not a KV cache type");
}

void check(const ContextConfig& c) {
    const auto fail = [](const std::string& what) { throw ConfigError(what); };
    if (c.n_ctx < 0) fail("context size (-c) " + std::to_string(c.n_ctx) + " is negative");
    if (c.n_seq < 1 || c.n_seq > kv::kMaxSequences) {
        fail("sequences (-np) " + std::to_string(c.n_seq) + " outside 1.." + std::to_string(kv::kMaxSequences));
    }
    if (c.n_cached_prompts < 0 || c.n_seq + c.n_cached_prompts > kv::kMaxSequences) {
        fail("cached prompts (--cache-prompts) " + std::to_string(c.n_cached_prompts) + " with " +
             std::to_string(c.n_seq) + " sequences (-np): together they may be at most " +
             std::to_string(kv::kMaxSequences));
    }
    if (c.prompt_cache_ram > 0 && c.n_cached_prompts == 0) {
        fail("host memory for cached prompts (--cache-ram) needs cached prompts (--cache-prompts above 0)");
    }
    if (c.prompt_cache_disk > 0 && c.prompt_cache_ram == 0) {
        fail("a disk tier for cached prompts (--cache-disk) needs host memory for them too (--cache-ram)");
    }
    if (c.n_batch < 1) fail("batch size (-b) " + std::to_string(c.n_batch) + " must be at least 1");
    if (c.n_outputs < 0) fail("output rows " + std::to_string(c.n_outputs) + " is negative");
    if (c.n_threads < 0) fail("threads (-t) " + std::to_string(c.n_threads) + " is negative");
    if (c.n_keep < 0) fail("--keep " + std::to_string(c.n_keep) + " is negative");
    if (c.context_shift && c.n_seq > 1) fail("a context shift (--context-shift) works with one sequence only");
    if (c.context_shift && c.n_ctx > 0 && c.n_keep >= c.n_ctx - 1) {
        fail("--keep " + std::to_string(c.n_keep) + " leaves no room to shift in a context of " +
             std::to_string(c.n_ctx) + " tokens");
    }
    if (c.kv_resident > 0 && c.kv_spill_dir.empty()) {
        fail("a KV resident limit (--kv-resident) needs a spill directory (--kv-spill-dir) for the rest");
    }
}

kv::CacheParams cache_params(const ContextConfig& c, int max_position) {
    kv::CacheParams cp;
    cp.n_cells = kv_cells(c.n_ctx, c.n_seq, c.context_shift);
    cp.n_positions = max_position > 0 ? max_position : c.n_ctx;
    cp.n_seq_max = c.n_seq + c.n_cached_prompts;
    cp.type_k = ggml_type(c.type_k);
    cp.type_v = ggml_type(c.type_v);
    cp.rotate = c.kv_rotation;
    cp.spill_dir = c.kv_spill_dir;
    cp.resident_limit = c.kv_spill_dir.empty() ? 0 : c.kv_resident;
    return cp;
}

kv::ModelCache make_cache(const model::Model& model, const ContextConfig& context, memory::Device* device,
                          int max_position) {
    kv::CacheParams cp = cache_params(context, max_position);
    if (device) cp.pool = &device->pool(memory::pool_names::kKv);
    return model.make_cache(cp, std::max(context.n_batch, context.n_seq));
}

memory::PoolBuffer<float> make_logits(const model::Model& model, int rows, memory::Device* device) {
    return memory::PoolBuffer<float>(pool_of(device, memory::pool_names::kLogits),
                                     static_cast<size_t>(std::max(rows, 1)) * static_cast<size_t>(model.n_vocab()),
                                     "logits");
}

memory::Pool& pool_of(memory::Device* device, const char* name) {
    static memory::Device unlimited("unlimited", std::numeric_limits<uint64_t>::max());
    return (device ? *device : unlimited).pool(name);
}

std::string describe_kv(const ContextConfig& c) {
    const auto quantized = [](KvType t) { return t != KvType::f32 && t != KvType::f16 && t != KvType::bf16; };
    const auto name = [](KvType t) { return std::string(quant::type_name(static_cast<uint32_t>(ggml_type(t)))); };
    std::string s = "K " + name(c.type_k) + ", V " + name(c.type_v);
    if (quantized(c.type_k) || quantized(c.type_v)) s += c.kv_rotation ? ", rotated" : ", not rotated";
    return s;
}

}  // namespace fitllm::engine
