// The demo model (Gemma 3 270M Q4_K_M) read by fitllm and by PyPI's gguf: they must agree.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "test_support.h"

namespace fitllm::gguf {
namespace {

#define REQUIRE_DEMO_MODEL(path)                                                                             \
    const auto path##_opt = test::demo_model();                                                              \
    if (!path##_opt) GTEST_SKIP() << "demo model not found (run scripts/setup.sh or set FITLLM_DEMO_MODEL)"; \
    const std::string path = path##_opt->string()

TEST(DemoModel, IsGemma3WithItsTensors) {
    REQUIRE_DEMO_MODEL(path);
    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.get<std::string_view>("general.architecture"), "gemma3");
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.get<uint32_t>("gemma3.block_count"), 18u);
    EXPECT_EQ(f.at("tokenizer.ggml.tokens").strings().size(), 262144u);
    ASSERT_NE(f.find_tensor("token_embd.weight"), nullptr);
    EXPECT_EQ(f.find_tensor("token_embd.weight")->ne[0], 640);
}

TEST(DemoModel, AgreesWithPyPIGgufReader) {
    REQUIRE_DEMO_MODEL(path);
    const auto py = test::python();
    if (!py) GTEST_SKIP() << "project venv not found (run scripts/setup.sh)";
    const auto r = test::run_command(py->string() + " " + (test::source_dir() / "tools/gguf_py_facts.py").string() +
                                     " summary '" + path + "'");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto facts = nlohmann::json::parse(r.output);

    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(facts["architecture"], std::string(f.get<std::string_view>("general.architecture")));
    EXPECT_EQ(facts["metadata_count"].get<size_t>(), f.metadata().size());
    ASSERT_EQ(facts["tensor_count"].get<size_t>(), f.tensors().size());
    uint64_t total = 0;
    for (size_t i = 0; i < f.tensors().size(); ++i) {
        const TensorInfo& t = f.tensors()[i];
        const auto& p = facts["tensors"][i];
        SCOPED_TRACE(std::string(t.name));
        EXPECT_EQ(p["name"], std::string(t.name));
        EXPECT_EQ(p["type"].get<uint32_t>(), static_cast<uint32_t>(t.type));
        EXPECT_EQ(p["bytes"].get<uint64_t>(), t.n_bytes);
        EXPECT_EQ(p["elements"].get<uint64_t>(), t.n_elements);
        EXPECT_EQ(p["offset"].get<uint64_t>(), f.data_offset() + t.offset);
        total += t.n_bytes;
    }
    EXPECT_EQ(facts["total_bytes"].get<uint64_t>(), total);
}

TEST(DemoModel, RewritesByteExact) {
    REQUIRE_DEMO_MODEL(path);
    const GgufFile f = GgufFile::open(path);
    GgufWriter w(f.version());
    for (const Value& v : f.metadata()) w.add_value(v);
    for (const TensorInfo& t : f.tensors())
        w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne.data(), t.n_dims), t.data);
    const std::vector<std::byte> out = w.to_bytes();
    ASSERT_EQ(out.size(), f.size());
    EXPECT_TRUE(std::equal(out.begin(), out.end(), f.bytes().begin()));
}

TEST(DemoModel, EveryVocabFileParses) {
    const auto dir = test::vocab_dir();
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() != ".gguf") continue;
        SCOPED_TRACE(entry.path().string());
        const GgufFile f = GgufFile::open(entry.path().string());
        EXPECT_TRUE(f.has("tokenizer.ggml.model"));
        EXPECT_GT(f.at("tokenizer.ggml.tokens").array_size(), 1000u);
        EXPECT_TRUE(f.tensors().empty());
        GgufWriter w(f.version());  // vocab-only files round-trip byte-exactly too
        for (const Value& v : f.metadata()) w.add_value(v);
        const std::vector<std::byte> out = w.to_bytes();
        EXPECT_TRUE(out.size() == f.size() && std::equal(out.begin(), out.end(), f.bytes().begin()));
        ++files;
    }
    EXPECT_GE(files, 10);
}

}  // namespace
}  // namespace fitllm::gguf
