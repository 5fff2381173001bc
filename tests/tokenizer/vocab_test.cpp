// Vocab::from_gguf: llama.cpp's defaults and load-time patches, and clear errors for bad data.
#include "tokenizer/vocab.h"

#include <gtest/gtest.h>

#include "test_support.h"
#include "tokenizer/tiny_vocab.h"

namespace fitllm::tokenizer {
namespace {

using tiny::TinyGguf;
using tiny::TinyVocabSpec;

// Throws VocabError whose message names `key`.
void expect_vocab_error(const TinyVocabSpec& spec, const std::string& key) {
    const TinyGguf gguf(spec);
    try {
        (void)Vocab::from_gguf(gguf.file());
        ADD_FAILURE() << "no VocabError; expected one naming " << key;
    } catch (const VocabError& e) {
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("tiny.gguf"), std::string::npos) << e.what();
    }
}

// Special ids as llama.cpp (llama-cpp-python 0.3.36) reports them for the same files.
struct SpecialIdsCase {
    const char* family;
    TokenId bos, eos, eot, sep, linefeed, pad;
    bool add_bos;
    std::vector<TokenId> eog;
};

TEST(Vocab, SpecialIdsMatchLlamaCpp) {
    const auto dir = test::vocab_dir();
    const SpecialIdsCase cases[] = {
        {"baichuan", 1, 2, kNoToken, kNoToken, 403, 0, true, {2}},
        {"bert-bge", 101, kNoToken, kNoToken, 102, 0, 0, true, {0}},
        {"deepseek-coder", 32013, 32014, 32014, kNoToken, 185, 32014, true, {32014}},
        {"deepseek-llm", 100000, 100001, 100001, kNoToken, 185, 100001, true, {100001}},
        {"falcon", 11, 11, 11, kNoToken, 193, kNoToken, false, {11}},
        {"gpt-2", 50256, 50256, 50256, kNoToken, 198, kNoToken, false, {50256}},
        {"gpt-neox", 0, 0, 0, kNoToken, 187, kNoToken, false, {0}},
        {"llama-spm", 1, 2, kNoToken, kNoToken, 13, kNoToken, true, {2}},
        {"mpt", 0, 0, 0, kNoToken, 187, kNoToken, false, {0}},
        {"phi-3", 1, 32000, 32007, kNoToken, 13, 32000, true, {2, 32000, 32007}},
        {"refact", 0, 0, 0, kNoToken, 203, kNoToken, false, {0, 4, 18}},
        {"starcoder", 0, 0, 0, kNoToken, 222, kNoToken, false, {0, 4}},
    };
    for (const SpecialIdsCase& c : cases) {
        SCOPED_TRACE(c.family);
        const auto file = gguf::GgufFile::open((dir / (std::string("ggml-vocab-") + c.family + ".gguf")).string());
        const Vocab vocab = Vocab::from_gguf(file);
        EXPECT_EQ(vocab.special().bos, c.bos);
        EXPECT_EQ(vocab.special().eos, c.eos);
        EXPECT_EQ(vocab.special().eot, c.eot);
        EXPECT_EQ(vocab.special().sep, c.sep);
        EXPECT_EQ(vocab.special().linefeed, c.linefeed);
        EXPECT_EQ(vocab.special().pad, c.pad);
        EXPECT_EQ(vocab.add_bos(), c.add_bos);
        EXPECT_EQ(vocab.eog_tokens(), c.eog);
    }
}

TEST(Vocab, DemoModel) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model not found (run scripts/setup.sh)";
    const auto file = gguf::GgufFile::open(model->string());
    const Vocab vocab = Vocab::from_gguf(file);
    EXPECT_EQ(vocab.type(), VocabType::spm);
    EXPECT_EQ(vocab.size(), 262144u);
    EXPECT_TRUE(vocab.add_bos());
    EXPECT_FALSE(vocab.add_eos());
    EXPECT_FALSE(vocab.add_space_prefix());  // the file says so; SPM's default would be true
    EXPECT_FALSE(vocab.clean_spaces());
    EXPECT_EQ(vocab.special().bos, 2);
    EXPECT_EQ(vocab.special().eos, 1);
    EXPECT_EQ(vocab.special().eot, 106);       // "<end_of_turn>", found by its text
    EXPECT_EQ(vocab.special().linefeed, 248);  // <0x0A>
    EXPECT_EQ(vocab.eog_tokens(), (std::vector<TokenId>{1, 106, 212}));
    EXPECT_EQ(vocab.find("<start_of_turn>"), 105);
    EXPECT_TRUE(vocab.is_control(105));
    // "</s>" is user-defined in the file; llama.cpp makes it control as an end-of-generation text.
    EXPECT_EQ(vocab.token_type(212), TokenType::user_defined);
    EXPECT_TRUE(vocab.is_control(212));
    EXPECT_TRUE(vocab.is_byte(vocab.byte_token(0x41)));
    EXPECT_EQ(vocab.byte_of(vocab.byte_token(0x41)), 0x41);
    // Longest first.
    const auto& partition = vocab.partition_tokens();
    ASSERT_FALSE(partition.empty());
    for (size_t i = 1; i < partition.size(); ++i)
        ASSERT_GE(vocab.text(partition[i - 1]).size(), vocab.text(partition[i]).size());
}

