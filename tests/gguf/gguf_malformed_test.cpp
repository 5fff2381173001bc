// Malformed GGUF files: each one must be refused with a FormatError that names the field, the
// problem and (where the file layout fixes it) the byte offset; none may crash or read out of
// bounds. Most cases start from one valid file made by GgufWriter and patch bytes at offsets
// found by walking its layout here, independently of the reader; the rest are spelled out
// byte by byte.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "test_support.h"

namespace fitllm::gguf {
namespace {

using quant::GgmlType;

constexpr std::string_view kSource = "bad.gguf";
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kI64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// ---------------------------------------------------------------------------------------------
// Building and patching bytes

// Little-endian bytes by hand, for files the writer refuses to make.
class Bytes {
public:
    Bytes& raw(std::string_view s) {
        for (char c : s) out_.push_back(static_cast<std::byte>(c));
        return *this;
    }
    template <class T>
    Bytes& le(T v) {
        unsigned char b[sizeof(T)];
        std::memcpy(b, &v, sizeof(T));  // the reader itself only runs on little-endian hosts
        for (unsigned char c : b) out_.push_back(static_cast<std::byte>(c));
        return *this;
    }
    Bytes& u8(uint8_t v) { return le(v); }
    Bytes& u32(uint32_t v) { return le(v); }
    Bytes& u64(uint64_t v) { return le(v); }
    Bytes& type(ValueType t) { return u32(static_cast<uint32_t>(t)); }
    Bytes& str(std::string_view s) { return u64(s.size()).raw(s); }
    Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
    }
    Bytes& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(dims.size()));
        for (uint64_t d : dims) u64(d);
        return u32(type).u64(offset);
    }
    Bytes& pad_to(size_t alignment) {
        while (out_.size() % alignment != 0) out_.push_back(std::byte{0});
        return *this;
    }
    Bytes& zeros(size_t n) {
        out_.resize(out_.size() + n);
        return *this;
    }
    size_t size() const { return out_.size(); }
    std::vector<std::byte> bytes() const { return out_; }

private:
    std::vector<std::byte> out_;
};

template <class T>
void poke(std::vector<std::byte>& bytes, uint64_t at, T v) {
    ASSERT_LE(at + sizeof(T), bytes.size());
    std::memcpy(bytes.data() + at, &v, sizeof(T));
}

std::vector<std::byte> prefix(const std::vector<std::byte>& bytes, size_t n) {
    return {bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)};
}

// The parser gets its own heap block of exactly the file's size, so that AddressSanitizer
// (FITLLM_SANITIZE=ON) reports any read past the end of the file.
struct ExactCopy {
    explicit ExactCopy(std::span<const std::byte> bytes) : size(bytes.size()), data(new std::byte[bytes.size()]) {
        if (size) std::memcpy(data.get(), bytes.data(), size);
    }
    std::span<const std::byte> span() const { return {data.get(), size}; }
    size_t size;
    std::unique_ptr<std::byte[]> data;
};

// Parses and expects a FormatError for exactly this field, whose message contains `problem`
// and, when given, points at byte `offset`.
::testing::AssertionResult fails_with(std::span<const std::byte> bytes, std::string_view field,
                                      std::string_view problem, std::optional<uint64_t> offset = std::nullopt) {
    const ExactCopy copy(bytes);
    try {
        GgufFile::parse(copy.span(), std::string(kSource));
        return ::testing::AssertionFailure() << "parsed without error";
    } catch (const FormatError& e) {
        const std::string what = e.what();
        if (e.field() != field) {
            return ::testing::AssertionFailure()
                   << "field is '" << e.field() << "', expected '" << field << "': " << what;
        }
        if (what.find(problem) == std::string::npos) {
            return ::testing::AssertionFailure() << "message lacks \"" << problem << "\": " << what;
        }
        if (offset && e.offset() != *offset) {
            return ::testing::AssertionFailure()
                   << "offset is " << e.offset() << ", expected " << *offset << ": " << what;
        }
        // The documented shape of every message: "SOURCE: byte N (FIELD): problem".
        const std::string head =
            std::string(kSource) + ": byte " + std::to_string(e.offset()) + " (" + e.field() + "): ";
        if (what.rfind(head, 0) != 0)
            return ::testing::AssertionFailure() << "message does not start with '" << head << "': " << what;
        if (e.source() != kSource) return ::testing::AssertionFailure() << "source is '" << e.source() << "'";
        if (e.offset() > bytes.size()) {
            return ::testing::AssertionFailure()
                   << "offset " << e.offset() << " is past the end of the " << bytes.size() << "-byte file: " << what;
        }
        return ::testing::AssertionSuccess();
    } catch (const std::exception& e) {
        return ::testing::AssertionFailure() << "threw something other than FormatError: " << e.what();
    }
}

// ---------------------------------------------------------------------------------------------
// The valid file every patch starts from, and where its fields lie

struct KvAt {
    std::string key;
    uint64_t at = 0;  // the key's length field
    uint64_t type_at = 0;
    uint64_t value_at = 0;  // scalar, string length, or (arrays) the element type
    uint64_t count_at = 0;  // arrays: the length
    uint64_t elems_at = 0;  // arrays: the first element
};

