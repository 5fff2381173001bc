#include "gguf/gguf_reader.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace fitllm::gguf {

static_assert(std::endian::native == std::endian::little, "fitllm reads GGUF on little-endian hosts only");

namespace {

// Smallest possible encodings, used to bound counts by the bytes actually left in the file
// before anything is allocated from them.
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;        // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims=0, type, offset

std::string num(uint64_t v) {
    return std::to_string(v);
}

}  // namespace

FormatError::FormatError(std::string source, uint64_t offset, std::string field, const std::string& problem)
    : Error(source + ": byte " + std::to_string(offset) + " (" + field + "): " + problem),
      source_(std::move(source)),
      offset_(offset),
      field_(std::move(field)) {}

// Reads the file front to back; every read is bounds-checked against the bytes left.
class Parser {
public:
    explicit Parser(GgufFile& file) : f_(file), bytes_(file.bytes_) {}

    void run() {
        read_header();
        read_metadata();
        read_alignment();
        read_tensor_infos();
        place_data_section();
        check_tensor_data();
    }

private:
    [[noreturn]] void fail(uint64_t at, const std::string& field, const std::string& problem) const {
        throw FormatError(f_.source_, at, field, problem);
    }
    uint64_t left() const { return bytes_.size() - pos_; }

    void need(uint64_t n, const std::string& field) const {
        if (n > left()) {
            fail(pos_, field, "file ends " + num(left()) + " bytes after this point, " + num(n) + " needed");
        }
    }
    template <class T>
    T read(const std::string& field) {
        need(sizeof(T), field);
        T v;
        std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }
    std::string_view read_string(const std::string& field) {
        const uint64_t at = pos_;
        const uint64_t len = read<uint64_t>(field + " length");
        if (len > left()) {
            fail(at, field + " length",
                 "string length " + num(len) + " exceeds the " + num(left()) + " bytes left in the file");
        }
        std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
        pos_ += len;
        return s;
    }

    void read_header() {
        if (bytes_.size() < 4 || std::memcmp(bytes_.data(), "GGUF", 4) != 0) {
            fail(0, "magic",
                 bytes_.size() < 4 ? "file is " + num(bytes_.size()) + " bytes, too short for a GGUF header"
                                   : "not a GGUF file (magic is not \"GGUF\")");
        }
        pos_ = 4;
        const uint32_t version = read<uint32_t>("version");
        if (version == 1) fail(4, "version", "unsupported version 1 (GGUF v1 is obsolete; convert the file to v3)");
        if ((version & 0xFFFF) == 0 && (version >> 16) != 0) {
            fail(4, "version",
                 "file looks big-endian (version reads as " + num(version) + "); only little-endian GGUF is supported");
        }
        if (version != 2 && version != 3)
            fail(4, "version", "unsupported version " + num(version) + " (supported: 2, 3)");
        f_.version_ = version;
        n_tensors_ = read<uint64_t>("tensor count");
        n_kv_ = read<uint64_t>("metadata count");
        // Counts are bounded by what could possibly fit in the rest of the file.
        if (n_kv_ > left() / kMinKeyValueBytes) {
            fail(16, "metadata count",
                 "metadata count " + num(n_kv_) + " cannot fit in the " + num(left()) + " bytes left in the file");
        }
        if (n_tensors_ > (left() - n_kv_ * kMinKeyValueBytes) / kMinTensorInfoBytes) {
            fail(8, "tensor count",
                 "tensor count " + num(n_tensors_) + " cannot fit in the " + num(left()) + " bytes left in the file");
        }
    }

    void read_metadata() {
        f_.metadata_.reserve(n_kv_);
        kv_offsets_.reserve(n_kv_);
        for (uint64_t i = 0; i < n_kv_; ++i) {
            const uint64_t at = pos_;
            const std::string_view key = read_string("key of metadata entry " + num(i));
            const std::string field = "metadata '" + std::string(key) + "'";
            const uint64_t type_at = pos_;
            const uint32_t type = read<uint32_t>(field + " type");
            if (type >= kValueTypeCount) fail(type_at, field + " type", "unknown value type " + num(type));
            Value value = read_value(key, static_cast<ValueType>(type), field);
            if (!f_.key_index_.emplace(key, f_.metadata_.size()).second) {
                fail(at, field, "duplicate key '" + std::string(key) + "'");
            }
            f_.metadata_.push_back(std::move(value));
            kv_offsets_.push_back(at);
        }
    }

