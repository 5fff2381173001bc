#include <algorithm>
#include <regex>

#include "gguf/gguf_quantize.h"
#include "quant/dequantize.h"
#include "quant/file_type.h"
#include "quant/quantize.h"
#include "quant/quantize_ref.h"
#include "util/text.h"

namespace fitllm::gguf {

using quant::GgmlType;

namespace {

// llama.cpp's llama_ftype values used below.
enum Ftype : uint32_t {
    kF32 = 0,
    kF16 = 1,
    kQ4_0 = 2,
    kQ4_1 = 3,
    kQ8_0 = 7,
    kQ5_0 = 8,
    kQ5_1 = 9,
    kQ2_K = 10,
    kIQ2_XXS = 19,
    kIQ2_XS = 20,
    kQ2_K_S = 21,
    kIQ3_XS = 22,
    kIQ3_XXS = 23,
    kIQ1_S = 24,
    kIQ3_S = 26,
    kIQ3_M = 27,
    kIQ2_S = 28,
    kIQ2_M = 29,
    kQ3_K_S = 11,
    kQ3_K_M = 12,
    kQ3_K_L = 13,
    kQ4_K_S = 14,
    kQ4_K_M = 15,
    kQ5_K_S = 16,
    kQ5_K_M = 17,
    kQ6_K = 18,
    kIQ4_NL = 25,
    kIQ4_XS = 30,
    kIQ1_M = 31,
    kBF16 = 32,
    kTQ1_0 = 36,
    kTQ2_0 = 37,
    kMXFP4_MOE = 38,
};

// The type a file type puts in its tensors before the mixes; nullopt: not written by fitllm.
std::optional<GgmlType> default_type(uint32_t ftype) {
    switch (ftype) {
        case kF32:
            return GgmlType::F32;
        case kF16:
            return GgmlType::F16;
        case kBF16:
            return GgmlType::BF16;
        case kQ4_0:
            return GgmlType::Q4_0;
        case kQ4_1:
            return GgmlType::Q4_1;
        case kQ5_0:
            return GgmlType::Q5_0;
        case kQ5_1:
            return GgmlType::Q5_1;
        case kQ8_0:
            return GgmlType::Q8_0;
        case kQ2_K:
        case kQ2_K_S:
            return GgmlType::Q2_K;
        case kQ3_K_S:
        case kQ3_K_M:
        case kQ3_K_L:
            return GgmlType::Q3_K;
        case kQ4_K_S:
        case kQ4_K_M:
            return GgmlType::Q4_K;
        case kQ5_K_S:
        case kQ5_K_M:
            return GgmlType::Q5_K;
        case kQ6_K:
            return GgmlType::Q6_K;
        case kIQ4_NL:
            return GgmlType::IQ4_NL;
        case kIQ3_XXS:
            return GgmlType::IQ3_XXS;
        case kIQ3_XS:
        case kIQ3_S:
        case kIQ3_M:
            return GgmlType::IQ3_S;
        case kIQ2_M:
            return GgmlType::IQ2_S;
        case kIQ2_XXS:
            return GgmlType::IQ2_XXS;
        case kIQ1_S:
            return GgmlType::IQ1_S;
        case kIQ1_M:
            return GgmlType::IQ1_M;
        case kIQ2_XS:
        case kIQ2_S:
            return GgmlType::IQ2_XS;
        case kIQ4_XS:
            return GgmlType::IQ4_XS;
        case kTQ1_0:
            return GgmlType::TQ1_0;
        case kTQ2_0:
            return GgmlType::TQ2_0;
        case kMXFP4_MOE:
            return GgmlType::MXFP4;
        default:
            return std::nullopt;
    }
}

std::string ftype_name(uint32_t ftype) {
    return quant::file_type_name(ftype).value_or("file type " + std::to_string(ftype));
}

uint32_t block_of(GgmlType t) {
    return quant::traits(t).block_elements;
}

enum class Category {
    output,
    token_embd,
    attn_qkv,
    attn_kv_b,
    attn_v,
    attn_k,
    attn_q,
    attn_output,
    ffn_up,
    ffn_gate,
    ffn_down,
    other
};

bool contains(std::string_view s, std::string_view part) {
    return s.find(part) != std::string_view::npos;
}

bool is_token_embd(std::string_view name) {
    return name == "token_embd.weight" || name == "per_layer_token_embd.weight";
}

// llama.cpp's broad categories, by name (the first that matches).
Category category_of(std::string_view name) {
    if (name == "output.weight") return Category::output;
    if (is_token_embd(name)) return Category::token_embd;
    if (contains(name, "attn_qkv.weight")) return Category::attn_qkv;
    if (contains(name, "attn_kv_b.weight")) return Category::attn_kv_b;
    if (contains(name, "attn_v.weight")) return Category::attn_v;
    if (contains(name, "attn_k.weight")) return Category::attn_k;
    if (contains(name, "attn_q.weight")) return Category::attn_q;
    if (contains(name, "attn_output.weight")) return Category::attn_output;
    if (contains(name, "ffn_up")) return Category::ffn_up;
    if (contains(name, "ffn_gate")) return Category::ffn_gate;
    if (contains(name, "ffn_down")) return Category::ffn_down;
    return Category::other;
}

bool is_attn_v_like(Category c) {
    return c == Category::attn_v || c == Category::attn_qkv || c == Category::attn_kv_b;
}

// ggml_n_dims: the dimensions up to the last one above 1 (at least 1).
int significant_dims(const TensorInfo& t) {
    int n = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
        if (t.ne[d] > 1) n = static_cast<int>(d) + 1;
    }
    return n;
}

// Which tensors llama.cpp quantizes at all: 2-D and 3-D "*weight" tensors but norms, MoE routers
// and the small or position-like tables it lists by name.
bool allows_quantization(const TensorInfo& t, const QuantizeParams& params) {
    if (significant_dims(t) < 2) return false;
    const std::string_view name = t.name;
    if (name.size() < 6 || name.substr(name.size() - 6) != "weight") return false;
    if (params.leave_output_tensor && name == "output.weight") return false;
    static constexpr std::string_view kKeep[] = {"_norm.weight",
                                                 "ffn_gate_inp.weight",
                                                 "ffn_gate_tid2eid.weight",
                                                 "altup",
                                                 "laurel",
                                                 "per_layer_model_proj",
                                                 "ssm_conv1d",
                                                 "shortconv.conv.weight",
                                                 "indexer.k_proj.weight",
                                                 "indexer.q_proj.weight",
                                                 "time_mix_first.weight",
                                                 "time_mix_w0.weight",
                                                 "time_mix_w1.weight",
                                                 "time_mix_w2.weight",
                                                 "time_mix_v0.weight",
                                                 "time_mix_v1.weight",
                                                 "time_mix_v2.weight",
                                                 "time_mix_a0.weight",
                                                 "time_mix_a1.weight",
                                                 "time_mix_a2.weight",
                                                 "time_mix_g1.weight",
                                                 "time_mix_g2.weight",
                                                 "time_mix_decay_w1.weight",
                                                 "time_mix_decay_w2.weight",
                                                 "time_mix_lerp_fused.weight",
                                                 "attn_rel_b.weight",
                                                 ".position_embd",
                                                 "sam.pos_embd",
                                                 "sam.neck.",
                                                 "sam.net_",
                                                 ".rel_pos",
                                                 ".patch_embd",
                                                 ".patch_merger",
                                                 "a.rvq.codebook",
                                                 "mm.a.code_embd"};
    for (std::string_view part : kKeep) {
        if (contains(name, part)) return false;
    }
    return name != "position_embd.weight" && name != "token_types.weight";
}

// The hyper-parameters the mixes look at.
struct Model {
    std::string arch;
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int n_expert = 0;
    int n_gqa() const { return n_head_kv > 0 ? n_head / n_head_kv : 0; }
    bool is_70b = false;
};

int64_t first_int(const GgufFile& f, const std::string& key, int64_t fallback) {
    const Value* v = f.find(key);
    if (!v) return fallback;
    if (!v->is_array()) return v->to_int();
    if (v->array_size() == 0) return fallback;
    switch (v->array_type()) {
        case ValueType::INT32:
            return v->array_at<int32_t>(0);
        case ValueType::UINT32:
            return v->array_at<uint32_t>(0);
        default:
            return fallback;
    }
}

Model model_of(const GgufFile& f) {
    Model m;
    if (const Value* a = f.find("general.architecture"); a && a->type() == ValueType::STRING)
        m.arch = std::string(a->get<std::string_view>());
    m.n_layer = static_cast<int>(first_int(f, m.arch + ".block_count", 0));
    m.n_head = static_cast<int>(first_int(f, m.arch + ".attention.head_count", 0));
    m.n_head_kv = static_cast<int>(first_int(f, m.arch + ".attention.head_count_kv", m.n_head));
    m.n_expert = static_cast<int>(first_int(f, m.arch + ".expert_count", 0));
    // llama.cpp's LLM_TYPE_70B: an 80-layer Llama with grouped-query attention.
    m.is_70b = m.arch == "llama" && m.n_layer == 80 && m.n_head != m.n_head_kv;
    return m;
}

// llama.cpp's running state of the choice: counters of the attn_v and ffn_down tensors seen.
struct State {
    Model model;
    int n_attention_wv = 0;
    int i_attention_wv = 0;
    int i_ffn_down = 0;
    int i_ffn_gate = 0;
    int i_ffn_up = 0;
    bool tied_embeddings = true;
    int n_fallback = 0;
    bool has_imatrix = false;
};

// The file types of llama.cpp's IQ1 / IQ2 mixes.
bool is_iq2_family(uint32_t ftype) {
    return ftype == kIQ2_XXS || ftype == kIQ2_XS || ftype == kIQ1_S || ftype == kIQ2_S || ftype == kIQ2_M ||
           ftype == kIQ1_M;
}

bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The layer of a tensor for the ffn_down rules: the count of those seen, or for MoE models the
// number in its name.
int layer_of(const State& s, int counter, const std::string& name) {
    if (s.model.n_expert <= 1) return counter;
    int layer = -1;
    if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1)
        throw Error("tensor '" + name + "': no layer number in its name (blk.N.)");
    if (layer < 0 || layer >= s.model.n_layer)
        throw Error("tensor '" + name + "': layer " + std::to_string(layer) + " outside [0, " +
                    std::to_string(s.model.n_layer) + ")");
    return layer;
}

