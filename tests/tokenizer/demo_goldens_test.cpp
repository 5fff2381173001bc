// The demo model's tokenizer against llama.cpp's, on 240+ strings (goldens from
// tools/gen_tokenizer_goldens.py, run through PyPI's llama-cpp-python).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::tokenizer {
namespace {

std::string latin1_to_bytes(const std::string& utf8_of_latin1) {
    // The generator stores raw bytes as latin-1 code points so JSON can carry any byte.
    std::string out;
    for (size_t i = 0; i < utf8_of_latin1.size(); ++i) {
        const auto c = static_cast<unsigned char>(utf8_of_latin1[i]);
        if (c < 0x80) {
            out += static_cast<char>(c);
        } else {
            const auto next = static_cast<unsigned char>(utf8_of_latin1[++i]);
            out += static_cast<char>(((c & 0x03) << 6) | (next & 0x3F));
        }
    }
    return out;
}

TEST(TokenizerDemoGoldens, MatchesLlamaCpp) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model not found (run scripts/setup.sh)";
    std::ifstream in(test::source_dir() / "tests/tokenizer/goldens/gemma3-270m.json");
    ASSERT_TRUE(in) << "golden file missing";
    const auto goldens = nlohmann::json::parse(in);
    const auto file = gguf::GgufFile::open(model->string());
    const Tokenizer tok = Tokenizer::from_gguf(file);
    size_t checked = 0;
    for (const auto& c : goldens["cases"]) {
        const std::string text = c["text"];
        SCOPED_TRACE("text: " + nlohmann::json(text).dump());
        EXPECT_EQ(tok.tokenize(text, false, false), c["ids"].get<std::vector<TokenId>>());
        EXPECT_EQ(tok.tokenize(text, true, false), c["ids_add_special"].get<std::vector<TokenId>>());
        EXPECT_EQ(tok.tokenize(text, false, true), c["ids_parse_special"].get<std::vector<TokenId>>());
        const auto ids = c["ids_add_parse_special"].get<std::vector<TokenId>>();
        EXPECT_EQ(tok.tokenize(text, true, true), ids);
        EXPECT_EQ(tok.detokenize(ids, false, true), latin1_to_bytes(c["detokenized"]));
        EXPECT_EQ(tok.detokenize(ids, true, false), latin1_to_bytes(c["detokenized_remove_special"]));
        ++checked;
    }
    EXPECT_GE(checked, 200u);
}

}  // namespace
}  // namespace fitllm::tokenizer