struct TensorAt {
    std::string name;
    uint64_t at = 0;  // the name's length field
    uint64_t n_dims_at = 0;
    uint64_t ne_at = 0;  // ne[0]; ne[d] is at ne_at + 8 * d
    uint64_t type_at = 0;
    uint64_t offset_at = 0;
    uint64_t offset = 0;
};

struct Layout {
    uint64_t end_of_metadata = 0;
    uint64_t end_of_infos = 0;
    uint64_t data_offset = 0;
    std::vector<KvAt> kvs;
    std::vector<TensorAt> tensors;

    const KvAt& kv(std::string_view key) const {
        for (const KvAt& k : kvs)
            if (k.key == key) return k;
        throw std::runtime_error("no key " + std::string(key) + " in the base file");
    }
    const TensorAt& tensor(std::string_view name) const {
        for (const TensorAt& t : tensors)
            if (t.name == name) return t;
        throw std::runtime_error("no tensor " + std::string(name) + " in the base file");
    }
};

// Walks a well-formed file (no bounds checks: it is only run on the writer's output).
Layout walk(const std::vector<std::byte>& b, uint64_t alignment) {
    uint64_t pos = 0;
    auto u32 = [&] {
        uint32_t v;
        std::memcpy(&v, b.data() + pos, 4);
        pos += 4;
        return v;
    };
    auto u64 = [&] {
        uint64_t v;
        std::memcpy(&v, b.data() + pos, 8);
        pos += 8;
        return v;
    };
    auto str = [&] {
        const uint64_t n = u64();
        std::string s(reinterpret_cast<const char*>(b.data() + pos), n);
        pos += n;
        return s;
    };
    auto size_of = [](uint32_t type) -> uint64_t {
        switch (static_cast<ValueType>(type)) {
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
            default:
                return 8;
        }
    };
    Layout l;
    pos = 8;
    const uint64_t n_tensors = u64();
    const uint64_t n_kv = u64();
    for (uint64_t i = 0; i < n_kv; ++i) {
        KvAt k;
        k.at = pos;
        k.key = str();
        k.type_at = pos;
        const uint32_t type = u32();
        k.value_at = pos;
        if (type == static_cast<uint32_t>(ValueType::STRING)) {
            str();
        } else if (type == static_cast<uint32_t>(ValueType::ARRAY)) {
            const uint32_t elem = u32();
            k.count_at = pos;
            const uint64_t count = u64();
            k.elems_at = pos;
            for (uint64_t j = 0; j < count; ++j) {
                if (elem == static_cast<uint32_t>(ValueType::STRING))
                    str();
                else
                    pos += size_of(elem);
            }
        } else {
            pos += size_of(type);
        }
        l.kvs.push_back(k);
    }
    l.end_of_metadata = pos;
    for (uint64_t i = 0; i < n_tensors; ++i) {
        TensorAt t;
        t.at = pos;
        t.name = str();
        t.n_dims_at = pos;
        const uint32_t n_dims = u32();
        t.ne_at = pos;
        pos += 8 * n_dims;
        t.type_at = pos;
        u32();
        t.offset_at = pos;
        t.offset = u64();
        l.tensors.push_back(t);
    }
    l.end_of_infos = pos;
    l.data_offset = (pos + alignment - 1) / alignment * alignment;
    return l;
}

constexpr const char* kEmbd = "token_embd.weight";     // F32 [8, 2]: 64 bytes at data offset 0
constexpr const char* kAttnQ = "blk.0.attn_q.weight";  // Q8_0 [64, 1]: 68 bytes at 64
constexpr const char* kOutput = "output.weight";       // Q4_K [256, 2]: 288 bytes at 160

std::vector<std::byte> filler(size_t n, unsigned seed) {
    std::vector<std::byte> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 7 + seed) & 0xFF);
    return v;
}

GgufWriter base_writer(uint32_t version = 3) {
    GgufWriter w(version);
    w.add_string("general.architecture", "llama");
    w.add<uint32_t>("general.alignment", 32);
    w.add<uint32_t>("llama.block_count", 1);
    w.add<float>("llama.rope.freq_base", 10000.0f);
    w.add<bool>("llama.use_parallel_residual", true);
    w.add<int64_t>("test.i64", -3);
    const std::string tokens[] = {"<unk>", "<s>", "</s>", "hello"};
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    const float scores[] = {0.0f, -1.0f, -2.0f, -3.0f};
    w.add_array<float>("tokenizer.ggml.scores", scores);
    const uint8_t flags[] = {1, 2, 3};
    w.add_array<uint8_t>("test.u8s", flags);
    return w;
}

std::vector<std::byte> base_file(uint32_t version = 3) {
    GgufWriter w = base_writer(version);
    const int64_t embd_dims[] = {8, 2};
    const int64_t q_dims[] = {64, 1};
    const int64_t out_dims[] = {256, 2};
    w.add_tensor(kEmbd, GgmlType::F32, embd_dims, filler(64, 1));
    w.add_tensor(kAttnQ, GgmlType::Q8_0, q_dims, filler(68, 2));
    w.add_tensor(kOutput, GgmlType::Q4_K, out_dims, filler(288, 3));
    return w.to_bytes();
}

