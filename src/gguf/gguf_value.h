#pragma once
// One metadata value of a GGUF file. Values are views: strings and arrays point into the
// bytes they were parsed from (the mapped file), so reading a 262k-token vocabulary copies
// nothing but an index of string views.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "fitllm/error.h"

namespace fitllm::gguf {

enum class ValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};
inline constexpr uint32_t kValueTypeCount = 13;

std::string_view value_type_name(ValueType type);                  // "uint32", "string", ...
std::string value_type_name(ValueType type, ValueType elem_type);  // "array[string]" for arrays
// Bytes of a fixed-size scalar type; 0 for STRING and ARRAY.
size_t scalar_size(ValueType type);

// A getter asked for one type and the file has another, or the key is missing.
class KeyError : public Error {
public:
    using Error::Error;
};

// Maps a C++ type to the GGUF type it must have: get<uint32_t> wants UINT32 exactly.
template <class T>
struct ValueTypeOf;
template <>
struct ValueTypeOf<uint8_t> {
    static constexpr ValueType value = ValueType::UINT8;
};
template <>
struct ValueTypeOf<int8_t> {
    static constexpr ValueType value = ValueType::INT8;
};
template <>
struct ValueTypeOf<uint16_t> {
    static constexpr ValueType value = ValueType::UINT16;
};
template <>
struct ValueTypeOf<int16_t> {
    static constexpr ValueType value = ValueType::INT16;
};
template <>
struct ValueTypeOf<uint32_t> {
    static constexpr ValueType value = ValueType::UINT32;
};
template <>
struct ValueTypeOf<int32_t> {
    static constexpr ValueType value = ValueType::INT32;
};
template <>
struct ValueTypeOf<float> {
    static constexpr ValueType value = ValueType::FLOAT32;
};
template <>
struct ValueTypeOf<bool> {
    static constexpr ValueType value = ValueType::BOOL;
};
template <>
struct ValueTypeOf<std::string_view> {
    static constexpr ValueType value = ValueType::STRING;
};
template <>
struct ValueTypeOf<uint64_t> {
    static constexpr ValueType value = ValueType::UINT64;
};
template <>
struct ValueTypeOf<int64_t> {
    static constexpr ValueType value = ValueType::INT64;
};
template <>
struct ValueTypeOf<double> {
    static constexpr ValueType value = ValueType::FLOAT64;
};

class Value {
public:
    // Built by the reader (and by tests); see gguf_reader.cpp.
    static Value scalar(std::string_view key, ValueType type, std::span<const std::byte> raw);
    static Value string(std::string_view key, std::string_view text);
    static Value numeric_array(std::string_view key, ValueType elem_type, uint64_t count, const std::byte* data);
    static Value string_array(std::string_view key, std::vector<std::string_view> strings);

    std::string_view key() const { return key_; }
    ValueType type() const { return type_; }
    bool is_array() const { return type_ == ValueType::ARRAY; }
    ValueType array_type() const { return elem_type_; }  // meaningful for arrays only
    uint64_t array_size() const { return count_; }
    std::string type_name() const { return value_type_name(type_, elem_type_); }

    // The value as T; the GGUF type must match T exactly, else KeyError naming key and types.
    template <class T>
    T get() const {
        expect(ValueTypeOf<T>::value);
        if constexpr (std::is_same_v<T, std::string_view>) {
            return text_;
        } else {
            T v;
            std::memcpy(&v, scalar_.data(), sizeof(T));
            return v;
        }
    }
    // Any integer type (and bool), range-checked into int64; KeyError otherwise.
    int64_t to_int() const;
    // Any float or integer type.
    double to_double() const;

    // Element i of a numeric array of element type T (exact match required).
    template <class T>
    T array_at(uint64_t i) const {
        expect_array(ValueTypeOf<T>::value);
        if (i >= count_) throw KeyError(std::string("key '") + std::string(key_) + "': index out of range");
        T v;
        std::memcpy(&v, data_ + i * sizeof(T), sizeof(T));
        return v;
    }
    template <class T>
    std::vector<T> array() const {
        expect_array(ValueTypeOf<T>::value);
        std::vector<T> out(count_);
        if constexpr (std::is_same_v<T, bool>) {  // vector<bool> is packed: no memcpy
            for (uint64_t i = 0; i < count_; ++i) out[i] = data_[i] != std::byte{0};
        } else if (count_ != 0) {
            std::memcpy(out.data(), data_, count_ * sizeof(T));
        }
        return out;
    }
    // Elements of a string array.
    std::span<const std::string_view> strings() const {
        expect_array(ValueType::STRING);
        return strings_;
    }
    // Raw little-endian bytes of a numeric array (for the writer and for hashing).
    std::span<const std::byte> raw_array_bytes() const;
    // Raw bytes of a scalar (1..8 bytes).
    std::span<const std::byte> raw_scalar_bytes() const { return {scalar_.data(), scalar_size(type_)}; }

    // A short human rendering: 42, 1e-06, "text", [1, 2, 3, ... 262144 items].
    std::string to_display(size_t max_items = 8, size_t max_chars = 60) const;

private:
    void expect(ValueType want) const;
    void expect_array(ValueType want_elem) const;

    std::string_view key_;
    ValueType type_ = ValueType::UINT8;
    ValueType elem_type_ = ValueType::UINT8;
    uint64_t count_ = 0;
    std::array<std::byte, 8> scalar_{};
    std::string_view text_;
    const std::byte* data_ = nullptr;
    std::vector<std::string_view> strings_;
};

}  // namespace fitllm::gguf
