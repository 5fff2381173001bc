// WPM (BERT) tokenization on the bert-bge vocabulary; expected ids from llama-cpp-python 0.3.36.
#include <gtest/gtest.h>

#include "test_support.h"
#include "tokenizer/tiny_vocab.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::tokenizer {
namespace {

using Ids = std::vector<TokenId>;

class Wpm : public ::testing::Test {
protected:
    void SetUp() override {
        const auto dir = test::vocab_dir();
        const auto file = gguf::GgufFile::open((dir / "ggml-vocab-bert-bge.gguf").string());
        tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
    }
    const Tokenizer& tok() const { return *tok_; }

private:
    std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Wpm, LowercasesAndSplitsPunctuation) {
    EXPECT_EQ(tok().tokenize("Hello, World!", false, false), (Ids{7592, 1010, 2088, 999}));
    EXPECT_EQ(tok().tokenize("don't", false, false), (Ids{2123, 1005, 1056}));
}

TEST_F(Wpm, AddSpecialFramesWithClsAndSep) {
    EXPECT_EQ(tok().tokenize("Hello, World!", true, false), (Ids{101, 7592, 1010, 2088, 999, 102}));
    EXPECT_EQ(tok().tokenize("", true, false), (Ids{101, 102}));
}

TEST_F(Wpm, StripsAccentsKeepingTheFirstCodePointOfTheDecomposition) {
    EXPECT_EQ(tok().tokenize("Cr\xC3\xA8me br\xC3\xBBl\xC3\xA9"
                             "e",
                             false, false),
              (Ids{13675, 21382, 7987, 9307, 2063}));
    EXPECT_EQ(tok().tokenize("na\xC3\xAFve caf\xC3\xA9", false, false), (Ids{15743, 7668}));
    EXPECT_EQ(tok().tokenize("a\xCC\x81"
                             "b",
                             false, false),
              (Ids{11113}));  // combining acute dropped
    // Hangul syllables keep only their leading consonant, as llama.cpp's table does.
    EXPECT_EQ(tok().tokenize("\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", false, false), (Ids{1469, 29991, 29999}));
}

TEST_F(Wpm, CjkCharactersAreWordsAndUncoverableWordsAreUnknown) {
    EXPECT_EQ(tok().tokenize("\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8"
                             "apple\xE5\xB7\xA5\xE4\xBD\x9C",
                             false, false),
              (Ids{1855, 100, 100, 6207, 100, 100}));
}

TEST_F(Wpm, GreedyLongestMatchAndControlCharacters) {
    EXPECT_EQ(tok().tokenize("unaffable", false, false), (Ids{14477, 20961, 3468}));
    EXPECT_EQ(tok().tokenize("xqzptlkwvbn", false, false), (Ids{1060, 4160, 2480, 13876, 13687, 2860, 26493, 2078}));
    EXPECT_EQ(tok().tokenize(std::string("Hello\0\x07there", 12), false, false), (Ids{7592, 12399, 2063}));
}

TEST_F(Wpm, SpecialTokensAndDetokenize) {
    EXPECT_EQ(tok().tokenize("[CLS] hi [MASK]", false, false), (Ids{1031, 18856, 2015, 1033, 7632, 1031, 7308, 1033}));
    const Ids ids = tok().tokenize("[CLS] hi [MASK]", true, true);
    EXPECT_EQ(ids, (Ids{101, 101, 7632, 103, 102}));
    EXPECT_EQ(tok().detokenize(ids, true, false), " hi");
    EXPECT_EQ(tok().detokenize(Ids{2123, 1005, 1056}, false, false), " don't");  // clean_spaces
    EXPECT_EQ(tok().detokenize(Ids{7592, 1010, 2088, 999}, false, false), " hello, world!");
    EXPECT_EQ(tok().token_to_piece(3468, false), "ble");
    EXPECT_EQ(tok().token_to_piece(14477, false), " una");
}

TEST(WpmOptions, NormalizerKeysTurnLowercasingOff) {
    tiny::TinyVocabSpec spec;
    spec.model = "bert";
    spec.tokens = {"[PAD]", "[UNK]",
                   "\xE2\x96\x81"
                   "Ab",
                   "\xE2\x96\x81"
                   "ab",
                   "\xE2\x96\x81"
                   "\xC3\xA9"};
    spec.extra = [](gguf::GgufWriter& w) {
        w.add<uint32_t>("tokenizer.ggml.unknown_token_id", 1);
        w.add<uint32_t>("tokenizer.ggml.bos_token_id", 0);
        w.add<uint32_t>("tokenizer.ggml.seperator_token_id", 0);
        w.add<bool>("tokenizer.ggml.normalizer.lowercase", false);
    };
    const tiny::TinyGguf gguf(spec);
    const Tokenizer tok = Tokenizer::from_gguf(gguf.file());
    EXPECT_EQ(tok.tokenize("Ab ab", false, false), (Ids{2, 3}));
    // strip_accents follows lowercase unless the file says otherwise.
    EXPECT_EQ(tok.tokenize("\xC3\xA9", false, false), (Ids{4}));
    EXPECT_EQ(tok.tokenize("zz", false, false), (Ids{1}));
}

}  // namespace
}  // namespace fitllm::tokenizer
