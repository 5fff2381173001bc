#pragma once
// Writing GGUF files: metadata in the order added, tensor infos, then tensor data, each
// tensor padded to the alignment. A file read by GgufFile and written back through
// add_value/add_tensor in the same order comes out byte-identical.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_value.h"
#include "quant/ggml_type.h"

namespace fitllm::gguf {

class GgufWriter {
public:
    explicit GgufWriter(uint32_t version = 3);

    // Scalars; T is one of the GGUF scalar types (uint8_t ... double, bool).
    template <class T>
    void add(std::string_view key, T value) {
        static_assert(!std::is_same_v<T, std::string_view>, "use add_string");
        add_raw_scalar(key, ValueTypeOf<T>::value, &value, sizeof(T));
    }
    void add_string(std::string_view key, std::string_view value);
    template <class T>
    void add_array(std::string_view key, std::span<const T> values) {
        add_raw_array(key, ValueTypeOf<T>::value, values.size(), values.data(), values.size_bytes());
    }
    void add_string_array(std::string_view key, std::span<const std::string> values);
    void add_string_array(std::string_view key, std::span<const std::string_view> values);
    // Copies a value read from another file, type and all.
    void add_value(const Value& value);

    // A tensor whose bytes stay owned by the caller until write; dims are ne[0] (row) first.
    void add_tensor(std::string_view name, quant::GgmlType type, std::span<const int64_t> dims,
                    std::span<const std::byte> data);
    // The same, the writer keeping the bytes.
    void add_tensor(std::string_view name, quant::GgmlType type, std::span<const int64_t> dims,
                    std::vector<std::byte>&& data);

    // Only a tensor's info, its bytes written by the caller after header_bytes() (streaming):
    // n_bytes of data padded to the alignment, in the order of the infos. to_bytes() refuses
    // a writer with such tensors.
    void add_tensor_info(std::string_view name, quant::GgmlType type, std::span<const int64_t> dims);

    uint32_t alignment() const { return alignment_; }
    // Everything before the data section: header, metadata, tensor infos, padding.
    std::vector<std::byte> header_bytes() const;
    std::vector<std::byte> to_bytes() const;
    // Writes to PATH.tmp and renames it over PATH, so PATH is never left half-written.
    void write_file(const std::string& path) const;

private:
    struct Tensor {
        std::string name;
        quant::GgmlType type;
        std::vector<int64_t> dims;
        std::span<const std::byte> data;
        std::vector<std::byte> owned;
        uint64_t n_bytes = 0;
        bool info_only = false;
    };
    uint64_t check_tensor(std::string_view name, quant::GgmlType type, std::span<const int64_t> dims) const;
    void begin_key(std::string_view key, ValueType type);
    void add_raw_scalar(std::string_view key, ValueType type, const void* value, size_t size);
    void add_raw_array(std::string_view key, ValueType elem, uint64_t count, const void* data, size_t bytes);
    template <class Strings>
    void add_strings(std::string_view key, const Strings& values);
    void put(const void* p, size_t n) { put(metadata_, p, n); }
    static void put(std::vector<std::byte>& out, const void* p, size_t n);
    template <class T>
    void put_le(T v) {
        put(&v, sizeof v);
    }
    void put_string(std::string_view s);

    uint32_t version_;
    uint32_t alignment_ = kDefaultAlignment;
    uint64_t n_kv_ = 0;
    std::vector<std::byte> metadata_;  // serialized key/value pairs, in order
    std::unordered_set<std::string> keys_;
    std::vector<Tensor> tensors_;
    std::unordered_set<std::string> tensor_names_;
};

}  // namespace fitllm::gguf