class GgufMalformed : public ::testing::Test {
protected:
    std::vector<std::byte> file = base_file();
    Layout at = walk(file, 32);
};

// ---------------------------------------------------------------------------------------------
// The starting point

TEST_F(GgufMalformed, BaseFileParsesWhereTheLayoutWalkSays) {
    const GgufFile f = GgufFile::parse(file, std::string(kSource));
    ASSERT_EQ(f.metadata().size(), at.kvs.size());
    ASSERT_EQ(f.tensors().size(), 3u);
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_EQ(f.data_offset(), at.data_offset);
    EXPECT_EQ(f.data_offset() + 160 + 288, file.size());
    EXPECT_NE(at.end_of_infos % 32, 0u) << "the truncation cases below want padding before the data";
    for (size_t i = 0; i < 3; ++i) {
        const TensorInfo& t = f.tensors()[i];
        EXPECT_EQ(t.name, at.tensors[i].name);
        EXPECT_EQ(t.info_offset, at.tensors[i].at);
        EXPECT_EQ(t.offset, at.tensors[i].offset);
        EXPECT_EQ(t.data.data(), f.bytes().data() + f.data_offset() + t.offset);
    }
    EXPECT_EQ(at.tensor(kEmbd).offset, 0u);
    EXPECT_EQ(at.tensor(kAttnQ).offset, 64u);
    EXPECT_EQ(at.tensor(kOutput).offset, 160u);
    EXPECT_EQ(f.tensors()[2].n_bytes, 288u);
}

// ---------------------------------------------------------------------------------------------
// Header

TEST_F(GgufMalformed, BadMagic) {
    poke<char>(file, 3, 'X');
    EXPECT_TRUE(fails_with(file, "magic", "not a GGUF file (magic is not \"GGUF\")", 0));
    const auto ggml = Bytes().raw("lmgg").u32(1).u64(0).u64(0).bytes();  // an old pre-GGUF ggml file
    EXPECT_TRUE(fails_with(ggml, "magic", "not a GGUF file", 0));
}

TEST_F(GgufMalformed, TooShortForMagic) {
    for (size_t n = 0; n < 4; ++n) {
        EXPECT_TRUE(fails_with(prefix(file, n), "magic", "file is " + std::to_string(n) + " bytes, too short", 0)) << n;
    }
    EXPECT_TRUE(fails_with({}, "magic", "too short for a GGUF header", 0));
}

TEST_F(GgufMalformed, Version1IsObsolete) {
    poke<uint32_t>(file, 4, 1);
    EXPECT_TRUE(fails_with(file, "version", "unsupported version 1", 4));
}

TEST_F(GgufMalformed, Version4AndVersion0) {
    poke<uint32_t>(file, 4, 4);
    EXPECT_TRUE(fails_with(file, "version", "unsupported version 4 (supported: 2, 3)", 4));
    poke<uint32_t>(file, 4, 0);
    EXPECT_TRUE(fails_with(file, "version", "unsupported version 0", 4));
    poke<uint32_t>(file, 4, 0xFFFFFFFF);
    EXPECT_TRUE(fails_with(file, "version", "unsupported version 4294967295", 4));
}

TEST_F(GgufMalformed, BigEndianVersion) {
    for (uint32_t version : {2u, 3u}) {
        poke<uint32_t>(file, 4, version << 24);  // what a big-endian writer puts there
        EXPECT_TRUE(fails_with(file, "version", "file looks big-endian", 4)) << version;
        EXPECT_TRUE(fails_with(file, "version", "only little-endian GGUF is supported", 4)) << version;
    }
}

TEST_F(GgufMalformed, Version2FileParses) {
    // Same layout as v3 (64-bit counts and lengths): only v1 differed.
    const auto v2 = base_file(2);
    EXPECT_EQ(GgufFile::parse(v2, "v2").version(), 2u);
}

// ---------------------------------------------------------------------------------------------
// Truncation

// Every proper prefix of the file is malformed: each must be refused with a FormatError that
// points inside the prefix, and never crash or throw anything else.
TEST_F(GgufMalformed, TruncatedAtEveryByte) {
    ASSERT_GT(at.data_offset, 100u);
    for (size_t n = 0; n < file.size(); ++n) {
        const std::vector<std::byte> cut = prefix(file, n);
        const ExactCopy copy(cut);
        try {
            GgufFile::parse(copy.span(), std::string(kSource));
            ADD_FAILURE() << "prefix of " << n << " bytes parsed";
        } catch (const FormatError& e) {
            EXPECT_LE(e.offset(), n) << e.what();
            EXPECT_FALSE(e.field().empty()) << e.what();
            const std::string what = e.what();
            if (n < 4) {
                EXPECT_EQ(e.field(), "magic");
            } else if (n < at.end_of_infos) {
                // Cut inside a field: the reader runs out of bytes, or a count or a length no
                // longer fits in what is left.
                EXPECT_TRUE(what.find("file ends") != std::string::npos ||
                            what.find("cannot fit") != std::string::npos || what.find("exceeds") != std::string::npos)
                    << n << ": " << what;
            } else if (n < at.data_offset) {
                EXPECT_EQ(e.field(), "data section") << what;
                EXPECT_EQ(e.offset(), at.end_of_infos) << what;
            } else {
                EXPECT_NE(what.find("reach past the end of the data section"), std::string::npos) << what;
            }
        } catch (const std::exception& e) {
            ADD_FAILURE() << "prefix of " << n << " bytes: not a FormatError: " << e.what();
        }
    }
}

