// The ggml type table and file-type names, checked against PyPI's gguf package.
#include "quant/ggml_type.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "quant/file_type.h"
#include "test_support.h"

namespace fitllm::quant {
namespace {

nlohmann::json gguf_py_types() {
    const auto py = test::python();
    if (!py) return nullptr;
    const auto r =
        test::run_command(py->string() + " " + (test::source_dir() / "tools/gguf_py_facts.py").string() + " types");
    if (r.status != 0) return nullptr;
    return nlohmann::json::parse(r.output);
}

TEST(GgmlType, KnownSizes) {
    EXPECT_EQ(traits(GgmlType::F32).block_bytes, 4u);
    EXPECT_EQ(traits(GgmlType::Q4_0).block_bytes, 18u);
    EXPECT_EQ(traits(GgmlType::Q4_K).block_elements, 256u);
    EXPECT_EQ(traits(GgmlType::Q4_K).block_bytes, 144u);
    EXPECT_EQ(traits(GgmlType::Q6_K).block_bytes, 210u);
    EXPECT_EQ(traits(GgmlType::Q8_1).block_bytes, 36u);  // f16 d + f16 s + 32 int8, as ggml has it
    EXPECT_EQ(row_bytes(GgmlType::Q8_0, 64), 68u);
    EXPECT_EQ(row_bytes(GgmlType::Q8_0, 63), std::nullopt);
    EXPECT_FALSE(is_supported(4));   // Q4_2, removed
    EXPECT_FALSE(is_supported(31));  // Q4_0_4_4, removed
    EXPECT_FALSE(traits_of(kGgmlTypeIdEnd).has_value());
    EXPECT_EQ(type_name(4), "Q4_2");
    EXPECT_EQ(type_name(1000), "unknown");
    EXPECT_EQ(type_from_name("q4_k"), GgmlType::Q4_K);
    EXPECT_EQ(type_from_name("Q4_2"), std::nullopt);
}

TEST(GgmlType, AgreesWithPyPIGguf) {
    const auto facts = gguf_py_types();
    if (facts.is_null()) GTEST_SKIP() << "project venv with PyPI gguf not found (run scripts/setup.sh)";
    int compared = 0;
    for (const auto& [id_text, entry] : facts["types"].items()) {
        const auto id = static_cast<uint32_t>(std::stoul(id_text));
        SCOPED_TRACE(entry.dump());
        const auto t = traits_of(id);
        ASSERT_TRUE(t.has_value());
        EXPECT_EQ(t->name, entry[0].get<std::string>());
        EXPECT_EQ(t->block_elements, entry[1].get<uint32_t>());
        // gguf-py keeps Q8_1's old 40-byte layout; ggml (what reads files) uses 36.
        if (id != static_cast<uint32_t>(GgmlType::Q8_1)) {
            EXPECT_EQ(t->block_bytes, entry[2].get<uint32_t>());
        }
        ++compared;
    }
    EXPECT_GE(compared, 30);
    // Every type we support is one gguf-py knows.
    for (uint32_t id = 0; id < kGgmlTypeIdEnd; ++id) {
        if (is_supported(id)) {
            EXPECT_TRUE(facts["types"].contains(std::to_string(id))) << type_name(id);
        }
    }
}

TEST(FileType, Names) {
    EXPECT_EQ(file_type_name(15), "Q4_K_M");
    EXPECT_EQ(file_type_name(0), "F32");
    EXPECT_EQ(file_type_name(1), "F16");
    EXPECT_EQ(file_type_name(7), "Q8_0");
    EXPECT_EQ(file_type_name(32), "BF16");
    EXPECT_EQ(file_type_name(4), "Q4_1_SOME_F16 (removed)");
    EXPECT_EQ(file_type_name(1024 + 15), "Q4_K_M (guessed)");
    EXPECT_EQ(file_type_name(999), std::nullopt);
    EXPECT_EQ(file_type_from_name("q4_k_m"), 15u);
    EXPECT_EQ(file_type_from_name("MOSTLY_Q6_K"), 18u);
    EXPECT_EQ(file_type_from_name("ALL_F32"), 0u);
    EXPECT_EQ(file_type_from_name("Q4_2"), std::nullopt);
}

TEST(FileType, AgreesWithPyPIGguf) {
    const auto facts = gguf_py_types();
    if (facts.is_null()) GTEST_SKIP() << "project venv with PyPI gguf not found (run scripts/setup.sh)";
    int compared = 0;
    for (const auto& [id_text, name] : facts["file_types"].items()) {
        const auto id = static_cast<uint32_t>(std::stoul(id_text));
        if (id == 1024) continue;  // GUESSED is a flag, not a type
        std::string expected = name.get<std::string>();
        if (expected.rfind("MOSTLY_", 0) == 0) expected = expected.substr(7);
        if (expected == "ALL_F32") expected = "F32";
        EXPECT_EQ(file_type_name(id), expected) << id;
        ++compared;
    }
    EXPECT_GE(compared, 30);
}

}  // namespace
}  // namespace fitllm::quant
