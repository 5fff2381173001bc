// SPM tokenization: score-driven merges, byte fallback, leading-space and special-token rules.
#include <gtest/gtest.h>

#include "test_support.h"
#include "tokenizer/tiny_vocab.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::tokenizer {
namespace {

using tiny::TinyGguf;

std::vector<std::string> texts(const Tokenizer& tok, const std::vector<TokenId>& ids) {
    std::vector<std::string> out;
    for (TokenId id : ids) out.push_back(tok.vocab().text(id));
    return out;
}

using Strings = std::vector<std::string>;

Tokenizer tiny_spm(const std::vector<std::pair<std::string, float>>& pieces, bool byte_tokens = true,
                   bool add_space_prefix = false) {
    tiny::TinyVocabSpec spec = tiny::spm_spec(pieces, byte_tokens);
    spec.extra = [add_space_prefix](gguf::GgufWriter& w) {
        w.add<bool>("tokenizer.ggml.add_space_prefix", add_space_prefix);
    };
    const TinyGguf gguf(spec);
    return Tokenizer::from_gguf(gguf.file());  // the Tokenizer copies what it needs
}

TEST(Spm, MergesTheHighestScoringPairFirst) {
    const Tokenizer right_first = tiny_spm({{"a", -5}, {"b", -5}, {"c", -5}, {"ab", -2}, {"bc", -1}});
    EXPECT_EQ(texts(right_first, right_first.tokenize("abc", false, false)), (Strings{"a", "bc"}));
    const Tokenizer left_first = tiny_spm({{"a", -5}, {"b", -5}, {"c", -5}, {"ab", -1}, {"bc", -2}});
    EXPECT_EQ(texts(left_first, left_first.tokenize("abc", false, false)), (Strings{"ab", "c"}));
    // Equal scores: the leftmost pair wins.
    const Tokenizer tie = tiny_spm({{"a", -5}, {"b", -5}, {"c", -5}, {"ab", -1}, {"bc", -1}});
    EXPECT_EQ(texts(tie, tie.tokenize("abc", false, false)), (Strings{"ab", "c"}));
    // Merges continue through intermediate tokens.
    const Tokenizer chain = tiny_spm({{"a", -5}, {"b", -5}, {"c", -5}, {"ab", -1}, {"abc", -3}});
    EXPECT_EQ(texts(chain, chain.tokenize("abcab", false, false)), (Strings{"abc", "ab"}));
}

TEST(Spm, UnknownCharactersFallBackToBytes) {
    const Tokenizer tok = tiny_spm({{"a", -1}});
    // "é" is C3 A9 in UTF-8.
    EXPECT_EQ(texts(tok, tok.tokenize("a\xC3\xA9"
                                      "a",
                                      false, false)),
              (Strings{"a", "<0xC3>", "<0xA9>", "a"}));
    EXPECT_EQ(tok.detokenize(tok.tokenize("a\xC3\xA9"
                                          "a",
                                          false, false),
                             false, false),
              "a\xC3\xA9"
              "a");
    // A truncated sequence at the end still becomes its bytes.
    EXPECT_EQ(texts(tok, tok.tokenize("\xF0\x9F", false, false)), (Strings{"<0xF0>", "<0x9F>"}));
}

TEST(Spm, WithoutByteTokensUnknownCharactersBecomeUnk) {
    const Tokenizer tok = tiny_spm({{"a", -1}}, /*byte_tokens=*/false);
    EXPECT_EQ(texts(tok, tok.tokenize("a\xC3\xA9"
                                      "a",
                                      false, false)),
              (Strings{"a", "<unk>", "a"}));
}

TEST(Spm, SpacesAreEscapedAndPrefixedAfterSpecialTokens) {
    const Tokenizer tok = tiny_spm({{"\xE2\x96\x81", -3},
                                    {"a", -2},
                                    {"\xE2\x96\x81"
                                     "a",
                                     -1}},
                                   true, true);
    EXPECT_EQ(texts(tok, tok.tokenize("a a", false, false)), (Strings{"\xE2\x96\x81"
                                                                      "a",
                                                                      "\xE2\x96\x81"
                                                                      "a"}));
    EXPECT_EQ(texts(tok, tok.tokenize("a", true, false)), (Strings{"<s>",
                                                                   "\xE2\x96\x81"
                                                                   "a"}));
    // After a special token the text gets the space prefix again.
    EXPECT_EQ(texts(tok, tok.tokenize("a</s>a", false, true)), (Strings{"\xE2\x96\x81"
                                                                        "a",
                                                                        "</s>",
                                                                        "\xE2\x96\x81"
                                                                        "a"}));
    EXPECT_EQ(tok.detokenize(tok.tokenize("a a", false, false), false, false), "a a");
    EXPECT_TRUE(tok.tokenize("", false, false).empty());
    EXPECT_EQ(texts(tok, tok.tokenize("", true, false)), (Strings{"<s>"}));
}

// Facts checked against llama-cpp-python 0.3.36 on the llama-spm vocabulary.
TEST(Spm, LlamaLeadingSpaceRules) {
    const auto dir = test::vocab_dir();
    const auto file = gguf::GgufFile::open((dir / "ggml-vocab-llama-spm.gguf").string());
    const Tokenizer tok = Tokenizer::from_gguf(file);
    EXPECT_EQ(tok.tokenize("Hello", true, false), (std::vector<TokenId>{1, 15043}));
    EXPECT_EQ(tok.tokenize("<s>Hello</s> world", true, true), (std::vector<TokenId>{1, 1, 15043, 2, 29871, 3186}));
    EXPECT_EQ(tok.tokenize("<s>Hello</s> world", true, false),
              (std::vector<TokenId>{1, 529, 29879, 29958, 10994, 829, 29879, 29958, 3186}));
    EXPECT_EQ(tok.tokenize("caf\xC3\xA9 \xF0\x9F\xA6\x99", false, false),
              (std::vector<TokenId>{274, 28059, 29871, 243, 162, 169, 156}));
    const std::vector<TokenId> with_bos{1, 15043, 2};
    const std::vector<TokenId> without_bos{15043, 2};
    // llama_detokenize removes the prefix space unless it removes a BOS first.
    EXPECT_EQ(tok.detokenize(with_bos, false, false), " Hello");
    EXPECT_EQ(tok.detokenize(with_bos, false, true), "<s> Hello</s>");
    EXPECT_EQ(tok.detokenize(with_bos, true, false), " Hello");
    EXPECT_EQ(tok.detokenize(with_bos, true, true), " Hello</s>");
    EXPECT_EQ(tok.detokenize(without_bos, false, false), "Hello");
    EXPECT_EQ(tok.detokenize(without_bos, true, true), "Hello</s>");
    EXPECT_EQ(tok.token_to_piece(15043, false), " Hello");
    EXPECT_EQ(tok.token_to_piece(15043, false, 1), "Hello");
    EXPECT_EQ(tok.token_to_piece(2, false), "");
    EXPECT_EQ(tok.token_to_piece(2, true), "</s>");
    EXPECT_EQ(tok.token_to_piece(13, false), "\n");  // <0x0A>
    EXPECT_THROW(tok.token_to_piece(32000, false), VocabError);
    EXPECT_THROW(tok.token_to_piece(-1, false), VocabError);
}

TEST(Spm, DemoModelParsesSpecialTokensOnlyWhenAsked) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model not found (run scripts/setup.sh)";
    const auto file = gguf::GgufFile::open(model->string());
    const Tokenizer tok = Tokenizer::from_gguf(file);
    const std::string text = "Hello world, <start_of_turn>user  hi";
    // From llama-cpp-python 0.3.36.
    EXPECT_EQ(tok.tokenize(text, true, true),
              (std::vector<TokenId>{2, 9259, 1902, 236764, 236743, 105, 2364, 138, 2202}));
    EXPECT_EQ(tok.tokenize(text, true, false), (std::vector<TokenId>{2, 9259, 1902, 236764, 655, 3041, 236779, 1340,
                                                                     236779, 887, 236813, 2364, 138, 2202}));
    // "  " is a user-defined token: matched even without parse_special.
    EXPECT_EQ(tok.tokenize("<start_of_turn>", false, true), (std::vector<TokenId>{105}));
    EXPECT_EQ(tok.detokenize(std::vector<TokenId>{2, 105, 2364, 138, 2202}, false, true),
              "<bos><start_of_turn>user  hi");
    EXPECT_EQ(tok.detokenize(std::vector<TokenId>{2, 105, 2364, 138, 2202}, true, false), "user  hi");
}

}  // namespace
}  // namespace fitllm::tokenizer