// llama.cpp's mixes (llama_tensor_get_type_impl) for the file types fitllm writes.
GgmlType mixed_type(State& s, GgmlType type, const TensorInfo& t, uint32_t ftype, Category cat,
                    const QuantizeParams& params) {
    const std::string name(t.name);
    const Model& m = s.model;
    const bool falcon = m.arch == "falcon";
    if (cat == Category::output || (s.tied_embeddings && cat == Category::token_embd)) {
        if (params.output_tensor_type) return *params.output_tensor_type;
        if (ftype == kMXFP4_MOE || falcon || t.ne[0] % block_of(type) != 0) return GgmlType::Q8_0;
        if (ftype == kIQ3_XXS || is_iq2_family(ftype)) return GgmlType::Q5_K;
        return type != GgmlType::Q8_0 ? GgmlType::Q6_K : type;
    }
    if (ftype == kMXFP4_MOE) {
        const bool expert_role = cat == Category::ffn_up || cat == Category::ffn_gate || cat == Category::ffn_down;
        return t.ne[2] > 1 && (m.arch != "bailingmoe3" || expert_role) ? GgmlType::MXFP4 : GgmlType::Q8_0;
    }
    if (cat == Category::token_embd) {
        if (params.token_embedding_type) return *params.token_embedding_type;
        if (ftype == kTQ1_0 || ftype == kTQ2_0) return GgmlType::Q4_K;
        if (ftype == kIQ3_XXS || ftype == kIQ2_S || ftype == kIQ2_M) return GgmlType::IQ3_S;
        if (is_iq2_family(ftype)) return GgmlType::Q2_K;
        return type;
    }
    if (is_iq2_family(ftype)) {  // IQ1_* and IQ2_* (llama.cpp's branch for them replaces all below)
        const bool iq2_sm = ftype == kIQ2_S || ftype == kIQ2_M;
        if (is_attn_v_like(cat)) {
            type = m.n_gqa() >= 4 || m.n_expert >= 4 ? GgmlType::Q4_K : iq2_sm ? GgmlType::IQ3_S : GgmlType::Q2_K;
            ++s.i_attention_wv;
        } else if (m.n_expert == 8 && cat == Category::attn_k) {
            type = GgmlType::Q4_K;
        } else if (cat == Category::ffn_down) {
            if (s.i_ffn_down < m.n_layer / 8) type = iq2_sm ? GgmlType::IQ3_S : GgmlType::Q2_K;
            ++s.i_ffn_down;
        } else if (cat == Category::attn_output) {
            if (m.n_expert == 8) {
                type = GgmlType::Q5_K;
            } else if (ftype == kIQ1_S || ftype == kIQ1_M) {
                type = GgmlType::IQ2_XXS;
            } else if (iq2_sm) {
                type = GgmlType::IQ3_S;
            }
        }
        return type;
    }
    if (is_attn_v_like(cat)) {
        const int i = s.i_attention_wv, n = s.n_attention_wv;
        if (ftype == kQ2_K) {
            type = m.n_gqa() >= 4 ? GgmlType::Q4_K : GgmlType::Q3_K;
        } else if (ftype == kQ2_K_S && m.n_gqa() >= 4) {
            type = GgmlType::Q4_K;
        } else if (ftype == kIQ3_XXS) {
            type = m.n_gqa() >= 4 ? GgmlType::Q4_K : !s.has_imatrix ? GgmlType::IQ3_S : GgmlType::IQ3_XXS;
        } else if ((ftype == kIQ3_XS || ftype == kIQ3_S) && m.n_gqa() >= 4) {
            type = GgmlType::Q4_K;
        } else if (ftype == kIQ3_M) {
            type = GgmlType::Q4_K;
        } else if (ftype == kQ3_K_M) {
            type = i < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
        } else if (ftype == kQ3_K_L) {
            type = GgmlType::Q5_K;
        } else if ((ftype == kIQ4_NL || ftype == kIQ4_XS) && m.n_gqa() >= 4) {
            type = GgmlType::Q5_K;
        } else if ((ftype == kQ4_K_M || ftype == kQ5_K_M) && use_more_bits(i, n)) {
            type = GgmlType::Q6_K;
        } else if (ftype == kQ4_K_S && i < 4) {
            type = GgmlType::Q5_K;
        }
        if (m.is_70b && (type == GgmlType::Q3_K || type == GgmlType::Q4_K)) type = GgmlType::Q5_K;
        if (m.n_expert == 8) type = GgmlType::Q8_0;
        ++s.i_attention_wv;
        return type;
    }
    if (cat == Category::attn_k) {
        if (m.n_expert == 8) return GgmlType::Q8_0;
        if (ftype == kIQ3_XS) return GgmlType::IQ3_XXS;
        if (ftype == kIQ3_XXS) return GgmlType::IQ2_S;
        return type;
    }
    if (cat == Category::attn_q) {
        if (ftype == kIQ3_XS) return GgmlType::IQ3_XXS;
        if (ftype == kIQ3_XXS) return GgmlType::IQ2_S;
        return type;
    }
    if (cat == Category::ffn_down) {
        const int i = layer_of(s, s.i_ffn_down, name), n = m.n_layer;
        if (ftype == kQ2_K) {
            type = GgmlType::Q3_K;
        } else if (ftype == kQ2_K_S) {
            if (i < n / 8) type = GgmlType::Q4_K;
        } else if (ftype == kIQ3_XXS && !s.has_imatrix) {
            type = i < n / 8 ? GgmlType::Q4_K : GgmlType::Q3_K;
        } else if (ftype == kQ3_K_M) {
            type = i < n / 16 ? GgmlType::Q5_K : !falcon || use_more_bits(i, n) ? GgmlType::Q4_K : GgmlType::Q3_K;
        } else if (ftype == kIQ3_M && (i < n / 8 || (m.n_expert == 8 && use_more_bits(i, n)))) {
            type = GgmlType::Q4_K;
        } else if (ftype == kQ3_K_L) {
            type = falcon ? GgmlType::Q4_K : GgmlType::Q5_K;
        } else if (ftype == kQ4_K_M) {
            if (falcon) {
                type = i < n / 16 ? GgmlType::Q6_K : use_more_bits(i, n) ? GgmlType::Q5_K : GgmlType::Q4_K;
            } else if (use_more_bits(i, n)) {
                type = GgmlType::Q6_K;
            }
        } else if (i < n / 8 && (ftype == kIQ4_NL || ftype == kIQ4_XS) && !s.has_imatrix) {
            type = GgmlType::Q5_K;
        } else if (ftype == kQ5_K_M && use_more_bits(i, n)) {
            type = GgmlType::Q6_K;
        } else if (ftype == kQ4_K_S && !falcon && i < n / 8) {
            type = GgmlType::Q5_K;
        } else if ((ftype == kQ4_0 || ftype == kQ5_0) && s.has_imatrix && i < n / 8) {
            type = ftype == kQ4_0 ? GgmlType::Q4_1 : GgmlType::Q5_1;  // llama.cpp's guard for the first layers
        }
        ++s.i_ffn_down;
        return type;
    }
    if (cat == Category::attn_output) {
        if (!falcon) {
            if (m.n_expert == 8) {
                if (ftype == kQ2_K || ftype == kIQ3_XS || ftype == kIQ3_XXS || ftype == kQ3_K_S || ftype == kQ3_K_M ||
                    ftype == kIQ4_NL || ftype == kQ4_K_S || ftype == kQ4_K_M || ftype == kIQ3_S || ftype == kIQ3_M ||
                    ftype == kIQ4_XS)
                    type = GgmlType::Q5_K;
            } else if (ftype == kQ2_K) {
                type = GgmlType::Q3_K;
            } else if (ftype == kIQ3_XXS) {
                type = GgmlType::IQ3_S;
            } else if (ftype == kIQ3_M) {
                type = GgmlType::Q4_K;
            } else if (ftype == kQ3_K_M) {
                type = GgmlType::Q4_K;
            } else if (ftype == kQ3_K_L) {
                type = GgmlType::Q5_K;
            }
        } else if (ftype == kQ3_K_L) {
            type = GgmlType::Q4_K;
        }
    }
    if (cat == Category::ffn_gate || cat == Category::ffn_up) {
        int& counter = cat == Category::ffn_gate ? s.i_ffn_gate : s.i_ffn_up;
        const int i = layer_of(s, counter, name), n = m.n_layer;
        if (ftype == kIQ3_XS && i >= n / 8 && i < 7 * n / 8) type = GgmlType::IQ3_XXS;
        ++counter;
    }
    return type;
}