TEST(Vocab, FindsEndOfTurnByTextAndMakesItControl) {
    TinyVocabSpec spec = tiny::spm_spec({{"a", -1}, {"<|im_end|>", 0}, {"<|eom_id|>", 0}}, false);
    const TinyGguf gguf(spec);
    const Vocab vocab = Vocab::from_gguf(gguf.file());
    const TokenId im_end = vocab.find("<|im_end|>");
    EXPECT_EQ(vocab.special().eot, im_end);
    EXPECT_EQ(vocab.special().eom, vocab.find("<|eom_id|>"));
    EXPECT_TRUE(vocab.is_control(im_end));
    EXPECT_EQ(vocab.token_type(im_end), TokenType::normal);
    EXPECT_TRUE(vocab.is_eog(im_end));
    EXPECT_TRUE(vocab.is_eog(vocab.special().eos));
    EXPECT_FALSE(vocab.is_eog(vocab.find("a")));
}

TEST(Vocab, DefaultsPerType) {
    const TinyGguf spm(tiny::spm_spec({{"a", -1}}, false));
    const Vocab s = Vocab::from_gguf(spm.file());
    EXPECT_TRUE(s.add_bos());
    EXPECT_TRUE(s.add_space_prefix());
    EXPECT_FALSE(s.clean_spaces());
    EXPECT_EQ(s.special().unk, 0);
    EXPECT_EQ(s.special().bos, 1);

    TinyVocabSpec bpe;
    bpe.model = "gpt2";
    bpe.tokens = {"a", "b", "ab"};
    bpe.merges = {"a b"};
    bpe.extra = [](gguf::GgufWriter& w) { w.add_string("tokenizer.ggml.pre", "qwen2"); };
    const TinyGguf bpe_file(bpe);
    const Vocab b = Vocab::from_gguf(bpe_file.file());
    EXPECT_EQ(b.type(), VocabType::bpe);
    EXPECT_FALSE(b.add_bos());
    EXPECT_FALSE(b.add_space_prefix());
    EXPECT_FALSE(b.clean_spaces());        // qwen2 keeps spaces as they are
    EXPECT_EQ(b.special().bos, kNoToken);  // the default (11) is past this vocabulary's end
    EXPECT_EQ(b.merge_count(), 1u);
    EXPECT_EQ(b.merge_rank("a", "b"), 0);
    EXPECT_EQ(b.merge_rank("b", "a"), -1);
}