    Value read_value(std::string_view key, ValueType type, const std::string& field) {
        if (type == ValueType::STRING) return Value::string(key, read_string(field));
        if (type != ValueType::ARRAY) return read_scalar(key, type, field);

        const uint64_t elem_at = pos_;
        const uint32_t elem = read<uint32_t>(field + " array type");
        if (elem >= kValueTypeCount) fail(elem_at, field + " array type", "unknown array element type " + num(elem));
        const auto elem_type = static_cast<ValueType>(elem);
        if (elem_type == ValueType::ARRAY) fail(elem_at, field + " array type", "nested arrays are not supported");
        const uint64_t count_at = pos_;
        const uint64_t count = read<uint64_t>(field + " array length");
        if (elem_type == ValueType::STRING) {
            if (count > left() / 8) {
                fail(
                    count_at, field + " array length",
                    "array of " + num(count) + " strings cannot fit in the " + num(left()) + " bytes left in the file");
            }
            std::vector<std::string_view> strings;
            strings.reserve(count);
            for (uint64_t j = 0; j < count; ++j) strings.push_back(read_string(field + "[" + num(j) + "]"));
            return Value::string_array(key, std::move(strings));
        }
        const size_t size = scalar_size(elem_type);
        if (count > left() / size) {
            fail(count_at, field + " array length",
                 "array of " + num(count) + " " + std::string(value_type_name(elem_type)) + " (" + num(size) +
                     " bytes each) exceeds the " + num(left()) + " bytes left in the file");
        }
        const std::byte* data = bytes_.data() + pos_;
        if (elem_type == ValueType::BOOL) {
            for (uint64_t j = 0; j < count; ++j) check_bool(data[j], pos_ + j, field + "[" + num(j) + "]");
        }
        pos_ += count * size;
        return Value::numeric_array(key, elem_type, count, data);
    }

    Value read_scalar(std::string_view key, ValueType type, const std::string& field) {
        const size_t size = scalar_size(type);
        need(size, field + " value");
        std::span<const std::byte> raw(bytes_.data() + pos_, size);
        if (type == ValueType::BOOL) check_bool(raw[0], pos_, field);
        pos_ += size;
        return Value::scalar(key, type, raw);
    }

    void check_bool(std::byte b, uint64_t at, const std::string& field) const {
        // Any other byte would not survive a round trip; refuse it rather than guess.
        if (b != std::byte{0} && b != std::byte{1})
            fail(at, field, "bool value " + num(std::to_integer<int>(b)) + " is neither 0 nor 1");
    }

    void read_alignment() {
        auto it = f_.key_index_.find("general.alignment");
        if (it == f_.key_index_.end()) return;
        const Value& v = f_.metadata_[it->second];
        const uint64_t at = kv_offsets_[it->second];
        const std::string field = "metadata 'general.alignment'";
        if (v.type() != ValueType::UINT32) fail(at, field, "must be uint32, found " + v.type_name());
        const uint32_t a = v.get<uint32_t>();
        if (a == 0 || !std::has_single_bit(a)) fail(at, field, "alignment " + num(a) + " is not a power of two");
        f_.alignment_ = a;
    }