// A type whose blocks do not fit the row length: llama.cpp's fallback, F16 when that fails too.
GgmlType fallback_type(State& s, const TensorInfo& t, GgmlType type, bool& fell_back) {
    const int64_t row = t.ne[0];
    if (row % block_of(type) == 0) return type;
    ++s.n_fallback;
    fell_back = true;
    GgmlType to = type;
    switch (quant::is_grid_iquant(type) ? GgmlType::IQ4_XS : type) {  // every i-quant falls back alike
        case GgmlType::IQ4_XS:
            to = GgmlType::IQ4_NL;
            break;
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::TQ1_0:
        case GgmlType::TQ2_0:
            to = GgmlType::Q4_0;
            break;
        case GgmlType::Q4_K:
            to = GgmlType::Q5_0;
            break;
        case GgmlType::Q5_K:
            to = GgmlType::Q5_1;
            break;
        case GgmlType::Q6_K:
            to = GgmlType::Q8_0;
            break;
        default:
            if (block_of(type) > 32)
                throw Error("tensor '" + std::string(t.name) + "': row length " + std::to_string(row) +
                            " does not fit " + std::string(quant::traits(type).name) + " and it has no fallback");
    }
    if (row % block_of(to) != 0) to = GgmlType::F16;
    return to;
}

