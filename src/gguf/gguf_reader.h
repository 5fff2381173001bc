#pragma once
// Reading GGUF files (versions 2 and 3). Everything is validated before anyone can use it:
// a file that parses is safe to index, and every error names the byte offset and the field.
//
// Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata count,
// metadata (key string, u32 type, value)*, tensor infos (name, u32 n_dims, u64 ne[n_dims],
// u32 ggml type, u64 offset)*, padding to general.alignment, data section.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fitllm/error.h"
#include "gguf/gguf_value.h"
#include "io/mapped_file.h"
#include "quant/ggml_type.h"

namespace fitllm::gguf {

inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr uint32_t kMaxDims = 4;

// A malformed file: what is wrong, where (byte offset), and in which field.
class FormatError : public Error {
public:
    FormatError(std::string source, uint64_t offset, std::string field, const std::string& problem);
    const std::string& source() const { return source_; }
    uint64_t offset() const { return offset_; }
    const std::string& field() const { return field_; }

private:
    std::string source_;
    uint64_t offset_;
    std::string field_;
};

struct TensorInfo {
    std::string_view name;
    uint32_t n_dims = 0;
    std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};  // ne[0]: elements per row (innermost)
    quant::GgmlType type = quant::GgmlType::F32;
    uint64_t offset = 0;  // from the start of the data section
    uint64_t n_elements = 0;
    uint64_t n_bytes = 0;
    uint64_t info_offset = 0;         // where this tensor's info starts in the file (for messages)
    std::span<const std::byte> data;  // view into the file
};

class GgufFile {
public:
    // Maps the file read-only and parses it. Throws io::IoError or FormatError.
    static GgufFile open(const std::string& path, io::MapOptions options = {});
    // Parses bytes owned by the caller, who keeps them alive as long as the GgufFile.
    // `source` names them in errors.
    static GgufFile parse(std::span<const std::byte> bytes, std::string source);

    GgufFile(GgufFile&&) noexcept = default;
    GgufFile& operator=(GgufFile&&) noexcept = default;

    const std::string& source() const { return source_; }
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    // Start of the data section. A file without tensors may end before it (no padding), so
    // data_offset() can exceed size() there.
    uint64_t data_offset() const { return data_offset_; }
    uint64_t size() const { return bytes_.size(); }
    std::span<const std::byte> bytes() const { return bytes_; }
    // The mapping behind open(); nullptr after parse().
    const io::MappedFile* mapping() const { return mapping_.get(); }
    io::MappedFile* mapping() { return mapping_.get(); }

    // Metadata in file order.
    const std::vector<Value>& metadata() const { return metadata_; }
    const Value* find(std::string_view key) const;
    bool has(std::string_view key) const { return find(key) != nullptr; }
    // The value under key, which must exist: KeyError otherwise.
    const Value& at(std::string_view key) const;

    // Typed getters: the type must match exactly; KeyError names the file, key and types.
    template <class T>
    T get(std::string_view key) const {
        const Value& v = at(key);
        return with_source([&] { return v.get<T>(); });
    }
    template <class T>
    std::optional<T> get_optional(std::string_view key) const {
        const Value* v = find(key);
        if (!v) return std::nullopt;
        return with_source([&] { return v->get<T>(); });
    }
    // Lenient getters for numbers whose integer width varies between writers.
    int64_t get_int(std::string_view key) const {
        const Value& v = at(key);
        return with_source([&] { return v.to_int(); });
    }
    double get_double(std::string_view key) const {
        const Value& v = at(key);
        return with_source([&] { return v.to_double(); });
    }

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(std::string_view name) const;

private:
    GgufFile() = default;
    template <class F>
    auto with_source(F&& f) const -> decltype(f()) {
        try {
            return f();
        } catch (const KeyError& e) {
            throw KeyError(source_ + ": " + e.what());
        }
    }
    void parse_all();

    friend class Parser;
    std::string source_;
    std::unique_ptr<io::MappedFile> mapping_;
    std::span<const std::byte> bytes_;
    uint32_t version_ = 0;
    uint32_t alignment_ = kDefaultAlignment;
    uint64_t data_offset_ = 0;
    std::vector<Value> metadata_;
    std::unordered_map<std::string_view, size_t> key_index_;
    std::vector<TensorInfo> tensors_;
    std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace fitllm::gguf
