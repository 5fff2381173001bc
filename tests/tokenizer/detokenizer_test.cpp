// Streaming detokenization: bytes of unfinished UTF-8 sequences are held back, and the stream
// always adds up to Tokenizer::detokenize of the same ids.
#include "tokenizer/detokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "test_support.h"
#include "tokenizer/tiny_vocab.h"
#include "tokenizer/unicode.h"

namespace fitllm::tokenizer {
namespace {

using Ids = std::vector<TokenId>;

std::string stream_all(const Tokenizer& tok, const Ids& ids, bool remove_special, bool unparse_special) {
    Detokenizer stream(tok, remove_special, unparse_special);
    std::string out;
    for (TokenId id : ids) out += stream.feed(id);
    return out + stream.flush();
}

Tokenizer tiny_spm_with_eos() {
    tiny::TinyVocabSpec spec = tiny::spm_spec({{"\xE2\x96\x81"
                                                "a",
                                                -1},
                                               {"a", -2},
                                               {".", -3},
                                               {"\xE2\x96\x81", -4}});
    spec.extra = [](gguf::GgufWriter& w) { w.add<bool>("tokenizer.ggml.add_eos_token", true); };
    const tiny::TinyGguf gguf(spec);
    return Tokenizer::from_gguf(gguf.file());
}

TEST(Detokenizer, HoldsBackAnEmojiSplitAcrossByteTokens) {
    const Tokenizer tok = tiny_spm_with_eos();
    const Ids ids = tok.tokenize("a \xF0\x9F\xA6\x99.", false, false);  // "a 🦙."
    ASSERT_GE(ids.size(), 6u);                                          // the emoji is four byte tokens
    Detokenizer stream(tok, false, false);
    std::vector<std::string> outputs;
    for (TokenId id : ids) outputs.push_back(stream.feed(id));
    outputs.push_back(stream.flush());
    std::string all;
    for (const std::string& o : outputs) {
        all += o;
        // Everything returned is whole UTF-8 characters.
        for (size_t pos = 0; pos < o.size();) {
            EXPECT_NE(utf8_decode(o, pos), kReplacementChar) << "in '" << o << "'";
        }
    }
    EXPECT_EQ(all, tok.detokenize(ids, false, false));
    EXPECT_EQ(all, "a \xF0\x9F\xA6\x99.");
}

TEST(Detokenizer, EmojiBytesComeOutWhenTheSequenceCompletes) {
    const Tokenizer tok = tiny_spm_with_eos();
    const TokenId f0 = tok.vocab().byte_token(0xF0), x9f = tok.vocab().byte_token(0x9F);
    const TokenId a6 = tok.vocab().byte_token(0xA6), x99 = tok.vocab().byte_token(0x99);
    Detokenizer stream(tok, false, false);
    EXPECT_EQ(stream.feed(f0), "");
    EXPECT_EQ(stream.feed(x9f), "");
    EXPECT_EQ(stream.feed(a6), "");
    EXPECT_EQ(stream.feed(x99), "\xF0\x9F\xA6\x99");
    EXPECT_EQ(stream.flush(), "");
    // An unfinished sequence at the end comes out raw on flush.
    EXPECT_EQ(stream.feed(f0), "");
    EXPECT_EQ(stream.flush(), "\xF0");
    // A stray continuation byte is not held.
    EXPECT_EQ(stream.feed(a6), "\xA6");
}

TEST(Detokenizer, RemovesBosAndATrailingEosLikeDetokenize) {
    const Tokenizer tok = tiny_spm_with_eos();
    const Ids ids = tok.tokenize("a a", true, false);
    ASSERT_EQ(ids.front(), tok.vocab().special().bos);
    ASSERT_EQ(ids.back(), tok.vocab().special().eos);
    for (const bool remove_special : {false, true}) {
        for (const bool unparse_special : {false, true}) {
            EXPECT_EQ(stream_all(tok, ids, remove_special, unparse_special),
                      tok.detokenize(ids, remove_special, unparse_special));
        }
    }
    // An EOS in the middle is not the trailing one: it is rendered when the next token comes.
    const TokenId eos = tok.vocab().special().eos;
    const Ids middle{eos, tok.vocab().find("a"), eos, eos};
    Detokenizer stream(tok, true, true);
    EXPECT_EQ(stream.feed(middle[0]), "");
    EXPECT_EQ(stream.feed(middle[1]), "</s>a");
    EXPECT_EQ(stream.feed(middle[2]), "");
    EXPECT_EQ(stream.feed(middle[3]), "</s>");
    EXPECT_EQ(stream.flush(), "");
    EXPECT_EQ(tok.detokenize(middle, true, true), "</s>a</s>");
}

TEST(Detokenizer, CleanSpacesRules) {
    EXPECT_EQ(clean_up_tokenization_spaces("Hello , world ! Really ?"), "Hello, world! Really?");
    EXPECT_EQ(clean_up_tokenization_spaces("a ' b"), "a'b");
    EXPECT_EQ(clean_up_tokenization_spaces("he 's we 're you 've I 'm"), "he's we're you've I'm");
    EXPECT_EQ(clean_up_tokenization_spaces("don 't I 'll we 'd"), "don 't I 'll we 'd");
    EXPECT_EQ(clean_up_tokenization_spaces(" ."), ".");
    EXPECT_EQ(clean_up_tokenization_spaces(" ' ' x"), "'' x");
    EXPECT_EQ(clean_up_tokenization_spaces(""), "");
}

// A byte-level vocabulary of single characters, so any string can be spelled token by token.
Tokenizer char_bpe() {
    tiny::TinyVocabSpec spec;
    spec.model = "gpt2";
    spec.tokens = {"<|endoftext|>",
                   "\xC4\xA0" /* Ġ: space */,
                   "'",
                   "?",
                   "!",
                   ".",
                   ",",
                   "s",
                   "m",
                   "r",
                   "e",
                   "v",
                   "t",
                   "d",
                   "l",
                   "x",
                   "\xC3\x83" /* byte C3 */,
                   "\xC2\xA9" /* byte A9 */};
    spec.types = std::vector<int32_t>(spec.tokens.size(), 1);
    spec.types[0] = 3;
    spec.merges = {"x x"};
    spec.extra = [](gguf::GgufWriter& w) {
        w.add_string("tokenizer.ggml.pre", "gpt-2");
        w.add<uint32_t>("tokenizer.ggml.bos_token_id", 0);
        w.add<uint32_t>("tokenizer.ggml.eos_token_id", 0);
    };
    const tiny::TinyGguf gguf(spec);
    return Tokenizer::from_gguf(gguf.file());
}

TEST(Detokenizer, StreamedCleanSpacesEqualsBatchOnRandomText) {
    const Tokenizer tok = char_bpe();
    ASSERT_TRUE(tok.vocab().clean_spaces());
    std::mt19937 rng(1234);
    std::uniform_int_distribution<TokenId> pick(0, static_cast<TokenId>(tok.vocab().size()) - 1);
    std::uniform_int_distribution<int> length(0, 14);
    for (int round = 0; round < 20000; ++round) {
        Ids ids(static_cast<size_t>(length(rng)));
        for (TokenId& id : ids) id = pick(rng);
        for (const bool remove_special : {false, true}) {
            ASSERT_EQ(stream_all(tok, ids, remove_special, true), tok.detokenize(ids, remove_special, true))
                << "round " << round;
        }
    }
}

TEST(Detokenizer, DemoModelStreamsLikeDetokenize) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model not found (run scripts/setup.sh)";
    const auto file = gguf::GgufFile::open(model->string());
    const Tokenizer tok = Tokenizer::from_gguf(file);
    const std::string text =
        "<start_of_turn>user\nCaf\xC3\xA9 \xF0\x9F\xA6\x99\xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F "
        "\xE4\xBD\xA0\xE5\xA5\xBD  \t x<end_of_turn>\n";
    const Ids ids = tok.tokenize(text, true, true);
    for (const bool remove_special : {false, true}) {
        for (const bool unparse_special : {false, true}) {
            EXPECT_EQ(stream_all(tok, ids, remove_special, unparse_special),
                      tok.detokenize(ids, remove_special, unparse_special));
        }
    }
    EXPECT_EQ(tok.detokenize(ids, true, true), text);
}

}  // namespace
}  // namespace fitllm::tokenizer