// llama.cpp's order of the choices: by layer number (tensors outside blk.N. first), then name.
std::vector<size_t> choice_order(const GgufFile& in) {
    std::vector<size_t> order(in.tensors().size());
    std::vector<int> layer(order.size(), -1);
    for (size_t i = 0; i < order.size(); ++i) {
        order[i] = i;
        const std::string name(in.tensors()[i].name);
        std::sscanf(name.c_str(), "blk.%d.", &layer[i]);
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (layer[a] != layer[b]) return layer[a] < layer[b];
        return in.tensors()[a].name < in.tensors()[b].name;
    });
    return order;
}

std::string type_str(GgmlType t) {
    return std::string(quant::traits(t).name);
}

// llama.cpp's tensor_requires_imatrix: the types quantized against an importance matrix only
// (the Q2_K of a Q2_K_S file too), never the token embedding or output.weight.
bool requires_imatrix(const std::string& name, GgmlType to, uint32_t ftype) {
    if (is_token_embd(name) || name == "output.weight") return false;
    switch (to) {
        case GgmlType::IQ3_XXS:
        case GgmlType::IQ2_XXS:
        case GgmlType::IQ2_XS:
        case GgmlType::IQ2_S:
        case GgmlType::IQ1_M:
        case GgmlType::IQ1_S:
            return true;
        case GgmlType::Q2_K:
            return ftype == kQ2_K_S;
        default:
            return false;
    }
}

