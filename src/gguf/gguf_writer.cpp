#include "gguf/gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace fitllm::gguf {

GgufWriter::GgufWriter(uint32_t version) : version_(version) {
    if (version != 2 && version != 3) throw Error("GgufWriter: version " + std::to_string(version) + " unsupported");
}

void GgufWriter::put(std::vector<std::byte>& out, const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
}

void GgufWriter::put_string(std::string_view s) {
    put_le<uint64_t>(s.size());
    put(s.data(), s.size());
}

void GgufWriter::begin_key(std::string_view key, ValueType type) {
    if (!keys_.emplace(key).second) throw Error("GgufWriter: duplicate key '" + std::string(key) + "'");
    put_string(key);
    put_le<uint32_t>(static_cast<uint32_t>(type));
    ++n_kv_;
}

void GgufWriter::add_raw_scalar(std::string_view key, ValueType type, const void* value, size_t size) {
    if (key == "general.alignment") {
        uint32_t a = 0;
        if (type != ValueType::UINT32) throw Error("GgufWriter: general.alignment must be uint32");
        std::memcpy(&a, value, sizeof a);
        if (a == 0 || !std::has_single_bit(a))
            throw Error("GgufWriter: alignment " + std::to_string(a) + " is not a power of two");
        if (!tensors_.empty()) throw Error("GgufWriter: set general.alignment before adding tensors");
        alignment_ = a;
    }
    begin_key(key, type);
    put(value, size);
}

void GgufWriter::add_string(std::string_view key, std::string_view value) {
    begin_key(key, ValueType::STRING);
    put_string(value);
}

void GgufWriter::add_raw_array(std::string_view key, ValueType elem, uint64_t count, const void* data, size_t bytes) {
    begin_key(key, ValueType::ARRAY);
    put_le<uint32_t>(static_cast<uint32_t>(elem));
    put_le<uint64_t>(count);
    put(data, bytes);
}

template <class Strings>
void GgufWriter::add_strings(std::string_view key, const Strings& values) {
    begin_key(key, ValueType::ARRAY);
    put_le<uint32_t>(static_cast<uint32_t>(ValueType::STRING));
    put_le<uint64_t>(values.size());
    for (const auto& s : values) put_string(s);
}

void GgufWriter::add_string_array(std::string_view key, std::span<const std::string> values) {
    add_strings(key, values);
}
void GgufWriter::add_string_array(std::string_view key, std::span<const std::string_view> values) {
    add_strings(key, values);
}

void GgufWriter::add_value(const Value& v) {
    switch (v.type()) {
        case ValueType::STRING:
            add_string(v.key(), v.get<std::string_view>());
            break;
        case ValueType::ARRAY:
            if (v.array_type() == ValueType::STRING)
                add_strings(v.key(), v.strings());
            else
                add_raw_array(v.key(), v.array_type(), v.array_size(), v.raw_array_bytes().data(),
                              v.raw_array_bytes().size());
            break;
        default:
            add_raw_scalar(v.key(), v.type(), v.raw_scalar_bytes().data(), v.raw_scalar_bytes().size());
    }
}

uint64_t GgufWriter::check_tensor(std::string_view name, quant::GgmlType type, std::span<const int64_t> dims) const {
    const std::string where = "GgufWriter: tensor '" + std::string(name) + "': ";
    if (dims.size() > kMaxDims) throw Error(where + "has more than 4 dimensions");  // 0 dims: a scalar
    uint64_t n = 1;
    for (int64_t d : dims) {
        if (d < 0) throw Error(where + "negative dimension");
        if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) throw Error(where + "element count overflows");
    }
    const uint64_t row = dims.empty() ? 1 : static_cast<uint64_t>(dims[0]);
    if (row % quant::traits(type).block_elements != 0) {
        throw Error(where + "row length " + std::to_string(row) + " is not a multiple of the block size of " +
                    std::string(quant::traits(type).name));
    }
    if (tensor_names_.count(std::string(name)) != 0) throw Error(where + "duplicate tensor name");
    return n / quant::traits(type).block_elements * quant::traits(type).block_bytes;
}