TEST_F(GgufMalformed, TruncationMessagesNameTheField) {
    // Inside the fixed header fields.
    EXPECT_TRUE(fails_with(prefix(file, 20), "metadata count", "file ends 4 bytes after this point, 8 needed", 16));
    EXPECT_TRUE(fails_with(prefix(file, 10), "tensor count", "file ends 2 bytes after this point, 8 needed", 8));
    EXPECT_TRUE(fails_with(prefix(file, 6), "version", "file ends 2 bytes after this point, 4 needed", 4));
    // Early cuts trip the bound on the counts (9 entries of at least 13 bytes and 3 tensor
    // infos of at least 24 bytes need 189 bytes after the header) before any entry is read.
    ASSERT_EQ(at.kvs.size(), 9u);
    EXPECT_TRUE(fails_with(prefix(file, 24 + 9 * 13 - 1), "metadata count",
                           "metadata count 9 cannot fit in the 116 bytes left", 16));
    EXPECT_TRUE(fails_with(prefix(file, 24 + 9 * 13 + 3 * 24 - 1), "tensor count",
                           "tensor count 3 cannot fit in the 188 bytes left", 8));
    // Later cuts land inside the last metadata entry.
    const KvAt& u8s = at.kv("test.u8s");
    ASSERT_GT(u8s.at, 24u + 9 * 13 + 3 * 24);
    EXPECT_TRUE(fails_with(prefix(file, u8s.at + 5), "key of metadata entry 8 length",
                           "file ends 5 bytes after this point, 8 needed", u8s.at));
    EXPECT_TRUE(fails_with(prefix(file, u8s.type_at + 1), "metadata 'test.u8s' type", "file ends", u8s.type_at));
    EXPECT_TRUE(fails_with(prefix(file, u8s.value_at + 3), "metadata 'test.u8s' array type", "4 needed", u8s.value_at));
    EXPECT_TRUE(fails_with(prefix(file, u8s.count_at), "metadata 'test.u8s' array length", "8 needed", u8s.count_at));
    const KvAt& i64 = at.kv("test.i64");
    EXPECT_TRUE(fails_with(prefix(file, i64.value_at + 7), "metadata 'test.i64' value",
                           "file ends 7 bytes after this point, 8 needed", i64.value_at));
    // Inside a tensor's ne[1] and its offset.
    const TensorAt& embd = at.tensor(kEmbd);
    EXPECT_TRUE(
        fails_with(prefix(file, embd.ne_at + 12), "tensor 'token_embd.weight' ne[1]", "8 needed", embd.ne_at + 8));
    EXPECT_TRUE(fails_with(prefix(file, embd.offset_at + 7), "tensor 'token_embd.weight' offset", "7 bytes after",
                           embd.offset_at));
}

TEST_F(GgufMalformed, FileEndsBeforeTheDataSection) {
    // The infos are complete but the padding before the data section is cut short.
    ASSERT_LT(at.end_of_infos + 1, at.data_offset);
    EXPECT_TRUE(fails_with(prefix(file, at.end_of_infos + 1), "data section",
                           "before the data section at " + std::to_string(at.data_offset), at.end_of_infos));
    // Even a tensor of zero bytes needs the data section to start inside the file.
    const auto empty = Bytes().header(1, 0).tensor("e", {0}, 0, 0).bytes();
    EXPECT_TRUE(fails_with(empty, "data section", "file ends at byte 57, before the data section at 64", 57));
}

TEST_F(GgufMalformed, DataReachingPastTheEnd) {
    file.pop_back();  // the last tensor loses its last byte
    EXPECT_TRUE(fails_with(file, "tensor 'output.weight' data",
                           "bytes [160, 160+288) reach past the end of the data section (447 bytes)",
                           at.tensor(kOutput).at));
}

TEST_F(GgufMalformed, VocabOnlyFileMayEndRightAfterTheMetadata) {
    // A vocab-only file (no tensors) may stop right after its last value, without padding.
    std::vector<std::byte> bytes = base_writer().to_bytes();
    const Layout l = walk(bytes, 32);
    ASSERT_EQ(l.end_of_metadata, bytes.size()) << "the writer adds no padding when there are no tensors";
    const ExactCopy copy(bytes);
    const GgufFile f = GgufFile::parse(copy.span(), "vocab.gguf");
    EXPECT_TRUE(f.tensors().empty());
    ASSERT_EQ(f.metadata().size(), l.kvs.size());
    EXPECT_EQ(f.get<std::string_view>("general.architecture"), "llama");
    ASSERT_EQ(f.at("tokenizer.ggml.tokens").strings().size(), 4u);
    EXPECT_EQ(f.at("tokenizer.ggml.tokens").strings()[3], "hello");
    EXPECT_EQ(f.at("test.u8s").array<uint8_t>(), (std::vector<uint8_t>{1, 2, 3}));
    // One byte less is a cut value, not a vocab-only file.
    bytes.pop_back();
    EXPECT_TRUE(fails_with(bytes, "metadata 'test.u8s' array length",
                           "array of 3 uint8 (1 bytes each) exceeds the 2 bytes left", l.kv("test.u8s").count_at));
}