// Each converted tensor's entry of the importance matrix, as llama-quantize looks it up: by the
// tensor's name; no entry: none (an error where the type needs one); an entry whose size is not
// ne[0] * ne[2] (the row length times the experts): an error, but for the token embedding, which
// is then quantized without.
void attach_imatrix(const GgufFile& in, const QuantizeParams& params, std::vector<TensorChoice>& out) {
    const ImportanceMatrix* m = params.imatrix && !params.imatrix->weights.empty() ? params.imatrix : nullptr;
    for (size_t i = 0; i < out.size(); ++i) {
        TensorChoice& c = out[i];
        if (c.to == c.from) continue;
        const TensorInfo& t = in.tensors()[i];
        const bool required = requires_imatrix(c.name, c.to, params.ftype);
        if (m) {
            const auto it = m->weights.find(c.name);
            if (it != m->weights.end()) {
                const uint64_t want = static_cast<uint64_t>(t.ne[0]) * static_cast<uint64_t>(t.ne[2]);
                if (it->second.size() == want) {
                    c.imatrix = it->second.data();
                } else if (!is_token_embd(c.name)) {
                    throw Error(m->path + ": importance matrix entry '" + c.name + "' has " +
                                std::to_string(it->second.size()) + " values; the tensor needs " +
                                std::to_string(want) + " (row length " + std::to_string(t.ne[0]) + " x " +
                                std::to_string(t.ne[2]) + " experts): an imatrix of another model?");
                }
            }
        }
        if (required && !c.imatrix) {
            throw Error("tensor '" + c.name + "': " + type_str(c.to) + " in " + ftype_name(params.ftype) +
                        " needs an importance matrix" +
                        (m ? ", and " + m->path + " has no entry for it" : ": pass --imatrix FILE (llama-imatrix's)"));
        }
    }
}

}  // namespace

