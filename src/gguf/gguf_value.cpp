#include "gguf/gguf_value.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>

namespace fitllm::gguf {

std::string_view value_type_name(ValueType type) {
    static constexpr std::string_view kNames[kValueTypeCount] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                                                 "int32",  "float32", "bool",   "string", "array",
                                                                 "uint64", "int64",   "float64"};
    const auto id = static_cast<uint32_t>(type);
    return id < kValueTypeCount ? kNames[id] : std::string_view("unknown");
}

std::string value_type_name(ValueType type, ValueType elem_type) {
    std::string name(value_type_name(type));
    if (type == ValueType::ARRAY) name += "[" + std::string(value_type_name(elem_type)) + "]";
    return name;
}

size_t scalar_size(ValueType type) {
    switch (type) {
        case ValueType::UINT8:
        case ValueType::INT8:
        case ValueType::BOOL:
            return 1;
        case ValueType::UINT16:
        case ValueType::INT16:
            return 2;
        case ValueType::UINT32:
        case ValueType::INT32:
        case ValueType::FLOAT32:
            return 4;
        case ValueType::UINT64:
        case ValueType::INT64:
        case ValueType::FLOAT64:
            return 8;
        case ValueType::STRING:
        case ValueType::ARRAY:
            return 0;
    }
    return 0;
}

Value Value::scalar(std::string_view key, ValueType type, std::span<const std::byte> raw) {
    Value v;
    v.key_ = key;
    v.type_ = type;
    std::memcpy(v.scalar_.data(), raw.data(), std::min(raw.size(), v.scalar_.size()));
    return v;
}

Value Value::string(std::string_view key, std::string_view text) {
    Value v;
    v.key_ = key;
    v.type_ = ValueType::STRING;
    v.text_ = text;
    return v;
}

Value Value::numeric_array(std::string_view key, ValueType elem_type, uint64_t count, const std::byte* data) {
    Value v;
    v.key_ = key;
    v.type_ = ValueType::ARRAY;
    v.elem_type_ = elem_type;
    v.count_ = count;
    v.data_ = data;
    return v;
}

Value Value::string_array(std::string_view key, std::vector<std::string_view> strings) {
    Value v;
    v.key_ = key;
    v.type_ = ValueType::ARRAY;
    v.elem_type_ = ValueType::STRING;
    v.count_ = strings.size();
    v.strings_ = std::move(strings);
    return v;
}

void Value::expect(ValueType want) const {
    if (type_ != want) {
        throw KeyError("key '" + std::string(key_) + "': expected " + std::string(value_type_name(want)) + ", found " +
                       type_name());
    }
}

void Value::expect_array(ValueType want_elem) const {
    if (type_ != ValueType::ARRAY || elem_type_ != want_elem) {
        throw KeyError("key '" + std::string(key_) + "': expected " + value_type_name(ValueType::ARRAY, want_elem) +
                       ", found " + type_name());
    }
}

int64_t Value::to_int() const {
    switch (type_) {
        case ValueType::UINT8:
            return get<uint8_t>();
        case ValueType::INT8:
            return get<int8_t>();
        case ValueType::UINT16:
            return get<uint16_t>();
        case ValueType::INT16:
            return get<int16_t>();
        case ValueType::UINT32:
            return get<uint32_t>();
        case ValueType::INT32:
            return get<int32_t>();
        case ValueType::INT64:
            return get<int64_t>();
        case ValueType::BOOL:
            return get<bool>() ? 1 : 0;
        case ValueType::UINT64: {
            const uint64_t u = get<uint64_t>();
            if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                throw KeyError("key '" + std::string(key_) + "': value " + std::to_string(u) + " is out of range");
            return static_cast<int64_t>(u);
        }
        default:
            throw KeyError("key '" + std::string(key_) + "': expected an integer, found " + type_name());
    }
}

double Value::to_double() const {
    switch (type_) {
        case ValueType::FLOAT32:
            return get<float>();
        case ValueType::FLOAT64:
            return get<double>();
        case ValueType::UINT64:
            return static_cast<double>(get<uint64_t>());
        case ValueType::STRING:
        case ValueType::ARRAY:
        case ValueType::BOOL:
            throw KeyError("key '" + std::string(key_) + "': expected a number, found " + type_name());
        default:
            return static_cast<double>(to_int());
    }
}

std::span<const std::byte> Value::raw_array_bytes() const {
    expect(ValueType::ARRAY);
    return {data_, static_cast<size_t>(count_ * scalar_size(elem_type_))};
}

namespace {

std::string quote(std::string_view s, size_t max_chars) {
    std::string out = "\"";
    size_t n = 0;
    for (char c : s) {
        if (n++ == max_chars) {
            out += "...";
            break;
        }
        if (c == '\n')
            out += "\\n";
        else if (c == '"')
            out += "\\\"";
        else if (c == '\\')
            out += "\\\\";
        else if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
            out += buf;
        } else
            out += c;
    }
    return out + "\"";
}

std::string number_text(ValueType type, const std::byte* raw) {
    char buf[64];
    auto load = [raw](auto v) {
        std::memcpy(&v, raw, sizeof v);
        return v;
    };
    switch (type) {
        case ValueType::UINT8:
            return std::to_string(load(uint8_t{}));
        case ValueType::INT8:
            return std::to_string(load(int8_t{}));
        case ValueType::UINT16:
            return std::to_string(load(uint16_t{}));
        case ValueType::INT16:
            return std::to_string(load(int16_t{}));
        case ValueType::UINT32:
            return std::to_string(load(uint32_t{}));
        case ValueType::INT32:
            return std::to_string(load(int32_t{}));
        case ValueType::UINT64:
            return std::to_string(load(uint64_t{}));
        case ValueType::INT64:
            return std::to_string(load(int64_t{}));
        case ValueType::BOOL:
            return load(uint8_t{}) ? "true" : "false";
        case ValueType::FLOAT32:
            std::snprintf(buf, sizeof buf, "%g", static_cast<double>(load(float{})));
            return buf;
        case ValueType::FLOAT64:
            std::snprintf(buf, sizeof buf, "%g", load(double{}));
            return buf;
        default:
            return "?";
    }
}

}  // namespace

std::string Value::to_display(size_t max_items, size_t max_chars) const {
    if (type_ == ValueType::STRING) return quote(text_, max_chars);
    if (type_ != ValueType::ARRAY) return number_text(type_, scalar_.data());
    std::string out = "[";
    const uint64_t shown = std::min<uint64_t>(count_, max_items);
    for (uint64_t i = 0; i < shown; ++i) {
        if (i) out += ", ";
        out += elem_type_ == ValueType::STRING ? quote(strings_[i], 24)
                                               : number_text(elem_type_, data_ + i * scalar_size(elem_type_));
    }
    if (shown < count_) out += ", ... " + std::to_string(count_) + " items";
    return out + "]";
}

}  // namespace fitllm::gguf