// ---------------------------------------------------------------------------------------------
// Counts and lengths that cannot fit

TEST_F(GgufMalformed, HugeMetadataCount) {
    for (uint64_t n : {kU64Max, uint64_t{1} << 63, uint64_t{file.size()}}) {
        poke<uint64_t>(file, 16, n);
        EXPECT_TRUE(
            fails_with(file, "metadata count", "metadata count " + std::to_string(n) + " cannot fit in the", 16));
    }
}

TEST_F(GgufMalformed, HugeTensorCount) {
    for (uint64_t n : {kU64Max, uint64_t{1} << 62, uint64_t{file.size() / 24 + 1}}) {
        poke<uint64_t>(file, 8, n);
        EXPECT_TRUE(fails_with(file, "tensor count", "tensor count " + std::to_string(n) + " cannot fit in the", 8));
    }
}

TEST_F(GgufMalformed, HugeKeyLength) {
    const KvAt& first = at.kvs[0];
    for (uint64_t len : {kU64Max, uint64_t{1} << 62, uint64_t{file.size()}}) {
        poke<uint64_t>(file, first.at, len);
        EXPECT_TRUE(fails_with(file, "key of metadata entry 0 length",
                               "string length " + std::to_string(len) + " exceeds the", first.at));
    }
    const KvAt& third = at.kvs[2];
    poke<uint64_t>(file, first.at, first.type_at - first.at - 8);  // first key restored
    poke<uint64_t>(file, third.at, kU64Max);
    EXPECT_TRUE(fails_with(file, "key of metadata entry 2 length", "exceeds", third.at));
}

TEST_F(GgufMalformed, HugeStringValueLength) {
    const KvAt& arch = at.kv("general.architecture");
    poke<uint64_t>(file, arch.value_at, kU64Max - 3);
    EXPECT_TRUE(fails_with(file, "metadata 'general.architecture' length",
                           "string length 18446744073709551612 exceeds the", arch.value_at));
}

TEST_F(GgufMalformed, HugeStringInAnArray) {
    const KvAt& tokens = at.kv("tokenizer.ggml.tokens");
    const uint64_t second = tokens.elems_at + 8 + 5;  // after "<unk>"
    poke<uint64_t>(file, second, uint64_t{1} << 40);
    EXPECT_TRUE(
        fails_with(file, "metadata 'tokenizer.ggml.tokens'[1] length", "string length 1099511627776 exceeds", second));
}

TEST_F(GgufMalformed, HugeTensorNameLength) {
    const TensorAt& q = at.tensor(kAttnQ);
    poke<uint64_t>(file, q.at, kU64Max);
    EXPECT_TRUE(fails_with(file, "name of tensor 1 length", "exceeds", q.at));
}

TEST_F(GgufMalformed, HugeNumericArrayLength) {
    const KvAt& scores = at.kv("tokenizer.ggml.scores");
    for (uint64_t n : {kU64Max, kU64Max / 4 + 1, uint64_t{1} << 62, uint64_t{file.size()}}) {
        // kU64Max / 4 + 1 floats would wrap a 64-bit byte count to a small number.
        poke<uint64_t>(file, scores.count_at, n);
        EXPECT_TRUE(fails_with(file, "metadata 'tokenizer.ggml.scores' array length",
                               "array of " + std::to_string(n) + " float32 (4 bytes each) exceeds the",
                               scores.count_at));
    }
    const KvAt& u8s = at.kv("test.u8s");
    const uint64_t left = file.size() - u8s.elems_at;
    poke<uint64_t>(file, scores.count_at, 4);
    poke<uint64_t>(file, u8s.count_at, left + 1);  // one byte more than the whole rest of the file
    EXPECT_TRUE(fails_with(file, "metadata 'test.u8s' array length",
                           "array of " + std::to_string(left + 1) + " uint8 (1 bytes each) exceeds the " +
                               std::to_string(left) + " bytes left",
                           u8s.count_at));
}

TEST_F(GgufMalformed, HugeStringArrayLength) {
    const KvAt& tokens = at.kv("tokenizer.ggml.tokens");
    for (uint64_t n : {kU64Max, uint64_t{1} << 61, uint64_t{file.size()}}) {
        poke<uint64_t>(file, tokens.count_at, n);
        EXPECT_TRUE(fails_with(file, "metadata 'tokenizer.ggml.tokens' array length",
                               "array of " + std::to_string(n) + " strings cannot fit", tokens.count_at));
    }
}

// ---------------------------------------------------------------------------------------------
// Value types

TEST_F(GgufMalformed, UnknownValueType) {
    const KvAt& blocks = at.kv("llama.block_count");
    for (uint32_t type : {13u, 0xFFFFFFFFu}) {
        poke<uint32_t>(file, blocks.type_at, type);
        EXPECT_TRUE(fails_with(file, "metadata 'llama.block_count' type", "unknown value type " + std::to_string(type),
                               blocks.type_at));
    }
}

