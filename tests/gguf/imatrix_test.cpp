// Importance matrices (gguf/imatrix.h) and fitllm quantize with one: llama-imatrix's GGUF and
// legacy formats read into llama-quantize's per-column weights; the bad files refused naming the
// file and the entry; each converted tensor's rows weighted by its entry (its expert's slice for
// MoE tensors); the mixes and metadata that change with an imatrix; Q2_K_S.
#include "gguf/imatrix.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf_quantize.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "quant/dequantize.h"
#include "quant/quant_test_data.h"
#include "quant/quantize_ref.h"
#include "test_support.h"

namespace fitllm::gguf {
namespace {

namespace fs = std::filesystem;
using quant::GgmlType;

fs::path model_data(const std::string& name) {
    return test::source_dir() / "tests" / "model" / "data" / name;
}

std::vector<std::byte> f32_bytes(const std::vector<float>& v) {
    std::vector<std::byte> b(v.size() * sizeof(float));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

struct Entry {
    std::string name;
    int64_t ne0;
    std::vector<float> sums;    // ne0 * counts.size()
    std::vector<float> counts;  // one per expert
};

// An imatrix GGUF as llama-imatrix writes it: metadata, then "<name>.in_sum2" {ne0, n_expert} and
// "<name>.counts" {1, n_expert} per entry.
void write_imatrix(const fs::path& path, const std::vector<Entry>& entries, bool metadata = true,
                   GgmlType counts_type = GgmlType::F32, bool drop_counts = false) {
    GgufWriter w;
    w.add_string("general.type", "imatrix");
    if (metadata) {
        const std::vector<std::string> datasets = {"wiki.train.raw"};
        w.add_string_array("imatrix.datasets", std::span<const std::string>(datasets));
        w.add<uint32_t>("imatrix.chunk_count", 10);
        w.add<uint32_t>("imatrix.chunk_size", 512);
    }
    for (const Entry& e : entries) {
        const int64_t n_expert = static_cast<int64_t>(e.counts.size());
        const int64_t rows = static_cast<int64_t>(e.sums.size()) / e.ne0;  // n_expert, unless testing a mismatch
        w.add_tensor(e.name + ".in_sum2", GgmlType::F32, std::vector<int64_t>{e.ne0, rows}, f32_bytes(e.sums));
        if (drop_counts) continue;
        if (counts_type == GgmlType::F32) {
            w.add_tensor(e.name + ".counts", GgmlType::F32, std::vector<int64_t>{1, n_expert}, f32_bytes(e.counts));
        } else {
            w.add_tensor(e.name + ".counts", GgmlType::F16, std::vector<int64_t>{1, n_expert},
                         std::vector<std::byte>(static_cast<size_t>(2 * n_expert)));
        }
    }
    w.write_file(path.string());
}

// The legacy .dat format: entries, then optionally the chunk count and the dataset.
std::vector<std::byte> legacy_bytes(
    const std::vector<std::pair<std::string, std::pair<int32_t, std::vector<float>>>>& e, bool trailer) {
    std::vector<std::byte> out;
    auto put = [&](const void* p, size_t n) {
        const auto* b = static_cast<const std::byte*>(p);
        out.insert(out.end(), b, b + n);
    };
    auto i32 = [&](int32_t v) { put(&v, 4); };
    i32(static_cast<int32_t>(e.size()));
    for (const auto& [name, value] : e) {
        i32(static_cast<int32_t>(name.size()));
        put(name.data(), name.size());
        i32(value.first);
        i32(static_cast<int32_t>(value.second.size()));
        put(value.second.data(), value.second.size() * 4);
    }
    if (trailer) {
        i32(7);
        const std::string dataset = "calibration.txt";
        i32(static_cast<int32_t>(dataset.size()));
        put(dataset.data(), dataset.size());
    }
    return out;
}

TEST(Imatrix, ReadsGgufAsLlamaQuantizeNormalizesIt) {
    test::TempDir dir;
    const fs::path path = dir / "imatrix.gguf";
    write_imatrix(path, {{"blk.0.attn_q.weight", 4, {4, 8, 12, 16}, {4}},
                         {"blk.0.ffn_up_exps.weight", 2, {3, 6, 5, 7, 1, 1}, {3, 0, 2.4f}}});
    const ImportanceMatrix m = load_imatrix(path.string());
    EXPECT_FALSE(m.legacy);
    EXPECT_EQ(m.chunk_count, 10);
    ASSERT_EQ(m.datasets.size(), 1u);
    EXPECT_EQ(m.datasets[0], "wiki.train.raw");
    ASSERT_EQ(m.weights.size(), 2u);
    EXPECT_EQ(m.weights.at("blk.0.attn_q.weight"), (std::vector<float>{1, 2, 3, 4}));
    // Per expert: sums / count; a count of 0 gives weights of 1; counts are rounded (2.4 -> 2).
    EXPECT_EQ(m.weights.at("blk.0.ffn_up_exps.weight"), (std::vector<float>{1, 2, 1, 1, 0.5f, 0.5f}));
}

TEST(Imatrix, ReadsTheLegacyFormat) {
    test::TempDir dir;
    const fs::path path = dir / "imatrix.dat";
    test::write_file(path, legacy_bytes({{"blk.0.attn_k.weight", {2, {4, 6}}}, {"output.weight", {0, {3, 5}}}}, true));
    const ImportanceMatrix m = load_imatrix(path.string());
    EXPECT_TRUE(m.legacy);
    EXPECT_EQ(m.chunk_count, 7);
    ASSERT_EQ(m.datasets.size(), 1u);
    EXPECT_EQ(m.datasets[0], "calibration.txt");
    EXPECT_EQ(m.weights.at("blk.0.attn_k.weight"), (std::vector<float>{2, 3}));  // / ncall
    EXPECT_EQ(m.weights.at("output.weight"), (std::vector<float>{3, 5}));        // ncall 0: as stored
    test::write_file(path, legacy_bytes({{"a.weight", {1, {1}}}}, false));
    EXPECT_EQ(load_imatrix(path.string()).chunk_count, 0);
}

TEST(Imatrix, RefusesBadFilesNamingFileAndEntry) {
    test::TempDir dir;
    const fs::path path = dir / "bad.gguf";
    auto expect_error = [&](const std::vector<std::string>& says) {
        const std::string e = test::thrown_message([&] { load_imatrix(path.string()); });
        EXPECT_NE(e.find(path.string()), std::string::npos) << e;
        for (const std::string& s : says) EXPECT_NE(e.find(s), std::string::npos) << e;
    };
    const Entry q{"blk.0.attn_q.weight", 4, {4, 8, 12, 16}, {4}};
    write_imatrix(path, {q}, true, GgmlType::F32, /*drop_counts=*/true);
    expect_error({"blk.0.attn_q.weight.counts", "missing"});
    write_imatrix(path, {q}, true, GgmlType::F16);
    expect_error({"blk.0.attn_q.weight.counts", "F16", "not F32"});
    write_imatrix(path, {q}, /*metadata=*/false);
    expect_error({"imatrix.chunk_count"});
    write_imatrix(path, {{"blk.0.attn_q.weight", 3, {1, 2, 3}, {1, 1}}});
    expect_error({"blk.0.attn_q.weight", "3 sums for 2 counts"});
    write_imatrix(path, {{"blk.0.attn_q.weight", 2, {1, std::nanf("")}, {1}}});
    expect_error({"blk.0.attn_q.weight", "not finite"});
    // Truncated GGUF: the reader's error, naming the file.
    write_imatrix(path, {q});
    std::vector<std::byte> bytes = test::read_file(path);
    bytes.resize(bytes.size() - 40);  // into the last tensor's data, past its padding
    test::write_file(path, bytes);
    expect_error({});
    // Truncated legacy file: the entry and the field.
    bytes = legacy_bytes({{"blk.0.attn_k.weight", {2, {4, 6, 8}}}}, false);
    bytes.resize(bytes.size() - 3);
    test::write_file(path, bytes);
    expect_error({"truncated", "blk.0.attn_k.weight", "values"});
    test::write_file(path, std::vector<std::byte>(2));
    expect_error({"truncated"});
    EXPECT_NE(test::thrown_message([&] { load_imatrix((dir / "none.dat").string()); }).find("cannot open"),
              std::string::npos);
}

TEST(Imatrix, IncludeAndExcludeWeights) {
    ImportanceMatrix m;
    for (const char* n : {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_up.weight", "output.weight"})
        m.weights[n] = {1.0f};
    ImportanceMatrix a = m;
    filter_imatrix(a, {"attn_"}, {});
    EXPECT_EQ(a.weights.size(), 2u);
    EXPECT_TRUE(a.weights.count("blk.0.attn_k.weight"));
    ImportanceMatrix b = m;
    filter_imatrix(b, {}, {"attn_q", "output"});
    EXPECT_EQ(b.weights.size(), 2u);
    EXPECT_FALSE(b.weights.count("output.weight"));
}

// Deterministic positive weights for every quantizable matrix of `f` (ne0 per expert), as a file.
std::map<std::string, std::vector<float>> make_imatrix(const GgufFile& f, const fs::path& path) {
    std::map<std::string, std::vector<float>> w;
    std::vector<Entry> entries;
    uint32_t seed = 1;
    for (const TensorInfo& t : f.tensors()) {
        const std::string name(t.name);
        if (t.n_dims < 2 || name == "token_embd.weight" || name.find("_norm") != std::string::npos) continue;
        const int64_t n_expert = t.ne[2];
        Entry e{name, t.ne[0], {}, std::vector<float>(static_cast<size_t>(n_expert), 8.0f)};
        const std::vector<float> g = quant::test::gaussian(static_cast<size_t>(t.ne[0] * n_expert), seed++, 1.5f);
        for (float v : g) e.sums.push_back(8.0f * std::exp(v));
        std::vector<float> weights;
        for (float s : e.sums) weights.push_back(s / 8.0f);
        w[name] = weights;
        entries.push_back(std::move(e));
    }
    write_imatrix(path, entries);
    return w;
}

// Each converted tensor of `out` is `in`'s rows quantized with its imatrix entry (the slice of
// its expert): the plumbing from file to rows. The rows' bytes against ggml: QuantizeVsGgml.
void expect_weighted_rows(const GgufFile& in, const GgufFile& out, const std::map<std::string, std::vector<float>>& w,
                          int* n_weighted) {
    for (size_t i = 0; i < in.tensors().size(); ++i) {
        const TensorInfo& a = in.tensors()[i];
        const TensorInfo& b = out.tensors()[i];
        if (a.type == b.type) continue;
        const std::string name(a.name);
        const auto it = w.find(name);
        const float* imatrix = it == w.end() ? nullptr : it->second.data();
        if (imatrix && quant::uses_importance(b.type)) ++*n_weighted;
        const int64_t n = a.ne[0], rows = static_cast<int64_t>(a.n_elements) / n;
        const uint64_t in_row = *quant::row_bytes(a.type, n), out_row = *quant::row_bytes(b.type, n);
        std::vector<float> x(static_cast<size_t>(n));
        std::vector<std::byte> q(out_row);
        for (int64_t r = 0; r < rows; ++r) {
            quant::dequantize_row(a.type, a.data.data() + r * in_row, x.data(), n);
            quant::quantize_model_row(b.type, x.data(), q.data(), n, imatrix ? imatrix + (r / a.ne[1]) * n : nullptr);
            ASSERT_EQ(std::memcmp(q.data(), b.data.data() + r * out_row, out_row), 0) << name << " row " << r;
        }
    }
}

TEST(Imatrix, QuantizeWeightsEachTensorByItsEntry) {
    test::TempDir dir;
    for (const char* arch : {"llama", "mixtral"}) {
        SCOPED_TRACE(arch);
        const fs::path f16 = model_data(std::string("tiny-") + arch + "-f16.gguf");
        const GgufFile in = GgufFile::open(f16.string());
        const fs::path imatrix_path = dir / (std::string(arch) + ".imatrix.gguf");
        const auto weights = make_imatrix(in, imatrix_path);
        ImportanceMatrix m = load_imatrix(imatrix_path.string());
        for (const char* type : {"Q4_K_M", "Q4_0", "IQ4_XS", "Q2_K_S", "IQ3_S", "IQ3_XXS", "IQ2_M", "IQ2_XXS", "IQ2_S",
                                 "IQ1_S", "IQ1_M"}) {
            SCOPED_TRACE(type);
            QuantizeParams params;
            params.ftype = *parse_file_type(type);
            params.threads = 3;
            params.imatrix = &m;
            const fs::path out_path = dir / (std::string(arch) + "-" + type + ".gguf");
            quantize_file(f16.string(), out_path.string(), params);
            const GgufFile out = GgufFile::open(out_path.string());
            int n_weighted = 0;
            expect_weighted_rows(in, out, weights, &n_weighted);
            EXPECT_GE(n_weighted, std::string(arch) == "llama" ? 14 : 8);
            EXPECT_EQ(out.get<std::string_view>("quantize.imatrix.file"), imatrix_path.string());
            EXPECT_EQ(out.get<std::string_view>("quantize.imatrix.dataset"), "wiki.train.raw");
            EXPECT_EQ(out.get<uint32_t>("quantize.imatrix.entries_count"), weights.size());
            EXPECT_EQ(out.get<uint32_t>("quantize.imatrix.chunks_count"), 10u);
            if (std::string(arch) == "llama" && std::string(type) == "Q2_K_S") {  // Q2_K's attn_output is Q3_K
                EXPECT_EQ(out.find_tensor("blk.0.attn_output.weight")->type, GgmlType::Q2_K);
            }
        }
    }
}

// The mixes that change with an imatrix (llama.cpp's, on its first n_layer / 8 ffn_down): Q4_0 and
// Q5_0 put them in Q4_1 / Q5_1 with one; IQ4_NL / IQ4_XS put them in Q5_K only without one.
TEST(Imatrix, MixesFollowLlamaCpp) {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add<uint32_t>("llama.block_count", 8);
    w.add<uint32_t>("llama.attention.head_count", 4);
    w.add<uint32_t>("llama.attention.head_count_kv", 4);
    for (int l = 0; l < 8; ++l)
        w.add_tensor("blk." + std::to_string(l) + ".ffn_down.weight", GgmlType::F32, std::vector<int64_t>{256, 2},
                     std::vector<std::byte>(256 * 2 * 4));
    const std::vector<std::byte> bytes = w.to_bytes();
    const GgufFile f = GgufFile::parse(bytes, "mix.gguf");
    ImportanceMatrix m;
    m.weights["blk.0.ffn_down.weight"] = std::vector<float>(256, 1.0f);
    const std::pair<const char*, std::pair<GgmlType, GgmlType>> cases[] = {
        {"Q4_0", {GgmlType::Q4_0, GgmlType::Q4_1}},
        {"Q5_0", {GgmlType::Q5_0, GgmlType::Q5_1}},
        {"IQ4_XS", {GgmlType::Q5_K, GgmlType::IQ4_XS}},
        {"IQ4_NL", {GgmlType::Q5_K, GgmlType::IQ4_NL}},
    };
    for (const auto& [type, want] : cases) {
        SCOPED_TRACE(type);
        QuantizeParams params;
        params.ftype = *parse_file_type(type);
        EXPECT_EQ(plan_quantization(f, params)[0].to, want.first);
        params.imatrix = &m;
        const std::vector<TensorChoice> plan = plan_quantization(f, params);
        EXPECT_EQ(plan[0].to, want.second);
        EXPECT_NE(plan[0].imatrix, nullptr);
        EXPECT_EQ(plan[1].imatrix, nullptr);  // no entry: quantized without
        EXPECT_EQ(plan[1].to, params.ftype == 30 ? GgmlType::IQ4_XS : plan[7].to);
    }
}

TEST(Imatrix, QuantizeRefusesWhatDoesNotFit) {
    test::TempDir dir;
    const fs::path f16 = model_data("tiny-llama-f16.gguf"), out = dir / "out.gguf";
    const fs::path path = dir / "imatrix.gguf";
    QuantizeParams params;
    params.ftype = *parse_file_type("Q2_K_S");
    std::string e = test::thrown_message([&] { quantize_file(f16.string(), out.string(), params); });
    EXPECT_NE(e.find("needs an importance matrix"), std::string::npos) << e;
    EXPECT_NE(e.find("--imatrix"), std::string::npos) << e;

    // An entry of another model's size: the file and the tensor named, nothing written.
    write_imatrix(path, {{"blk.0.attn_q.weight", 512, std::vector<float>(512, 1.0f), {1}}});
    ImportanceMatrix m = load_imatrix(path.string());
    params.ftype = *parse_file_type("Q4_K_M");
    params.imatrix = &m;
    e = test::thrown_message([&] { quantize_file(f16.string(), out.string(), params); });
    EXPECT_NE(e.find(path.string()), std::string::npos) << e;
    EXPECT_NE(e.find("blk.0.attn_q.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("512"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(out));

    // Q2_K_S with an imatrix that lacks a tensor's entry: that tensor named.
    write_imatrix(path, {{"blk.0.attn_q.weight", 256, std::vector<float>(256, 1.0f), {1}}});
    m = load_imatrix(path.string());
    params.ftype = *parse_file_type("Q2_K_S");
    e = test::thrown_message([&] { quantize_file(f16.string(), out.string(), params); });
    EXPECT_NE(e.find("has no entry"), std::string::npos) << e;
    EXPECT_NE(e.find("blk.0.attn_k.weight"), std::string::npos) << e;

    // A token embedding's entry of the wrong size is ignored, as llama.cpp does.
    write_imatrix(path, {{"token_embd.weight", 8, std::vector<float>(8, 1.0f), {1}},
                         {"blk.0.attn_q.weight", 256, std::vector<float>(256, 1.0f), {1}}});
    m = load_imatrix(path.string());
    params.ftype = *parse_file_type("Q4_K_M");
    EXPECT_EQ(test::thrown_message([&] { quantize_file(f16.string(), out.string(), params); }), "(no exception)");
}

}  // namespace
}  // namespace fitllm::gguf