    void read_tensor_infos() {
        f_.tensors_.reserve(n_tensors_);
        for (uint64_t i = 0; i < n_tensors_; ++i) {
            TensorInfo t;
            t.info_offset = pos_;
            t.name = read_string("name of tensor " + num(i));
            const std::string field = "tensor '" + std::string(t.name) + "'";
            const uint64_t dims_at = pos_;
            t.n_dims = read<uint32_t>(field + " n_dims");
            if (t.n_dims > kMaxDims)
                fail(dims_at, field + " n_dims", num(t.n_dims) + " dimensions, at most 4 supported");
            for (uint32_t d = 0; d < t.n_dims; ++d) {
                const uint64_t at = pos_;
                const uint64_t ne = read<uint64_t>(field + " ne[" + num(d) + "]");
                if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                    fail(at, field + " ne[" + num(d) + "]", "dimension " + num(ne) + " is out of range");
                }
                t.ne[d] = static_cast<int64_t>(ne);
            }
            const uint64_t type_at = pos_;
            const uint32_t type = read<uint32_t>(field + " type");
            if (!quant::traits_of(type)) fail(type_at, field + " type", "unknown ggml type id " + num(type));
            if (!quant::is_supported(type)) {
                fail(type_at, field + " type",
                     "ggml type " + std::string(quant::type_name(type)) + " (id " + num(type) +
                         ") was removed from ggml and is not supported; requantize the model");
            }
            t.type = static_cast<quant::GgmlType>(type);
            size_tensor(t, field, dims_at);
            const uint64_t offset_at = pos_;
            t.offset = read<uint64_t>(field + " offset");
            if (t.offset % f_.alignment_ != 0) {
                fail(offset_at, field + " offset",
                     "offset " + num(t.offset) + " is not a multiple of the alignment " + num(f_.alignment_));
            }
            if (!f_.tensor_index_.emplace(t.name, f_.tensors_.size()).second) {
                fail(t.info_offset, field, "duplicate tensor name '" + std::string(t.name) + "'");
            }
            f_.tensors_.push_back(t);
        }
    }

    // Element count and byte size, refusing anything that overflows 63 bits.
    void size_tensor(TensorInfo& t, const std::string& field, uint64_t dims_at) const {
        constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
        uint64_t n = 1;
        for (uint32_t d = 0; d < t.n_dims; ++d) {
            const auto ne = static_cast<uint64_t>(t.ne[d]);
            if (ne != 0 && n > kMax / ne) fail(dims_at, field + " shape", "element count overflows 63 bits");
            n *= ne;
        }
        const quant::TypeTraits& tt = quant::traits(t.type);
        if (static_cast<uint64_t>(t.ne[0]) % tt.block_elements != 0) {
            fail(dims_at, field + " shape",
                 "row length " + num(t.ne[0]) + " is not a multiple of the block size " + num(tt.block_elements) +
                     " of " + std::string(tt.name));
        }
        const uint64_t blocks = n / tt.block_elements;
        if (blocks > kMax / tt.block_bytes) fail(dims_at, field + " shape", "byte size overflows 63 bits");
        t.n_elements = n;
        t.n_bytes = blocks * tt.block_bytes;
    }

    void place_data_section() {
        const uint64_t a = f_.alignment_;
        f_.data_offset_ = (pos_ + a - 1) / a * a;  // pos_ <= file size < 2^63: cannot overflow
        // A file without tensors (vocab-only) may end before the padding.
        if (n_tensors_ > 0 && f_.data_offset_ > bytes_.size()) {
            fail(pos_, "data section",
                 "file ends at byte " + num(bytes_.size()) + ", before the data section at " + num(f_.data_offset_));
        }
    }

    void check_tensor_data() {
        const uint64_t data_size = bytes_.size() > f_.data_offset_ ? bytes_.size() - f_.data_offset_ : 0;
        for (TensorInfo& t : f_.tensors_) {
            if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
                fail(t.info_offset, "tensor '" + std::string(t.name) + "' data",
                     "bytes [" + num(t.offset) + ", " + num(t.offset) + "+" + num(t.n_bytes) +
                         ") reach past the end of the data section (" + num(data_size) + " bytes)");
            }
            t.data = bytes_.subspan(f_.data_offset_ + t.offset, t.n_bytes);
        }
        std::vector<const TensorInfo*> by_offset;
        by_offset.reserve(f_.tensors_.size());
        for (const TensorInfo& t : f_.tensors_) {
            if (t.n_bytes > 0) by_offset.push_back(&t);
        }
        std::sort(by_offset.begin(), by_offset.end(),
                  [](const TensorInfo* x, const TensorInfo* y) { return x->offset < y->offset; });
        for (size_t i = 1; i < by_offset.size(); ++i) {
            const TensorInfo& prev = *by_offset[i - 1];
            const TensorInfo& cur = *by_offset[i];
            if (prev.offset + prev.n_bytes > cur.offset) {
                fail(cur.info_offset, "tensor '" + std::string(cur.name) + "' data",
                     "bytes from offset " + num(cur.offset) + " overlap tensor '" + std::string(prev.name) + "' at [" +
                         num(prev.offset) + ", " + num(prev.offset + prev.n_bytes) + ")");
            }
        }
    }

    GgufFile& f_;
    std::span<const std::byte> bytes_;
    uint64_t pos_ = 0;
    uint64_t n_tensors_ = 0;
    uint64_t n_kv_ = 0;
    std::vector<uint64_t> kv_offsets_;  // where each metadata entry starts, for messages
};

GgufFile GgufFile::open(const std::string& path, io::MapOptions options) {
    GgufFile f;
    f.source_ = path;
    f.mapping_ = std::make_unique<io::MappedFile>(io::MappedFile::open(path, options));
    f.bytes_ = f.mapping_->bytes();
    f.parse_all();
    return f;
}

GgufFile GgufFile::parse(std::span<const std::byte> bytes, std::string source) {
    GgufFile f;
    f.source_ = std::move(source);
    f.bytes_ = bytes;
    f.parse_all();
    return f;
}

void GgufFile::parse_all() {
    Parser(*this).run();
}

const Value* GgufFile::find(std::string_view key) const {
    auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &metadata_[it->second];
}

const Value& GgufFile::at(std::string_view key) const {
    const Value* v = find(key);
    if (!v) throw KeyError(source_ + ": missing key '" + std::string(key) + "'");
    return *v;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace fitllm::gguf