TEST_F(GgufMalformed, UnknownArrayElementType) {
    const KvAt& scores = at.kv("tokenizer.ggml.scores");
    poke<uint32_t>(file, scores.value_at, 13);
    EXPECT_TRUE(fails_with(file, "metadata 'tokenizer.ggml.scores' array type", "unknown array element type 13",
                           scores.value_at));
}

TEST_F(GgufMalformed, NestedArray) {
    const KvAt& scores = at.kv("tokenizer.ggml.scores");
    poke<uint32_t>(file, scores.value_at, static_cast<uint32_t>(ValueType::ARRAY));
    EXPECT_TRUE(fails_with(file, "metadata 'tokenizer.ggml.scores' array type", "nested arrays are not supported",
                           scores.value_at));
}

TEST_F(GgufMalformed, BoolValueTwo) {
    const KvAt& flag = at.kv("llama.use_parallel_residual");
    for (uint8_t v : {uint8_t{2}, uint8_t{0xFF}}) {
        poke<uint8_t>(file, flag.value_at, v);
        EXPECT_TRUE(fails_with(file, "metadata 'llama.use_parallel_residual'",
                               "bool value " + std::to_string(v) + " is neither 0 nor 1", flag.value_at));
    }
}

TEST_F(GgufMalformed, BoolArrayElementTwo) {
    const auto bytes = Bytes()
                           .header(0, 1)
                           .str("flags")
                           .type(ValueType::ARRAY)
                           .type(ValueType::BOOL)
                           .u64(4)
                           .u8(1)
                           .u8(0)
                           .u8(2)
                           .u8(1)
                           .bytes();
    EXPECT_TRUE(
        fails_with(bytes, "metadata 'flags'[2]", "bool value 2 is neither 0 nor 1", 24 + 8 + 5 + 4 + 4 + 8 + 2));
}

TEST_F(GgufMalformed, DuplicateKey) {
    Bytes b;
    b.header(0, 3).str("a").type(ValueType::UINT8).u8(1).str("b").type(ValueType::UINT8).u8(2);
    const uint64_t third = b.size();
    b.str("a").type(ValueType::STRING).str("again");
    EXPECT_TRUE(fails_with(b.bytes(), "metadata 'a'", "duplicate key 'a'", third));
}

// ---------------------------------------------------------------------------------------------
// general.alignment

TEST_F(GgufMalformed, AlignmentNotUint32) {
    const KvAt& align = at.kv("general.alignment");
    poke<uint32_t>(file, align.type_at, static_cast<uint32_t>(ValueType::INT32));
    EXPECT_TRUE(fails_with(file, "metadata 'general.alignment'", "must be uint32, found int32", align.at));
    poke<uint32_t>(file, align.type_at, static_cast<uint32_t>(ValueType::FLOAT32));
    EXPECT_TRUE(fails_with(file, "metadata 'general.alignment'", "must be uint32, found float32", align.at));
    // Wider types change the layout: spell them out.
    const auto u64 = Bytes().header(0, 1).str("general.alignment").type(ValueType::UINT64).u64(32).bytes();
    EXPECT_TRUE(fails_with(u64, "metadata 'general.alignment'", "must be uint32, found uint64", 24));
    const auto arr = Bytes()
                         .header(0, 1)
                         .str("general.alignment")
                         .type(ValueType::ARRAY)
                         .type(ValueType::UINT32)
                         .u64(1)
                         .u32(32)
                         .bytes();
    EXPECT_TRUE(fails_with(arr, "metadata 'general.alignment'", "must be uint32, found array[uint32]", 24));
}

TEST_F(GgufMalformed, AlignmentZero) {
    const KvAt& align = at.kv("general.alignment");
    poke<uint32_t>(file, align.value_at, 0);
    EXPECT_TRUE(fails_with(file, "metadata 'general.alignment'", "alignment 0 is not a power of two", align.at));
}

