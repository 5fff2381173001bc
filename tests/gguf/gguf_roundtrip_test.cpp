// Writer -> reader -> writer: every value type, every tensor type, byte-exact.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "test_support.h"

namespace fitllm::gguf {
namespace {

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::byte> out(n);
    for (auto& b : out) b = static_cast<std::byte>(rng() & 0xFF);
    return out;
}

// Reads bytes and writes them back through add_value/add_tensor in file order.
std::vector<std::byte> rewrite(const GgufFile& f) {
    GgufWriter w(f.version());
    for (const Value& v : f.metadata()) w.add_value(v);
    for (const TensorInfo& t : f.tensors()) {
        w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne.data(), t.n_dims), t.data);
    }
    return w.to_bytes();
}

GgufWriter every_value_type() {
    GgufWriter w;
    w.add<uint8_t>("u8", 200);
    w.add<int8_t>("i8", -100);
    w.add<uint16_t>("u16", 60000);
    w.add<int16_t>("i16", -30000);
    w.add<uint32_t>("u32", 4000000000u);
    w.add<int32_t>("i32", -2000000000);
    w.add<float>("f32", 0.15625f);
    w.add<bool>("bool_true", true);
    w.add<bool>("bool_false", false);
    w.add_string("string", "hello, GGUF \xE2\x9C\x93");
    w.add_string("empty_string", "");
    w.add<uint64_t>("u64", std::numeric_limits<uint64_t>::max());
    w.add<int64_t>("i64", std::numeric_limits<int64_t>::min());
    w.add<double>("f64", 1e-300);
    const std::vector<uint8_t> a_u8{1, 2, 255};
    const std::vector<int8_t> a_i8{-1, 0, 127};
    const std::vector<uint16_t> a_u16{1, 65535};
    const std::vector<int16_t> a_i16{-32768, 7};
    const std::vector<uint32_t> a_u32{7, 8, 9, 10};
    const std::vector<int32_t> a_i32{-5, 5};
    const std::vector<float> a_f32{-0.0f, 1.5f, std::numeric_limits<float>::infinity()};
    const bool a_bool[] = {true, false, true};
    const std::vector<uint64_t> a_u64{1ull << 63};
    const std::vector<int64_t> a_i64{-1, 1};
    const std::vector<double> a_f64{3.25, -2.5};
    const std::vector<std::string> a_str{"<s>", "", "\xC3\xA9t\xC3\xA9", "a b"};
    w.add_array<uint8_t>("arr.u8", a_u8);
    w.add_array<int8_t>("arr.i8", a_i8);
    w.add_array<uint16_t>("arr.u16", a_u16);
    w.add_array<int16_t>("arr.i16", a_i16);
    w.add_array<uint32_t>("arr.u32", a_u32);
    w.add_array<int32_t>("arr.i32", a_i32);
    w.add_array<float>("arr.f32", a_f32);
    w.add_array<bool>("arr.bool", a_bool);
    w.add_array<uint64_t>("arr.u64", a_u64);
    w.add_array<int64_t>("arr.i64", a_i64);
    w.add_array<double>("arr.f64", a_f64);
    w.add_string_array("arr.string", a_str);
    w.add_array<uint32_t>("arr.empty", std::span<const uint32_t>());
    return w;
}