TEST(Vocab, PartitionTokensAreSpecialOnesLongestFirst) {
    TinyVocabSpec spec = tiny::spm_spec({{"<x>", 0}, {"<longer>", 0}, {"plain", 0}}, false);
    spec.types[3] = 4;  // <x>: user-defined
    spec.types[4] = 3;  // <longer>: control
    const TinyGguf gguf(spec);
    const Vocab vocab = Vocab::from_gguf(gguf.file());
    std::vector<std::string> texts;
    for (TokenId id : vocab.partition_tokens()) texts.push_back(vocab.text(id));
    ASSERT_EQ(texts.size(), 5u);  // <unk> <s> </s> <x> <longer>
    EXPECT_EQ(texts[0], "<longer>");
    EXPECT_EQ(texts[1], "<unk>");
    EXPECT_EQ(texts.back(), "<x>");
}

TEST(Vocab, BadDataNamesTheKey) {
    TinyVocabSpec unknown_model = tiny::spm_spec({{"a", 0}});
    unknown_model.model = "sentencepiece-9000";
    expect_vocab_error(unknown_model, "tokenizer.ggml.model");

    TinyVocabSpec short_scores = tiny::spm_spec({{"a", 0}});
    short_scores.scores.pop_back();
    expect_vocab_error(short_scores, "tokenizer.ggml.scores");

    TinyVocabSpec long_types = tiny::spm_spec({{"a", 0}});
    long_types.types.push_back(1);
    expect_vocab_error(long_types, "tokenizer.ggml.token_type");

    TinyVocabSpec bad_bos = tiny::spm_spec({{"a", 0}});
    bad_bos.extra = [](gguf::GgufWriter& w) { w.add<uint32_t>("tokenizer.ggml.bos_token_id", 100000); };
    expect_vocab_error(bad_bos, "tokenizer.ggml.bos_token_id");

    TinyVocabSpec string_eos = tiny::spm_spec({{"a", 0}});
    string_eos.extra = [](gguf::GgufWriter& w) { w.add_string("tokenizer.ggml.eos_token_id", "</s>"); };
    expect_vocab_error(string_eos, "tokenizer.ggml.eos_token_id");

    TinyVocabSpec duplicate = tiny::spm_spec({{"a", 0}, {"a", -1}});
    expect_vocab_error(duplicate, "tokenizer.ggml.tokens");

    TinyVocabSpec no_merges;
    no_merges.model = "gpt2";
    no_merges.tokens = {"a", "b"};
    expect_vocab_error(no_merges, "tokenizer.ggml.merges");

    TinyVocabSpec bos_missing;
    bos_missing.model = "gpt2";
    bos_missing.tokens = {"a", "b"};
    bos_missing.merges = {"a b"};
    bos_missing.extra = [](gguf::GgufWriter& w) { w.add<bool>("tokenizer.ggml.add_bos_token", true); };
    expect_vocab_error(bos_missing, "tokenizer.ggml.add_bos_token");

    TinyVocabSpec wrong_flag_type = tiny::spm_spec({{"a", 0}});
    wrong_flag_type.extra = [](gguf::GgufWriter& w) { w.add<uint8_t>("tokenizer.ggml.add_space_prefix", 1); };
    expect_vocab_error(wrong_flag_type, "tokenizer.ggml.add_space_prefix");
}

TEST(Vocab, MissingModelKeyIsAnError) {
    gguf::GgufWriter w;
    w.add_string("general.architecture", "llama");
    const std::vector<std::byte> bytes = w.to_bytes();
    const auto file = gguf::GgufFile::parse(bytes, "nomodel.gguf");
    try {
        (void)Vocab::from_gguf(file);
        ADD_FAILURE() << "no VocabError";
    } catch (const VocabError& e) {
        EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model"), std::string::npos) << e.what();
    }
}

TEST(Vocab, EmptyTokenTextsStayDistinct) {
    const TinyGguf gguf(tiny::spm_spec({{"", 0}, {"a", 0}}, false));
    const Vocab vocab = Vocab::from_gguf(gguf.file());
    EXPECT_EQ(vocab.text(3), "[EMPTY_3]");
    EXPECT_EQ(vocab.find(""), kNoToken);
}

}  // namespace
}  // namespace fitllm::tokenizer