TEST_F(GgufMalformed, AlignmentNotPowerOfTwo) {
    const KvAt& align = at.kv("general.alignment");
    for (uint32_t a : {3u, 48u, 0xFFFFFFFFu, 0x80000001u}) {
        poke<uint32_t>(file, align.value_at, a);
        EXPECT_TRUE(fails_with(file, "metadata 'general.alignment'",
                               "alignment " + std::to_string(a) + " is not a power of two", align.at));
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor shapes and types

TEST_F(GgufMalformed, FiveDimensions) {
    const TensorAt& embd = at.tensor(kEmbd);
    for (uint32_t n : {5u, 0xFFFFFFFFu}) {
        poke<uint32_t>(file, embd.n_dims_at, n);
        EXPECT_TRUE(fails_with(file, "tensor 'token_embd.weight' n_dims",
                               std::to_string(n) + " dimensions, at most 4 supported", embd.n_dims_at));
    }
}

TEST_F(GgufMalformed, DimensionAboveInt64Max) {
    const TensorAt& embd = at.tensor(kEmbd);
    poke<uint64_t>(file, embd.ne_at + 8, kI64Max + 1);
    EXPECT_TRUE(fails_with(file, "tensor 'token_embd.weight' ne[1]", "dimension 9223372036854775808 is out of range",
                           embd.ne_at + 8));
    poke<uint64_t>(file, embd.ne_at + 8, kU64Max);
    EXPECT_TRUE(fails_with(file, "tensor 'token_embd.weight' ne[1]", "dimension 18446744073709551615 is out of range",
                           embd.ne_at + 8));
}

TEST_F(GgufMalformed, ElementCountOverflows) {
    const TensorAt& embd = at.tensor(kEmbd);
    poke<uint64_t>(file, embd.ne_at, uint64_t{1} << 32);
    poke<uint64_t>(file, embd.ne_at + 8, uint64_t{1} << 32);
    EXPECT_TRUE(
        fails_with(file, "tensor 'token_embd.weight' shape", "element count overflows 63 bits", embd.n_dims_at));
    // Each dimension fits int64, the product of all four does not (2^16 * 2^16 * 2^16 * 2^16).
    const auto four = Bytes().header(1, 0).tensor("t", {1 << 16, 1 << 16, 1 << 16, 1 << 16}, 0, 0).bytes();
    EXPECT_TRUE(fails_with(four, "tensor 't' shape", "element count overflows 63 bits", 24 + 9));
    // 2^63 - 1 elements is the largest count allowed; one more row overflows.
    const auto edge = Bytes().header(1, 0).tensor("t", {kI64Max, 2}, 24, 0).bytes();
    EXPECT_TRUE(fails_with(edge, "tensor 't' shape", "element count overflows 63 bits", 24 + 9));
}

TEST_F(GgufMalformed, ByteSizeOverflows) {
    // 2^62 F32 elements fit the element count but take 2^64 bytes.
    const auto f32 = Bytes().header(1, 0).tensor("t", {uint64_t{1} << 62}, 0, 0).bytes();
    EXPECT_TRUE(fails_with(f32, "tensor 't' shape", "byte size overflows 63 bits", 24 + 9));
    // Q8_0: 2^63 - 32 elements are 2^58 - 1 blocks of 34 bytes.
    const auto q8 = Bytes().header(1, 0).tensor("t", {kI64Max & ~uint64_t{31}}, 8, 0).bytes();
    EXPECT_TRUE(fails_with(q8, "tensor 't' shape", "byte size overflows 63 bits", 24 + 9));
}

TEST_F(GgufMalformed, RowLengthNotAMultipleOfTheBlockSize) {
    const TensorAt& out = at.tensor(kOutput);
    poke<uint64_t>(file, out.ne_at, 100);
    EXPECT_TRUE(fails_with(file, "tensor 'output.weight' shape",
                           "row length 100 is not a multiple of the block size 256 of Q4_K", out.n_dims_at));
    // The block size applies to rows (ne[0]), not to the total: 128 x 2 Q4_K is 256 elements.
    poke<uint64_t>(file, out.ne_at, 128);
    EXPECT_TRUE(fails_with(file, "tensor 'output.weight' shape", "row length 128 is not a multiple", out.n_dims_at));
    // Q8_0 with ne[0] = 48.
    const TensorAt& q = at.tensor(kAttnQ);
    poke<uint64_t>(file, out.ne_at, 256);
    poke<uint64_t>(file, q.ne_at, 48);
    EXPECT_TRUE(fails_with(file, "tensor 'blk.0.attn_q.weight' shape", "block size 32 of Q8_0", q.n_dims_at));
}

TEST_F(GgufMalformed, UnknownTensorType) {
    const TensorAt& q = at.tensor(kAttnQ);
    for (uint32_t type : {99u, quant::kGgmlTypeIdEnd, 0xFFFFFFFFu}) {
        poke<uint32_t>(file, q.type_at, type);
        EXPECT_TRUE(fails_with(file, "tensor 'blk.0.attn_q.weight' type",
                               "unknown ggml type id " + std::to_string(type), q.type_at));
    }
}

TEST_F(GgufMalformed, RemovedTensorTypes) {
    const TensorAt& q = at.tensor(kAttnQ);
    const std::pair<uint32_t, std::string> removed[] = {{4, "Q4_2"},        {5, "Q4_3"},       {31, "Q4_0_4_4"},
                                                        {32, "Q4_0_4_8"},   {33, "Q4_0_8_8"},  {36, "IQ4_NL_4_4"},
                                                        {37, "IQ4_NL_4_8"}, {38, "IQ4_NL_8_8"}};
    for (const auto& [id, name] : removed) {
        poke<uint32_t>(file, q.type_at, id);
        EXPECT_TRUE(fails_with(file, "tensor 'blk.0.attn_q.weight' type",
                               "ggml type " + name + " (id " + std::to_string(id) + ") was removed from ggml",
                               q.type_at));
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor placement

TEST_F(GgufMalformed, OffsetNotAligned) {
    const TensorAt& q = at.tensor(kAttnQ);
    for (uint64_t off : {uint64_t{72}, uint64_t{65}, kU64Max}) {
        poke<uint64_t>(file, q.offset_at, off);
        EXPECT_TRUE(fails_with(file, "tensor 'blk.0.attn_q.weight' offset",
                               "offset " + std::to_string(off) + " is not a multiple of the alignment 32",
                               q.offset_at));
    }
}

TEST_F(GgufMalformed, OffsetPastTheEndOfTheDataSection) {
    const TensorAt& out = at.tensor(kOutput);
    for (uint64_t off : {uint64_t{480}, uint64_t{1} << 40, kU64Max & ~uint64_t{31}}) {
        // kU64Max & ~31: offset + size would wrap around to a small number.
        poke<uint64_t>(file, out.offset_at, off);
        EXPECT_TRUE(fails_with(file, "tensor 'output.weight' data",
                               "bytes [" + std::to_string(off) + ", " + std::to_string(off) +
                                   "+288) reach past the end of the data section (448 bytes)",
                               out.at));
    }
    // Starts inside, ends outside.
    poke<uint64_t>(file, out.offset_at, 192);
    EXPECT_TRUE(fails_with(file, "tensor 'output.weight' data", "bytes [192, 192+288) reach past the end", out.at));
}

TEST_F(GgufMalformed, OverlappingTensors) {
    // attn_q covers [64, 132); output moved to 96 starts inside it.
    const TensorAt& out = at.tensor(kOutput);
    poke<uint64_t>(file, out.offset_at, 96);
    EXPECT_TRUE(fails_with(file, "tensor 'output.weight' data",
                           "bytes from offset 96 overlap tensor 'blk.0.attn_q.weight' at [64, 132)", out.at));
    // Sort order, not file order, decides which one is named: the first tensor moved behind
    // the second overlaps it from the other side.
    poke<uint64_t>(file, out.offset_at, 160);
    poke<uint64_t>(file, at.tensor(kEmbd).offset_at, 128);
    EXPECT_TRUE(fails_with(file, "tensor 'token_embd.weight' data",
                           "bytes from offset 128 overlap tensor 'blk.0.attn_q.weight' at [64, 132)",
                           at.tensor(kEmbd).at));
}

TEST_F(GgufMalformed, TensorInsideAnother) {
    // small [32, 64) lies wholly inside big [0, 256), and both start before last [96, 128).
    Bytes b;
    b.header(3, 0);
    b.tensor("last", {8}, 0, 96);
    b.tensor("big", {64}, 0, 0);
    const uint64_t small_at = b.size();
    b.tensor("small", {8}, 0, 32);
    b.pad_to(32).zeros(256);
    EXPECT_TRUE(fails_with(b.bytes(), "tensor 'small' data", "bytes from offset 32 overlap tensor 'big' at [0, 256)",
                           small_at));
    // Same start: whichever sorts second is named, but it is refused either way.
    Bytes same;
    same.header(2, 0).tensor("x", {8}, 0, 0).tensor("y", {16}, 0, 0).pad_to(32).zeros(64);
    EXPECT_THROW(GgufFile::parse(same.bytes(), "same.gguf"), FormatError);
}

TEST_F(GgufMalformed, EmptyTensorsOverlapNothing) {
    // Zero-byte tensors (a zero dimension) may sit anywhere in the data section, even at its
    // end or on top of another tensor; a scalar (n_dims 0) has one element.
    Bytes b;
    b.header(3, 0);
    b.tensor("a", {16}, 0, 0);
    b.tensor("empty", {0, 5}, 12, 32);
    b.tensor("scalar", {}, 0, 64);
    b.pad_to(32).zeros(68);
    const auto bytes = b.bytes();
    const ExactCopy copy(bytes);
    const GgufFile f = GgufFile::parse(copy.span(), "ok.gguf");
    ASSERT_EQ(f.tensors().size(), 3u);
    EXPECT_EQ(f.tensors()[1].n_bytes, 0u);
    EXPECT_EQ(f.tensors()[2].n_elements, 1u);
    EXPECT_EQ(f.tensors()[2].n_bytes, 4u);
}

TEST_F(GgufMalformed, DuplicateTensorNames) {
    Bytes b;
    b.header(2, 0);
    b.tensor("w", {8}, 0, 0);
    const uint64_t second = b.size();
    b.tensor("w", {8}, 0, 32);
    b.pad_to(32).zeros(64);
    EXPECT_TRUE(fails_with(b.bytes(), "tensor 'w'", "duplicate tensor name 'w'", second));
}

// ---------------------------------------------------------------------------------------------
// The fuzzer's seeds (fuzz/corpus/, written by fuzz/make_seed_corpus): the "broken_" ones are
// refused, the rest parse. Inputs the fuzzer found crashing the reader get a case above.

TEST_F(GgufMalformed, FuzzSeedCorpus) {
    const std::filesystem::path dir = test::source_dir() / "fuzz" / "corpus";
    if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " is missing";
    size_t n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        const std::vector<std::byte> bytes = test::read_file(entry.path());
        const ExactCopy copy(bytes);
        ++n;
        if (name.rfind("broken_", 0) == 0) {
            EXPECT_THROW(GgufFile::parse(copy.span(), name), FormatError) << name;
        } else {
            EXPECT_NO_THROW(GgufFile::parse(copy.span(), name)) << name;
        }
    }
    EXPECT_GE(n, 10u);
}

}  // namespace
}  // namespace fitllm::gguf
