// The BPE segmenter on its own (no special-token partitioning): llama.cpp's test vectors for
// every BPE family, llama.cpp's own ids for every pre-tokenizer (the gpt-2 vocabulary with
// tokenizer.ggml.pre rewritten; goldens from tools/gen_pre_tokenizer_goldens.py), and small
// made-up vocabularies for merge order, ignore_merges and the fallback for unknown symbols.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf/gguf_writer.h"
#include "test_support.h"
#include "tokenizer/segmenter.h"
#include "tokenizer/vocab.h"

namespace fitllm::tokenizer {
namespace {

using Ids = std::vector<TokenId>;

std::string read_text(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A golden case's input: "text", or "hex" for bytes that are not UTF-8.
std::string case_input(const nlohmann::json& c) {
    if (c.contains("text")) return c.at("text").get<std::string>();
    const std::string hex = c.at("hex");
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    return out;
}

Vocab load_vocab(const std::filesystem::path& path) {
    const auto file = gguf::GgufFile::open(path.string());
    return Vocab::from_gguf(file);
}

// The file at `path` with tokenizer.ggml.pre set to `pre` (other keys copied as they are).
Vocab load_vocab_with_pre(const std::filesystem::path& path, std::string_view pre) {
    const auto file = gguf::GgufFile::open(path.string());
    gguf::GgufWriter writer(file.version());
    for (const gguf::Value& value : file.metadata()) {
        if (value.key() == "tokenizer.ggml.pre")
            writer.add_string(value.key(), pre);
        else
            writer.add_value(value);
    }
    const std::vector<std::byte> bytes = writer.to_bytes();
    const auto patched = gguf::GgufFile::parse(bytes, path.filename().string() + " with pre=" + std::string(pre));
    return Vocab::from_gguf(patched);
}

Ids tokenize(const Segmenter& segmenter, std::string_view text) {
    Ids ids;
    segmenter.tokenize(text, ids);
    return ids;
}

// ---- llama.cpp's test vectors -------------------------------------------------------------

struct VectorCase {
    std::string input;
    Ids expected;
};

std::vector<VectorCase> read_vector_cases(const std::filesystem::path& base) {
    const std::string raw = read_text(base.string() + ".inp");
    const std::string separator = "\n__ggml_vocab_test__\n";
    std::vector<std::string> inputs;
    for (size_t pos = 0; pos < raw.size();) {
        const size_t next = raw.find(separator, pos);
        inputs.push_back(raw.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
        if (next == std::string::npos) break;
        pos = next + separator.size();
    }
    std::ifstream out(base.string() + ".out");
    std::vector<VectorCase> cases;
    std::string line;
    for (size_t i = 0; i < inputs.size() && std::getline(out, line); ++i) {
        VectorCase c{inputs[i], {}};
        std::istringstream ids(line);
        for (TokenId id; ids >> id;) c.expected.push_back(id);
        cases.push_back(std::move(c));
    }
    return cases;
}

class BpeVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(BpeVectors, SegmenterMatchesLlamaCpp) {
    const auto dir = test::vocab_dir();
    const auto base = dir / ("ggml-vocab-" + GetParam() + ".gguf");
    const Vocab vocab = load_vocab(base);
    ASSERT_EQ(vocab.type(), VocabType::bpe);
    const auto segmenter = make_bpe_segmenter(vocab);
    const auto cases = read_vector_cases(base);
    ASSERT_GE(cases.size(), 40u);
    // User-defined tokens ("  " in mpt, "ü" in deepseek) are cut out of the text before the
    // segmenter sees it, even with parse_special = false; those inputs are the Tokenizer's to
    // pass (vocab_vectors_test.cpp), the others must come out of the segmenter alone.
    std::vector<std::string_view> user_defined;
    for (const TokenId id : vocab.partition_tokens())
        if (vocab.is_user_defined(id)) user_defined.push_back(vocab.text(id));
    size_t checked = 0;
    for (const VectorCase& c : cases) {
        const bool partitioned = std::any_of(user_defined.begin(), user_defined.end(),
                                             [&](std::string_view t) { return c.input.find(t) != std::string::npos; });
        if (partitioned) continue;
        EXPECT_EQ(tokenize(*segmenter, c.input), c.expected) << "input: '" << c.input << "'";
        ++checked;
    }
    EXPECT_GE(checked, cases.size() * 3 / 4) << "too few inputs free of user-defined tokens";
    std::cout << "[          ] " << GetParam() << ": " << checked << " of " << cases.size()
              << " inputs through the segmenter alone\n";
}

INSTANTIATE_TEST_SUITE_P(Bpe, BpeVectors,
                         ::testing::Values("gpt-2", "falcon", "deepseek-llm", "deepseek-coder", "starcoder", "refact",
                                           "mpt"),
                         [](const ::testing::TestParamInfo<std::string>& family) {
                             std::string name = family.param;
                             for (char& c : name)
                                 if (c == '-') c = '_';
                             return name;
                         });

// ---- llama.cpp's ids for every pre-tokenizer ----------------------------------------------

TEST(BpeLlamaCppGoldens, EveryPreTokenizerMatchesLlamaCpp) {
    const auto dir = test::vocab_dir();
    std::ifstream in(test::source_dir() / "tests" / "tokenizer" / "goldens" / "pre_tokenizer_splits.json");
    ASSERT_TRUE(in) << "missing tests/tokenizer/goldens/pre_tokenizer_splits.json";
    const nlohmann::json goldens = nlohmann::json::parse(in);
    const auto base = dir / goldens.at("vocab").get<std::string>();
    const auto& first_case = goldens.at("cases").at(0).at("llama_cpp_ids");
    ASSERT_GE(first_case.size(), 10u);
    for (const auto& [pre, unused] : first_case.items()) {
        const Vocab vocab = load_vocab_with_pre(base, pre);
        const auto segmenter = make_bpe_segmenter(vocab);
        for (const auto& c : goldens.at("cases")) {
            const std::string text = case_input(c);
            EXPECT_EQ(tokenize(*segmenter, text), c.at("llama_cpp_ids").at(pre).get<Ids>())
                << "pre " << pre << ", case " << c.dump();
        }
    }
}

TEST(BpeSegmenter, UnknownPreTokenizerIsAVocabError) {
    const auto dir = test::vocab_dir();
    const Vocab vocab = load_vocab_with_pre(dir / "ggml-vocab-gpt-2.gguf", "made-up-pre");
    EXPECT_THROW(make_bpe_segmenter(vocab), VocabError);
}

// ---- made-up vocabularies -----------------------------------------------------------------

// A BPE vocabulary of `tokens` (GPT-2 code point texts) and `merges` ("left right"), with
// tokenizer.ggml.pre = `pre`.
Vocab tiny_vocab(const std::vector<std::string>& tokens, const std::vector<std::string>& merges, std::string_view pre) {
    gguf::GgufWriter writer;
    writer.add_string("tokenizer.ggml.model", "gpt2");
    writer.add_string("tokenizer.ggml.pre", pre);
    writer.add_string_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
    writer.add_string_array("tokenizer.ggml.merges", std::span<const std::string>(merges));
    writer.add<uint32_t>("tokenizer.ggml.bos_token_id", 0);  // llama-bpe adds BOS by default
    const std::vector<std::byte> bytes = writer.to_bytes();
    return Vocab::from_gguf(gguf::GgufFile::parse(bytes, "tiny vocab"));
}

TEST(BpeSegmenter, MergesLowestRankFirst) {
    // ids:                  0    1    2    3     4     5
    const Vocab vocab = tiny_vocab({"a", "b", "c", "ab", "bc", "abc"}, {"b c", "a b", "a bc"}, "gpt-2");
    const auto segmenter = make_bpe_segmenter(vocab);
    EXPECT_EQ(tokenize(*segmenter, "abc"), (Ids{5}));  // "b c" (rank 0), then "a bc"
    EXPECT_EQ(tokenize(*segmenter, "ab"), (Ids{3}));
    EXPECT_EQ(tokenize(*segmenter, "abab"), (Ids{3, 3}));
}

TEST(BpeSegmenter, TiesGoToTheLeftmostPair) {
    const Vocab vocab = tiny_vocab({"a", "aa"}, {"a a"}, "gpt-2");
    const auto segmenter = make_bpe_segmenter(vocab);
    EXPECT_EQ(tokenize(*segmenter, "aaa"), (Ids{1, 0}));
}

TEST(BpeSegmenter, IgnoreMergesTakesWholeTokenWords) {
    // "abc" is a token, but the merges alone only reach "ab" + "c".
    const std::vector<std::string> tokens = {"a", "b", "c", "ab", "abc"};
    const std::vector<std::string> merges = {"a b"};
    const Vocab merged = tiny_vocab(tokens, merges, "gpt-2");
    EXPECT_EQ(tokenize(*make_bpe_segmenter(merged), "abc"), (Ids{3, 2}));
    const Vocab llama3 = tiny_vocab(tokens, merges, "llama-bpe");
    ASSERT_TRUE(llama3.ignore_merges());
    EXPECT_EQ(tokenize(*make_bpe_segmenter(llama3), "abc"), (Ids{4}));
    const Vocab dbrx = tiny_vocab(tokens, merges, "dbrx");  // llama3's pattern, merged as usual
    EXPECT_EQ(tokenize(*make_bpe_segmenter(dbrx), "abc"), (Ids{3, 2}));
}

TEST(BpeSegmenter, MissingSymbolsFallBackToOneByteTokensLikeLlamaCpp) {
    // "a b" merges to a symbol the vocabulary lacks: llama.cpp looks its bytes up one by one.
    const Vocab vocab = tiny_vocab({"a", "b", "z"}, {"a b"}, "gpt-2");
    const auto segmenter = make_bpe_segmenter(vocab);
    EXPECT_EQ(tokenize(*segmenter, "ab"), (Ids{0, 1}));
    // Bytes without a token are dropped, and so is every byte of a multi-byte symbol ("é" is
    // "Ã©" in GPT-2 code points, whose UTF-8 bytes are no one-byte tokens); there is no <unk>.
    EXPECT_EQ(tokenize(*segmenter, "zq"), (Ids{2}));
    EXPECT_EQ(tokenize(*segmenter, "z\xC3\xA9z"), (Ids{2, 2}));
}

TEST(BpeSegmenter, SpacesAndNewlinesUseGpt2CodePoints) {
    // " a" is "Ġa" to a GPT-2 vocabulary; "\n" is "Ċ".
    const Vocab vocab = tiny_vocab({"a", "\xC4\xA0",
                                    "\xC4\xA0"
                                    "a",
                                    "\xC4\x8A"},
                                   {"\xC4\xA0 a"}, "gpt-2");
    const auto segmenter = make_bpe_segmenter(vocab);
    EXPECT_EQ(tokenize(*segmenter, "a a\n"), (Ids{0, 2, 3}));
}

TEST(BpeSegmenter, LongInputIsFast) {
    const auto dir = test::vocab_dir();
    const Vocab vocab = load_vocab_with_pre(dir / "ggml-vocab-gpt-2.gguf", "llama-bpe");
    const auto segmenter = make_bpe_segmenter(vocab);
    std::string text;
    while (text.size() < 1'000'000) text += "The quick brown fox, 12345 times: jumps over the lazy dog!\n\t";
    const auto start = std::chrono::steady_clock::now();
    const Ids ids = tokenize(*segmenter, text);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GT(ids.size(), text.size() / 8);
    EXPECT_LT(seconds, 10.0) << ids.size() << " tokens";
}

}  // namespace
}  // namespace fitllm::tokenizer