TEST(GgufRoundTrip, EveryValueTypeReadsBackAndRewritesByteExact) {
    const std::vector<std::byte> bytes = every_value_type().to_bytes();
    const GgufFile f = GgufFile::parse(bytes, "values.gguf");
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.metadata().size(), 27u);
    EXPECT_EQ(f.get<uint8_t>("u8"), 200);
    EXPECT_EQ(f.get<int8_t>("i8"), -100);
    EXPECT_EQ(f.get<uint16_t>("u16"), 60000);
    EXPECT_EQ(f.get<int16_t>("i16"), -30000);
    EXPECT_EQ(f.get<uint32_t>("u32"), 4000000000u);
    EXPECT_EQ(f.get<int32_t>("i32"), -2000000000);
    EXPECT_EQ(f.get<float>("f32"), 0.15625f);
    EXPECT_TRUE(f.get<bool>("bool_true"));
    EXPECT_FALSE(f.get<bool>("bool_false"));
    EXPECT_EQ(f.get<std::string_view>("string"), "hello, GGUF \xE2\x9C\x93");
    EXPECT_EQ(f.get<std::string_view>("empty_string"), "");
    EXPECT_EQ(f.get<uint64_t>("u64"), std::numeric_limits<uint64_t>::max());
    EXPECT_EQ(f.get<int64_t>("i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(f.get<double>("f64"), 1e-300);
    EXPECT_EQ(f.at("arr.u8").array<uint8_t>(), (std::vector<uint8_t>{1, 2, 255}));
    EXPECT_EQ(f.at("arr.i8").array<int8_t>(), (std::vector<int8_t>{-1, 0, 127}));
    EXPECT_EQ(f.at("arr.u16").array<uint16_t>(), (std::vector<uint16_t>{1, 65535}));
    EXPECT_EQ(f.at("arr.i16").array<int16_t>(), (std::vector<int16_t>{-32768, 7}));
    EXPECT_EQ(f.at("arr.u32").array<uint32_t>(), (std::vector<uint32_t>{7, 8, 9, 10}));
    EXPECT_EQ(f.at("arr.i32").array<int32_t>(), (std::vector<int32_t>{-5, 5}));
    EXPECT_EQ(f.at("arr.f32").array_at<float>(1), 1.5f);
    EXPECT_TRUE(std::isinf(f.at("arr.f32").array_at<float>(2)));
    EXPECT_EQ(f.at("arr.bool").array<bool>(), (std::vector<bool>{true, false, true}));
    EXPECT_EQ(f.at("arr.u64").array<uint64_t>(), (std::vector<uint64_t>{1ull << 63}));
    EXPECT_EQ(f.at("arr.i64").array<int64_t>(), (std::vector<int64_t>{-1, 1}));
    EXPECT_EQ(f.at("arr.f64").array<double>(), (std::vector<double>{3.25, -2.5}));
    const auto strings = f.at("arr.string").strings();
    ASSERT_EQ(strings.size(), 4u);
    EXPECT_EQ(strings[0], "<s>");
    EXPECT_EQ(strings[1], "");
    EXPECT_EQ(strings[2], "\xC3\xA9t\xC3\xA9");
    EXPECT_EQ(f.at("arr.empty").array_size(), 0u);
    EXPECT_EQ(f.at("arr.empty").array_type(), ValueType::UINT32);
    EXPECT_EQ(rewrite(f), bytes);
}

TEST(GgufRoundTrip, GettersNameKeyExpectedAndFoundType) {
    const std::vector<std::byte> bytes = every_value_type().to_bytes();
    const GgufFile f = GgufFile::parse(bytes, "values.gguf");
    try {
        (void)f.get<uint32_t>("string");
        FAIL() << "expected KeyError";
    } catch (const KeyError& e) {
        EXPECT_STREQ(e.what(), "values.gguf: key 'string': expected uint32, found string");
    }
    try {
        (void)f.at("arr.string").array<float>();
        FAIL() << "expected KeyError";
    } catch (const KeyError& e) {
        EXPECT_STREQ(e.what(), "key 'arr.string': expected array[float32], found array[string]");
    }
    try {
        (void)f.get<float>("missing.key");
        FAIL() << "expected KeyError";
    } catch (const KeyError& e) {
        EXPECT_STREQ(e.what(), "values.gguf: missing key 'missing.key'");
    }
    EXPECT_EQ(f.get_int("u16"), 60000);
    EXPECT_EQ(f.get_int("i8"), -100);
    EXPECT_THROW((void)f.get_int("u64"), KeyError);  // 2^64-1 does not fit int64
    EXPECT_DOUBLE_EQ(f.get_double("f32"), 0.15625);
    EXPECT_EQ(f.get_optional<uint32_t>("absent"), std::nullopt);
    EXPECT_EQ(f.get_optional<uint32_t>("u32"), 4000000000u);
}

TEST(GgufRoundTrip, EveryTensorTypeByteExactWithViewsIntoTheFile) {
    GgufWriter w;
    w.add_string("general.architecture", "test");
    std::vector<quant::GgmlType> types;
    for (uint32_t id = 0; id < quant::kGgmlTypeIdEnd; ++id) {
        if (!quant::is_supported(id)) continue;
        const auto type = static_cast<quant::GgmlType>(id);
        const auto& tt = quant::traits(type);
        const int64_t dims[] = {static_cast<int64_t>(tt.block_elements) * 2, 3};
        w.add_tensor("t." + std::string(tt.name), type, dims, random_bytes(2 * 3 * tt.block_bytes, id));
        types.push_back(type);
    }
    const std::vector<std::byte> bytes = w.to_bytes();
    const GgufFile f = GgufFile::parse(bytes, "tensors.gguf");
    ASSERT_EQ(f.tensors().size(), types.size());
    for (size_t i = 0; i < types.size(); ++i) {
        const TensorInfo& t = f.tensors()[i];
        const auto& tt = quant::traits(types[i]);
        SCOPED_TRACE(tt.name);
        EXPECT_EQ(t.type, types[i]);
        EXPECT_EQ(t.n_dims, 2u);
        EXPECT_EQ(t.n_elements, 2u * tt.block_elements * 3);
        EXPECT_EQ(t.n_bytes, 2u * 3 * tt.block_bytes);
        EXPECT_EQ(t.offset % f.alignment(), 0u);
        EXPECT_EQ(t.data.data(), bytes.data() + f.data_offset() + t.offset);  // a view, not a copy
        EXPECT_TRUE(
            std::equal(t.data.begin(), t.data.end(), random_bytes(t.n_bytes, static_cast<uint32_t>(t.type)).begin()));
        EXPECT_EQ(f.find_tensor(t.name), &t);
    }
    EXPECT_EQ(rewrite(f), bytes);
}

TEST(GgufRoundTrip, CustomAlignmentAndVersion2) {
    for (uint32_t alignment : {1u, 8u, 64u, 4096u}) {
        GgufWriter w(2);
        w.add<uint32_t>("general.alignment", alignment);
        const int64_t dims[] = {5};
        w.add_tensor("a", quant::GgmlType::F32, dims, random_bytes(20, 1));
        w.add_tensor("b", quant::GgmlType::F16, dims, random_bytes(10, 2));
        const std::vector<std::byte> bytes = w.to_bytes();
        const GgufFile f = GgufFile::parse(bytes, "aligned.gguf");
        EXPECT_EQ(f.version(), 2u);
        EXPECT_EQ(f.alignment(), alignment);
        EXPECT_EQ(f.data_offset() % alignment, 0u);
        EXPECT_EQ(f.tensors()[1].offset, (20 + alignment - 1) / alignment * alignment);
        EXPECT_EQ(rewrite(f), bytes);
    }
}

TEST(GgufRoundTrip, WriteFileIsAtomicAndOpenMapsIt) {
    test::TempDir dir;
    GgufWriter w = every_value_type();
    const int64_t dims[] = {32, 2};
    w.add_tensor("q", quant::GgmlType::Q8_0, dims, random_bytes(68, 3));
    w.write_file((dir / "m.gguf").string());
    EXPECT_FALSE(std::filesystem::exists(dir / "m.gguf.tmp"));
    for (bool use_mmap : {true, false}) {
        io::MapOptions o;
        o.use_mmap = use_mmap;
        const GgufFile f = GgufFile::open((dir / "m.gguf").string(), o);
        ASSERT_NE(f.mapping(), nullptr);
        EXPECT_EQ(f.mapping()->is_file_mapping(), use_mmap);
        EXPECT_EQ(rewrite(f), w.to_bytes());
    }
}

TEST(GgufRoundTrip, WriterRefusesBadInput) {
    GgufWriter w;
    w.add<uint32_t>("k", 1);
    EXPECT_THROW(w.add<uint32_t>("k", 2), Error);
    EXPECT_THROW(w.add<uint64_t>("general.alignment", 32), Error);
    EXPECT_THROW(w.add<uint32_t>("general.alignment", 48), Error);
    const int64_t dims[] = {100};
    EXPECT_THROW(w.add_tensor("t", quant::GgmlType::Q4_K, dims, random_bytes(144, 1)), Error);  // 100 % 256
    const int64_t ok[] = {256};
    EXPECT_THROW(w.add_tensor("t", quant::GgmlType::Q4_K, ok, random_bytes(143, 1)), Error);  // wrong size
    w.add_tensor("t", quant::GgmlType::Q4_K, ok, random_bytes(144, 1));
    EXPECT_THROW(w.add_tensor("t", quant::GgmlType::Q4_K, ok, random_bytes(144, 1)), Error);  // duplicate
    EXPECT_THROW(GgufWriter(1), Error);
}

}  // namespace
}  // namespace fitllm::gguf
