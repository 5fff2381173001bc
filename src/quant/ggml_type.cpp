#include "quant/ggml_type.h"

#include <array>

#include "util/text.h"

namespace fitllm::quant {
namespace {

constexpr uint32_t kSuperBlock = 256;  // QK_K: the super-block of the k-quants and i-quants

// Sizes follow the block structs of ggml (ggml-common.h): e.g. Q4_K = d, dmin (2 f16),
// 12 bytes of 6-bit scales, 128 bytes of nibbles = 144 bytes per 256 weights.
constexpr std::array<TypeTraits, kGgmlTypeIdEnd> kTable = {{
    {"F32", 1, 4, false},
    {"F16", 1, 2, false},
    {"Q4_0", 32, 2 + 16, true},
    {"Q4_1", 32, 2 + 2 + 16, true},
    {"Q4_2", 0, 0, true},
    {"Q4_3", 0, 0, true},
    {"Q5_0", 32, 2 + 4 + 16, true},
    {"Q5_1", 32, 2 + 2 + 4 + 16, true},
    {"Q8_0", 32, 2 + 32, true},
    {"Q8_1", 32, 2 + 2 + 32, true},  // ggml: f16 d and s; gguf-py still says 40 (old f32 layout)
    {"Q2_K", kSuperBlock, kSuperBlock / 16 + kSuperBlock / 4 + 2 + 2, true},
    {"Q3_K", kSuperBlock, kSuperBlock / 8 + kSuperBlock / 4 + 12 + 2, true},
    {"Q4_K", kSuperBlock, 2 + 2 + 12 + kSuperBlock / 2, true},
    {"Q5_K", kSuperBlock, 2 + 2 + 12 + kSuperBlock / 8 + kSuperBlock / 2, true},
    {"Q6_K", kSuperBlock, kSuperBlock / 2 + kSuperBlock / 4 + kSuperBlock / 16 + 2, true},
    {"Q8_K", kSuperBlock, 4 + kSuperBlock + kSuperBlock / 16 * 2, true},
    {"IQ2_XXS", kSuperBlock, 2 + kSuperBlock / 8 * 2, true},
    {"IQ2_XS", kSuperBlock, 2 + kSuperBlock / 8 * 2 + kSuperBlock / 32, true},
    {"IQ3_XXS", kSuperBlock, 2 + 3 * kSuperBlock / 8, true},
    {"IQ1_S", kSuperBlock, 2 + kSuperBlock / 8 + kSuperBlock / 32 * 2, true},
    {"IQ4_NL", 32, 2 + 16, true},
    {"IQ3_S", kSuperBlock, 2 + kSuperBlock / 4 + kSuperBlock / 32 + kSuperBlock / 8 + kSuperBlock / 64, true},
    {"IQ2_S", kSuperBlock, 2 + kSuperBlock / 4 + kSuperBlock / 32 + kSuperBlock / 32, true},
    {"IQ4_XS", kSuperBlock, 2 + 2 + kSuperBlock / 64 + kSuperBlock / 2, true},
    {"I8", 1, 1, false},
    {"I16", 1, 2, false},
    {"I32", 1, 4, false},
    {"I64", 1, 8, false},
    {"F64", 1, 8, false},
    {"IQ1_M", kSuperBlock, kSuperBlock / 8 + kSuperBlock / 16 + kSuperBlock / 32, true},
    {"BF16", 1, 2, false},
    {"Q4_0_4_4", 0, 0, true},
    {"Q4_0_4_8", 0, 0, true},
    {"Q4_0_8_8", 0, 0, true},
    {"TQ1_0", kSuperBlock, 2 + kSuperBlock / 64 + (kSuperBlock - 4 * kSuperBlock / 64) / 5, true},
    {"TQ2_0", kSuperBlock, 2 + kSuperBlock / 4, true},
    {"IQ4_NL_4_4", 0, 0, true},
    {"IQ4_NL_4_8", 0, 0, true},
    {"IQ4_NL_8_8", 0, 0, true},
    {"MXFP4", 32, 1 + 16, true},
    {"NVFP4", 64, 4 + 32, true},
    {"Q1_0", 128, 2 + 16, true},
}};

}  // namespace

std::optional<TypeTraits> traits_of(uint32_t type_id) {
    if (type_id >= kTable.size()) return std::nullopt;
    return kTable[type_id];
}

const TypeTraits& traits(GgmlType type) {
    return kTable.at(static_cast<uint32_t>(type));
}

bool is_supported(uint32_t type_id) {
    auto t = traits_of(type_id);
    return t && t->block_elements != 0;
}

std::string_view type_name(uint32_t type_id) {
    auto t = traits_of(type_id);
    return t ? t->name : std::string_view("unknown");
}

std::optional<GgmlType> type_from_name(std::string_view name) {
    for (uint32_t id = 0; id < kTable.size(); ++id) {
        if (is_supported(id) && util::iequals(kTable[id].name, name)) return static_cast<GgmlType>(id);
    }
    return std::nullopt;
}

std::optional<uint64_t> row_bytes(GgmlType type, uint64_t n) {
    const TypeTraits& t = traits(type);
    if (t.block_elements == 0 || n % t.block_elements != 0) return std::nullopt;
    return n / t.block_elements * t.block_bytes;
}

}  // namespace fitllm::quant
