// fitllm quantize (gguf/gguf_quantize.h): the tensors llama.cpp's quantizer wrote into the committed
// tiny models, from the same F16 files, byte for byte; metadata, alignment and order kept; the
// fallbacks for row lengths; the refusals.
#include "gguf/gguf_quantize.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "quant/dequantize.h"
#include "quant/quantize_ref.h"
#include "test_support.h"

namespace fitllm::gguf {
namespace {

namespace fs = std::filesystem;
using quant::GgmlType;

fs::path model_data(const std::string& name) {
    return test::source_dir() / "tests" / "model" / "data" / name;
}

// The committed tiny-*-<type>.gguf were made by llama.cpp's llama_model_quantize from tiny-*-f16.gguf
// (tools/gen_test_models.py): fitllm quantize makes the same tensors from the same file.
TEST(GgufQuantize, MakesTheTensorsLlamaCppMadeForTheTinyModels) {
    const std::pair<const char*, std::vector<const char*>> models[] = {
        {"llama", {"q8_0", "q4_0", "q2_k", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs"}},
        {"qwen2", {"q8_0", "q4_0", "q2_k", "q4_k_m", "q5_k_m", "q6_k"}},
        {"qwen3", {"q8_0", "q4_0", "q2_k", "q4_k_m", "q5_k_m", "q6_k"}},
        {"gemma2", {"q8_0", "q4_k_m"}},
        {"phi3", {"q8_0", "q4_k_m"}},
        {"gpt-oss", {"q8_0", "mxfp4_moe"}},  // MXFP4 experts, Q8_0 elsewhere; biases and sinks stay F32
    };
    test::TempDir dir;
    for (const auto& [arch, types] : models) {
        const fs::path f16 = model_data(std::string("tiny-") + arch + "-f16.gguf");
        for (const char* type : types) {
            SCOPED_TRACE(std::string(arch) + " " + type);
            const fs::path ours_path = dir / (std::string(arch) + "-" + type + ".gguf");
            QuantizeParams params;
            params.ftype = *parse_file_type(type);
            params.threads = 2;
            quantize_file(f16.string(), ours_path.string(), params);
            const GgufFile ours = GgufFile::open(ours_path.string());
            const GgufFile theirs =
                GgufFile::open(model_data(std::string("tiny-") + arch + "-" + type + ".gguf").string());
            ASSERT_EQ(ours.tensors().size(), theirs.tensors().size());
            for (const TensorInfo& t : theirs.tensors()) {
                const TensorInfo* o = ours.find_tensor(t.name);
                ASSERT_NE(o, nullptr) << t.name;
                EXPECT_EQ(o->type, t.type) << t.name;
                EXPECT_EQ(o->ne, t.ne) << t.name;
                ASSERT_EQ(o->n_bytes, t.n_bytes) << t.name;
                EXPECT_EQ(std::memcmp(o->data.data(), t.data.data(), t.n_bytes), 0) << t.name << " bytes differ";
            }
            EXPECT_EQ(ours.get<uint32_t>("general.file_type"), params.ftype);
        }
    }
}

// A hand-made F32 model: 1-D tensors, norms, row lengths of 256, 64 and 48, alignment 64.
std::vector<std::byte> small_model(GgmlType matrix_type = GgmlType::F32) {
    GgufWriter w;
    w.add<uint32_t>("general.alignment", 64);
    w.add_string("general.architecture", "llama");
    w.add<uint32_t>("general.file_type", 0);
    w.add_string("custom.note", "kept as is");
    w.add<uint32_t>("llama.block_count", 1);
    w.add<uint32_t>("llama.attention.head_count", 4);
    w.add<uint32_t>("llama.attention.head_count_kv", 4);
    const std::vector<float> floats = [] {
        std::vector<float> v(256 * 16);
        for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i)) * 0.1f;
        return v;
    }();
    auto f32 = [&](std::string_view name, std::vector<int64_t> dims) {
        int64_t n = 1;
        for (int64_t d : dims) n *= d;
        std::vector<std::byte> bytes(static_cast<size_t>(n) * 4);
        std::memcpy(bytes.data(), floats.data(), bytes.size());
        w.add_tensor(name, GgmlType::F32, dims, std::move(bytes));
    };
    f32("token_embd.weight", {256, 16});
    f32("blk.0.attn_norm.weight", {256});
    if (matrix_type == GgmlType::F32) {
        f32("blk.0.attn_q.weight", {256, 8});
    } else {
        std::vector<std::byte> bytes(*quant::row_bytes(matrix_type, 256) * 8);
        for (int r = 0; r < 8; ++r)
            quant::quantize_model_row(matrix_type, floats.data() + 256 * r, bytes.data() + r * (bytes.size() / 8), 256);
        w.add_tensor("blk.0.attn_q.weight", matrix_type, std::vector<int64_t>{256, 8}, std::move(bytes));
    }
    f32("blk.0.ffn_up.weight", {64, 8});
    f32("blk.0.ffn_gate.weight", {48, 8});
    f32("blk.0.ffn_gate_inp.weight", {256, 4});
    f32("output.weight", {256, 16});
    return w.to_bytes();
}

TEST(GgufQuantize, KeepsMetadataAlignmentOrderAndFallsBackOnRowLength) {
    test::TempDir dir;
    const fs::path in = dir / "in.gguf", out = dir / "out.gguf";
    test::write_file(in, small_model());
    QuantizeParams params;
    params.ftype = *parse_file_type("Q4_K_S");
    const QuantizeResult r = quantize_file(in.string(), out.string(), params);
    EXPECT_EQ(r.n_fallback, 2);
    EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
    const GgufFile a = GgufFile::open(in.string()), b = GgufFile::open(out.string());
    EXPECT_EQ(b.alignment(), 64u);
    ASSERT_EQ(b.metadata().size(), a.metadata().size() + 1);  // + general.quantization_version
    for (size_t i = 0; i < a.metadata().size(); ++i) {
        EXPECT_EQ(b.metadata()[i].key(), a.metadata()[i].key());
        if (a.metadata()[i].key() != "general.file_type") {
            EXPECT_EQ(b.metadata()[i].to_display(), a.metadata()[i].to_display());
        }
    }
    EXPECT_EQ(b.get<uint32_t>("general.file_type"), 14u);
    EXPECT_EQ(b.get<uint32_t>("general.quantization_version"), 2u);
    const std::map<std::string, GgmlType> want = {
        {"token_embd.weight", GgmlType::Q4_K},  // untied: the file type's type
        {"blk.0.attn_norm.weight", GgmlType::F32},
        {"blk.0.attn_q.weight", GgmlType::Q4_K},
        {"blk.0.ffn_up.weight", GgmlType::Q5_0},       // 64: Q4_K falls back to Q5_0
        {"blk.0.ffn_gate.weight", GgmlType::F16},      // 48: not even 32 fits
        {"blk.0.ffn_gate_inp.weight", GgmlType::F32},  // MoE router: kept
        {"output.weight", GgmlType::Q6_K},
    };
    ASSERT_EQ(b.tensors().size(), a.tensors().size());
    for (size_t i = 0; i < a.tensors().size(); ++i) {
        const TensorInfo& t = b.tensors()[i];
        EXPECT_EQ(t.name, a.tensors()[i].name);
        EXPECT_EQ(t.offset % 64, 0u);
        EXPECT_EQ(t.type, want.at(std::string(t.name))) << t.name;
        // Each tensor holds its source rows quantized (or copied).
        std::vector<std::byte> expect(t.n_bytes);
        const int64_t n = t.ne[0], rows = static_cast<int64_t>(t.n_elements) / n;
        const auto* src = reinterpret_cast<const float*>(a.tensors()[i].data.data());
        for (int64_t row = 0; row < rows; ++row)
            quant::quantize_model_row(t.type, src + row * n, expect.data() + row * (t.n_bytes / rows), n);
        EXPECT_EQ(std::memcmp(expect.data(), t.data.data(), t.n_bytes), 0) << t.name;
    }
}

TEST(GgufQuantize, EveryIQuantFallsBackToIq4NlThenF16OnRowLength) {
    test::TempDir dir;
    const fs::path in = dir / "in.gguf";
    test::write_file(in, small_model());
    const GgufFile f = GgufFile::open(in.string());
    for (GgmlType type : {GgmlType::IQ4_XS, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
                          GgmlType::IQ2_S, GgmlType::IQ1_S, GgmlType::IQ1_M}) {
        QuantizeParams params;
        params.ftype = *parse_file_type("q8_0");
        params.tensor_types = {{"ffn_up", type}, {"ffn_gate", type}};
        const std::vector<TensorChoice> c = plan_quantization(f, params);
        EXPECT_EQ(c[3].to, GgmlType::IQ4_NL) << quant::traits(type).name;  // ffn_up, 64 columns
        EXPECT_EQ(c[4].to, GgmlType::F16) << quant::traits(type).name;     // ffn_gate, 48: not even 32 fits
    }
}

TEST(GgufQuantize, OptionsChooseTypes) {
    test::TempDir dir;
    const fs::path in = dir / "in.gguf";
    test::write_file(in, small_model());
    const GgufFile f = GgufFile::open(in.string());
    QuantizeParams params;
    params.ftype = *parse_file_type("q8_0");
    params.output_tensor_type = GgmlType::F16;
    params.token_embedding_type = GgmlType::Q4_0;
    params.tensor_types = {{"attn_q", GgmlType::Q5_1}};
    const std::vector<TensorChoice> c = plan_quantization(f, params);
    EXPECT_EQ(c[0].to, GgmlType::Q4_0);  // token_embd
    EXPECT_EQ(c[2].to, GgmlType::Q5_1);  // attn_q
    EXPECT_EQ(c[3].to, GgmlType::Q8_0);  // ffn_up, 64 columns
    EXPECT_EQ(c[6].to, GgmlType::F16);   // output
    params = {};
    params.ftype = *parse_file_type("Q4_K_M");
    params.pure = true;
    EXPECT_EQ(plan_quantization(f, params)[6].to, GgmlType::Q4_K);  // no Q6_K output
    params.leave_output_tensor = true;
    EXPECT_EQ(plan_quantization(f, params)[6].to, GgmlType::F32);
    params = {};
    params.ftype = *parse_file_type("F16");
    const std::vector<TensorChoice> h = plan_quantization(f, params);
    EXPECT_EQ(h[1].to, GgmlType::F32);  // a norm
    EXPECT_EQ(h[4].to, GgmlType::F16);  // any row length
}

TEST(GgufQuantize, ParsesFileTypesAsLlamaQuantize) {
    EXPECT_EQ(parse_file_type("Q4_K_M"), 15u);
    EXPECT_EQ(parse_file_type("q4_k"), 15u);
    EXPECT_EQ(parse_file_type("Q5_K"), 17u);
    EXPECT_EQ(parse_file_type("Q3_K"), 12u);
    EXPECT_EQ(parse_file_type("7"), 7u);
    EXPECT_EQ(parse_file_type("bf16"), 32u);
    EXPECT_FALSE(parse_file_type("Q9_0"));
    EXPECT_FALSE(parse_file_type("123456"));
}

TEST(GgufQuantize, RefusesWhatItCannotDo) {
    test::TempDir dir;
    const fs::path in = dir / "in.gguf", out = dir / "out.gguf";
    test::write_file(in, small_model(GgmlType::Q8_0));
    const std::vector<std::byte> before = test::read_file(in);
    QuantizeParams params;
    params.ftype = *parse_file_type("Q4_0");
    std::string e = test::thrown_message([&] { quantize_file(in.string(), out.string(), params); });
    EXPECT_NE(e.find("blk.0.attn_q.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("--allow-requantize"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(out));

    e = test::thrown_message([&] { quantize_file(in.string(), in.string(), params); });
    EXPECT_NE(e.find("is the input file"), std::string::npos) << e;
    EXPECT_EQ(test::read_file(in), before);

    params.ftype = *parse_file_type("IQ2_XXS");
    e = test::thrown_message([&] { quantize_file(in.string(), out.string(), params); });
    EXPECT_NE(e.find("importance matrix"), std::string::npos) << e;

    params.ftype = *parse_file_type("Q8_0");
    params.allow_requantize = true;
    params.tensor_types = {{"attn_q", GgmlType::IQ1_S}};
    e = test::thrown_message([&] { quantize_file(in.string(), out.string(), params); });
    EXPECT_NE(e.find("needs an importance matrix"), std::string::npos) << e;
    params.tensor_types = {{"attn_q", GgmlType::Q8_K}};
    e = test::thrown_message([&] { quantize_file(in.string(), out.string(), params); });
    EXPECT_NE(e.find("cannot write Q8_K"), std::string::npos) << e;
    params.tensor_types = {{"(", GgmlType::Q8_0}};
    e = test::thrown_message([&] { quantize_file(in.string(), out.string(), params); });
    EXPECT_NE(e.find("bad pattern"), std::string::npos) << e;

    // A truncated file: the reader's error, and no output.
    std::vector<std::byte> cut(before.begin(), before.begin() + static_cast<std::ptrdiff_t>(before.size() - 100));
    test::write_file(dir / "cut.gguf", cut);
    params.tensor_types.clear();
    e = test::thrown_message([&] { quantize_file((dir / "cut.gguf").string(), out.string(), params); });
    EXPECT_NE(e.find("cut.gguf"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
}

TEST(GgufQuantize, RequantizesWhenAllowed) {
    test::TempDir dir;
    const fs::path in = dir / "in.gguf", out = dir / "out.gguf";
    test::write_file(in, small_model(GgmlType::Q8_0));
    QuantizeParams params;
    params.ftype = *parse_file_type("Q4_0");
    params.allow_requantize = true;
    params.threads = 3;
    quantize_file(in.string(), out.string(), params);
    const GgufFile a = GgufFile::open(in.string()), b = GgufFile::open(out.string());
    const TensorInfo* q = b.find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, GgmlType::Q4_0);
    std::vector<float> x(256), y(256), expect(256);
    for (int row = 0; row < 8; ++row) {
        quant::dequantize_row(GgmlType::Q8_0, a.find_tensor("blk.0.attn_q.weight")->data.data() + row * 272, x.data(),
                              256);
        std::vector<std::byte> bytes(144);
        quant::quantize_model_row(GgmlType::Q4_0, x.data(), bytes.data(), 256);
        EXPECT_EQ(std::memcmp(bytes.data(), q->data.data() + row * 144, 144), 0) << "row " << row;
    }
}

}  // namespace
}  // namespace fitllm::gguf
