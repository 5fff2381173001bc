// Writes the seed corpus of gguf_reader_fuzz: small valid files that reach every part of the
// reader (each value type, arrays, alignments, every supported tensor type, v2 and v3) and a
// few that are almost valid, so mutations start next to each check rather than at the magic.
//
//   make_seed_corpus OUT_DIR
//
// The output is checked in under fuzz/corpus/; rerun this after changing it and keep the
// files small (the whole corpus well under 200 KB).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_writer.h"
#include "quant/ggml_type.h"

namespace {

namespace fs = std::filesystem;
using fitllm::gguf::GgufWriter;
using fitllm::gguf::ValueType;
using fitllm::quant::GgmlType;

// Little-endian bytes by hand, for the files the writer refuses to produce.
class Bytes {
public:
    Bytes& raw(std::string_view s) {
        for (char c : s) out_.push_back(static_cast<std::byte>(c));
        return *this;
    }
    template <class T>
    Bytes& le(T v) {
        unsigned char b[sizeof(T)];
        std::memcpy(b, &v, sizeof(T));  // the generator runs on little-endian hosts only
        for (unsigned char c : b) out_.push_back(static_cast<std::byte>(c));
        return *this;
    }
    Bytes& u32(uint32_t v) { return le(v); }
    Bytes& u64(uint64_t v) { return le(v); }
    Bytes& str(std::string_view s) { return u64(s.size()).raw(s); }
    Bytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
        return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
    }
    Bytes& pad_to(size_t alignment) {
        while (out_.size() % alignment != 0) out_.push_back(std::byte{0});
        return *this;
    }
    Bytes& zeros(size_t n) {
        out_.resize(out_.size() + n);
        return *this;
    }
    const std::vector<std::byte>& bytes() const { return out_; }

private:
    std::vector<std::byte> out_;
};

std::vector<std::byte> pattern(size_t n, unsigned seed) {
    std::vector<std::byte> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 17) & 0xFF);
    return v;
}

void save(const fs::path& dir, const std::string& name, const std::vector<std::byte>& bytes) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write " + (dir / name).string());
}

void add_every_value_type(GgufWriter& w) {
    w.add<uint8_t>("t.u8", 200);
    w.add<int8_t>("t.i8", -5);
    w.add<uint16_t>("t.u16", 60000);
    w.add<int16_t>("t.i16", -300);
    w.add<uint32_t>("t.u32", 4000000000u);
    w.add<int32_t>("t.i32", -70000);
    w.add<float>("t.f32", 1e-6f);
    w.add<bool>("t.bool", true);
    w.add_string("t.string", "hello \"gguf\"\n");
    w.add<uint64_t>("t.u64", 1ull << 40);
    w.add<int64_t>("t.i64", -(1ll << 40));
    w.add<double>("t.f64", 0.125);
    const uint8_t u8s[] = {1, 2, 3};
    const int32_t i32s[] = {-1, 0, 1, 2};
    const float f32s[] = {0.5f, -0.25f};
    const bool bools[] = {true, false, true};
    const uint64_t u64s[] = {0, ~0ull};
    w.add_array<uint8_t>("a.u8", u8s);
    w.add_array<int32_t>("a.i32", i32s);
    w.add_array<float>("a.f32", f32s);
    w.add_array<bool>("a.bool", bools);
    w.add_array<uint64_t>("a.u64", u64s);
    w.add_array<double>("a.empty", {});
    const std::string tokens[] = {"<unk>", "<s>", "</s>", "", "\xe2\x96\x81the"};
    w.add_string_array("tokenizer.ggml.tokens", tokens);
}