std::optional<uint32_t> parse_file_type(std::string_view name) {
    if (!name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        if (name.size() > 4) return std::nullopt;
        const uint32_t id = static_cast<uint32_t>(std::stoul(std::string(name)));
        return quant::file_type_name(id) ? std::optional<uint32_t>(id) : std::nullopt;
    }
    if (util::iequals(name, "Q4_K")) return kQ4_K_M;
    if (util::iequals(name, "Q5_K")) return kQ5_K_M;
    if (util::iequals(name, "Q3_K")) return kQ3_K_M;
    return quant::file_type_from_name(name);
}

std::vector<std::string> supported_file_types() {
    std::vector<std::string> names;
    for (uint32_t id = 0; id < 64; ++id) {
        if (default_type(id)) names.push_back(ftype_name(id));
    }
    return names;
}

void check_file_type(uint32_t ftype) {
    const std::optional<GgmlType> type = default_type(ftype);
    if (type) return;
    const std::string name = ftype_name(ftype);
    std::string list;
    for (const std::string& s : supported_file_types()) list += (list.empty() ? "" : ", ") + s;
    throw Error("fitllm quantize does not write " + name + "; it writes " + list);
}

std::vector<TensorChoice> plan_quantization(const GgufFile& in, const QuantizeParams& params) {
    check_file_type(params.ftype);
    const GgmlType base = *default_type(params.ftype);
    const auto* split = in.find("split.count");
    if (split && split->to_int() > 1)
        throw Error(in.source() + ": a split file (" + std::to_string(split->to_int()) +
                    " parts): merge it first (llama-gguf-split --merge)");

    std::vector<std::pair<std::regex, GgmlType>> patterns;
    for (const auto& [pattern, type] : params.tensor_types) {
        try {
            patterns.emplace_back(std::regex(pattern), type);
        } catch (const std::regex_error& e) {
            throw Error("--tensor-type: bad pattern '" + pattern + "': " + e.what());
        }
    }

    State s;
    s.model = model_of(in);
    s.has_imatrix = params.imatrix && !params.imatrix->weights.empty();
    for (const TensorInfo& t : in.tensors()) {
        const Category cat = category_of(t.name);
        if (is_attn_v_like(cat)) ++s.n_attention_wv;
        if (cat == Category::output) s.tied_embeddings = false;
    }

    std::vector<TensorChoice> out(in.tensors().size());
    for (size_t i : choice_order(in)) {
        const TensorInfo& t = in.tensors()[i];
        TensorChoice& c = out[i];
        c.name = std::string(t.name);
        c.from = c.to = t.type;
        if (!allows_quantization(t, params)) continue;
        const Category cat = category_of(t.name);
        if (params.token_embedding_type && cat == Category::token_embd) {
            c.to = *params.token_embedding_type;
        } else if (params.output_tensor_type && cat == Category::output) {
            c.to = *params.output_tensor_type;
        } else {
            c.to = base;
            if (quant::traits(base).is_quantized) {
                bool manual = false;
                for (const auto& [re, type] : patterns) {
                    if (std::regex_search(c.name, re)) {
                        c.to = type;
                        manual = true;
                        break;
                    }
                }
                if (!manual && !params.pure) c.to = mixed_type(s, c.to, t, params.ftype, cat, params);
                c.to = fallback_type(s, t, c.to, c.fallback);
            }
        }
    }

    // What cannot be written, named (first, as llama.cpp, a missing importance matrix).
    attach_imatrix(in, params, out);
    for (size_t i = 0; i < out.size(); ++i) {
        const TensorChoice& c = out[i];
        const TensorInfo& t = in.tensors()[i];
        if (c.to == c.from) continue;
        const std::string where = "tensor '" + c.name + "'";
        if (!quant::can_quantize_model(c.to)) throw Error(where + ": fitllm quantize cannot write " + type_str(c.to));
        if (t.ne[0] % block_of(c.to) != 0)
            throw Error(where + ": row length " + std::to_string(t.ne[0]) + " is not a multiple of " + type_str(c.to) +
                        "'s block of " + std::to_string(block_of(c.to)));
        if (quant::traits(c.from).is_quantized && !params.allow_requantize)
            throw Error(where + " is already quantized (" + type_str(c.from) +
                        "): requantizing loses quality; pass --allow-requantize to do it anyway");
        if (c.from != GgmlType::F32 && !quant::can_dequantize(c.from))
            throw Error(where + ": cannot read its type " + type_str(c.from) + " to convert it");
    }
    return out;
}

}  // namespace fitllm::gguf