void GgufWriter::add_tensor(std::string_view name, quant::GgmlType type, std::span<const int64_t> dims,
                            std::span<const std::byte> data) {
    const uint64_t expected = check_tensor(name, type, dims);
    if (data.size() != expected) {
        throw Error("GgufWriter: tensor '" + std::string(name) + "': " + std::to_string(data.size()) +
                    " bytes given, " + std::to_string(expected) + " expected");
    }
    tensor_names_.emplace(name);
    tensors_.push_back(
        {std::string(name), type, std::vector<int64_t>(dims.begin(), dims.end()), data, {}, expected, false});
}

void GgufWriter::add_tensor(std::string_view name, quant::GgmlType type, std::span<const int64_t> dims,
                            std::vector<std::byte>&& data) {
    add_tensor(name, type, dims, std::span<const std::byte>(data));
    tensors_.back().owned = std::move(data);
    tensors_.back().data = tensors_.back().owned;
}

void GgufWriter::add_tensor_info(std::string_view name, quant::GgmlType type, std::span<const int64_t> dims) {
    const uint64_t n_bytes = check_tensor(name, type, dims);
    tensor_names_.emplace(name);
    tensors_.push_back(
        {std::string(name), type, std::vector<int64_t>(dims.begin(), dims.end()), {}, {}, n_bytes, true});
}

std::vector<std::byte> GgufWriter::header_bytes() const {
    const uint64_t a = alignment_;
    auto padded = [a](uint64_t n) { return (n + a - 1) / a * a; };
    std::vector<std::byte> out;
    auto le = [&out](auto v) { put(out, &v, sizeof v); };
    put(out, "GGUF", 4);
    le(version_);
    le(static_cast<uint64_t>(tensors_.size()));
    le(n_kv_);
    put(out, metadata_.data(), metadata_.size());
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
        le(static_cast<uint64_t>(t.name.size()));
        put(out, t.name.data(), t.name.size());
        le(static_cast<uint32_t>(t.dims.size()));
        for (int64_t d : t.dims) le(static_cast<uint64_t>(d));
        le(static_cast<uint32_t>(t.type));
        le(offset);
        offset += padded(t.n_bytes);
    }
    // A file without tensors ends right after its header, as llama.cpp and gguf-py write
    // vocab-only files: the data section (and its padding) is empty.
    if (!tensors_.empty()) out.resize(padded(out.size()));
    return out;
}

std::vector<std::byte> GgufWriter::to_bytes() const {
    const uint64_t a = alignment_;
    auto padded = [a](uint64_t n) { return (n + a - 1) / a * a; };
    std::vector<std::byte> out = header_bytes();
    uint64_t total = 0;
    for (const Tensor& t : tensors_) {
        if (t.info_only) throw Error("GgufWriter: tensor '" + t.name + "' has no data (added with add_tensor_info)");
        total += padded(t.n_bytes);
    }
    out.reserve(out.size() + total);
    for (const Tensor& t : tensors_) {
        put(out, t.data.data(), t.data.size());
        out.resize(padded(out.size()));
    }
    return out;
}

void GgufWriter::write_file(const std::string& path) const {
    const std::vector<std::byte> bytes = to_bytes();
    const std::string tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw Error(tmp + ": cannot create: " + std::strerror(errno));
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    const int saved = errno;
    if (std::fclose(f) != 0 || !ok) {
        std::remove(tmp.c_str());
        throw Error(tmp + ": write failed: " + std::strerror(ok ? errno : saved));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        std::remove(tmp.c_str());
        throw Error(path + ": cannot rename " + tmp + " over it: " + std::strerror(e));
    }
}

}  // namespace fitllm::gguf