GgufWriter tiny_model(uint32_t version, uint32_t alignment) {
    GgufWriter w(version);
    w.add_string("general.architecture", "llama");
    w.add<uint32_t>("general.alignment", alignment);
    w.add<uint32_t>("llama.block_count", 1);
    w.add<float>("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    const std::string tokens[] = {"a", "b", "c"};
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    const int64_t f32_dims[] = {4, 2};
    const int64_t q8_dims[] = {32, 2};
    const int64_t q4k_dims[] = {256};
    w.add_tensor("token_embd.weight", GgmlType::F32, f32_dims, pattern(4 * 2 * 4, 1));
    w.add_tensor("blk.0.attn_q.weight", GgmlType::Q8_0, q8_dims, pattern(2 * 34, 2));
    w.add_tensor("output.weight", GgmlType::Q4_K, q4k_dims, pattern(144, 3));
    return w;
}

// One tensor of one block for every type the reader supports.
std::vector<std::byte> all_types() {
    GgufWriter w;
    w.add<uint32_t>("general.alignment", 8);
    for (uint32_t id = 0; id < fitllm::quant::kGgmlTypeIdEnd; ++id) {
        if (!fitllm::quant::is_supported(id)) continue;
        const auto t = *fitllm::quant::traits_of(id);
        const int64_t dims[] = {t.block_elements};
        w.add_tensor(std::string(t.name), static_cast<GgmlType>(id), dims, pattern(t.block_bytes, id));
    }
    return w.to_bytes();
}

// Tensor info by hand: name, dims, type, offset.
Bytes& tensor_info(Bytes& b, std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    b.str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) b.u64(d);
    return b.u32(type).u64(offset);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    const fs::path dir = argv[1];
    fs::create_directories(dir);

    save(dir, "header_only_v3.gguf", Bytes().header(3, 0, 0).bytes());
    save(dir, "header_only_v2.gguf", Bytes().header(2, 0, 0).bytes());

    GgufWriter vocab;
    add_every_value_type(vocab);
    save(dir, "every_value_type.gguf", vocab.to_bytes());

    const std::vector<std::byte> model = tiny_model(3, 32).to_bytes();
    save(dir, "tiny_model_v3.gguf", model);
    save(dir, "tiny_model_v2_align64.gguf", tiny_model(2, 64).to_bytes());
    save(dir, "tiny_model_align1.gguf", tiny_model(3, 1).to_bytes());
    save(dir, "all_types.gguf", all_types());

    // Valid, but beyond what the writer makes: a scalar tensor (n_dims 0), an empty tensor,
    // and a tensor sharing its offset with the empty one.
    {
        Bytes b;
        b.header(3, 3, 1).str("general.architecture").u32(static_cast<uint32_t>(ValueType::STRING)).str("x");
        tensor_info(b, "scalar", {}, 0, 0);
        tensor_info(b, "empty", {0, 7}, 12, 32);
        tensor_info(b, "row", {8}, 1, 32);
        b.pad_to(32).zeros(48);
        save(dir, "scalar_and_empty.gguf", b.bytes());
    }

    // Almost valid: each one fails a single check late in the file.
    std::vector<std::byte> cut(model.begin(), model.begin() + static_cast<std::ptrdiff_t>(model.size() / 2));
    save(dir, "broken_truncated.gguf", cut);
    {
        Bytes b;
        b.header(3, 2, 0);
        tensor_info(b, "a", {16}, 0, 0);
        tensor_info(b, "b", {16}, 0, 32);  // a covers [0, 64): overlaps b
        b.pad_to(32).zeros(128);
        save(dir, "broken_overlap.gguf", b.bytes());
    }
    {
        Bytes b;
        b.header(3, 1, 1).str("general.alignment").u32(static_cast<uint32_t>(ValueType::UINT32)).u32(48);
        tensor_info(b, "a", {4}, 0, 0);
        b.pad_to(64).zeros(64);
        save(dir, "broken_alignment.gguf", b.bytes());
    }
    {
        Bytes b;
        b.header(3, 0, 1).str("flag").u32(static_cast<uint32_t>(ValueType::ARRAY));
        b.u32(static_cast<uint32_t>(ValueType::BOOL)).u64(3).u32(0x00020100);  // 0, 1, 2: bad third
        save(dir, "broken_bool_array.gguf", b.bytes());
    }
    {
        Bytes b;
        b.raw("GGUF").u32(0x03000000).u64(0).u64(0);  // a big-endian file
        save(dir, "broken_big_endian.gguf", b.bytes());
    }
    return 0;
}
