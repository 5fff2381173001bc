#pragma once
// The ggml tensor type table: how many elements a block holds and how many bytes it takes.
// Values of GgmlType are the on-disk ids used by GGUF files (ggml's enum ggml_type).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace fitllm::quant {

enum class GgmlType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    // 4, 5: Q4_2, Q4_3 (removed from ggml)
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    // 31..33: Q4_0_4_4, Q4_0_4_8, Q4_0_8_8 (removed: repacked at load time since)
    TQ1_0 = 34,
    TQ2_0 = 35,
    // 36..38: IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8 (removed)
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
};

// One past the largest id ggml has used; every id below it is known (some removed).
inline constexpr uint32_t kGgmlTypeIdEnd = 42;

struct TypeTraits {
    std::string_view name;    // "Q4_K", as ggml prints it
    uint32_t block_elements;  // elements per block (1 for plain types); 0: removed type
    uint32_t block_bytes;     // bytes per block; 0: removed type
    bool is_quantized;
};

// Traits of a type id as found in a file; nullopt for ids ggml never defined.
// Removed types (Q4_2, Q4_0_4_4, ...) have a name but zero sizes: check is_supported().
std::optional<TypeTraits> traits_of(uint32_t type_id);
const TypeTraits& traits(GgmlType type);  // a defined, supported type
bool is_supported(uint32_t type_id);
std::string_view type_name(uint32_t type_id);                   // "unknown" for undefined ids
std::optional<GgmlType> type_from_name(std::string_view name);  // case-insensitive

// Bytes of one row of n elements; nullopt when n is not a whole number of blocks.
std::optional<uint64_t> row_bytes(GgmlType type, uint64_t n);

}  // namespace fitllm::quant
