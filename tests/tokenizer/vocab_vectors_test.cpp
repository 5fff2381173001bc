// llama.cpp's tokenizer test vectors (tests/data/vocab/ggml-vocab-NAME.gguf.inp/.out):
// every input must give exactly the expected ids with add_special = false and
// parse_special = false, as llama.cpp's test-tokenizer-0 checks. One test per family.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <sstream>

#include "test_support.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::tokenizer {
namespace {

struct VectorCase {
    std::string input;
    std::vector<TokenId> expected;
};

std::string read_text(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The .inp file separates inputs with "\n__ggml_vocab_test__\n" (also after the last one);
// the .out file has one line of space-separated ids per input.
std::vector<VectorCase> read_cases(const std::filesystem::path& base) {
    const std::string raw = read_text(base.string() + ".inp");
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> inputs;
    for (size_t pos = 0; pos < raw.size();) {
        const size_t next = raw.find(sep, pos);
        if (next == std::string::npos) {
            inputs.push_back(raw.substr(pos));
            break;
        }
        inputs.push_back(raw.substr(pos, next - pos));
        pos = next + sep.size();
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
    EXPECT_EQ(cases.size(), inputs.size()) << base << ": .inp and .out disagree on the number of tests";
    return cases;
}

class VocabVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabVectors, TokenizeMatchesLlamaCpp) {
    const auto dir = test::vocab_dir();
    const auto base = dir / ("ggml-vocab-" + GetParam() + ".gguf");
    const auto file = gguf::GgufFile::open(base.string());
    const Tokenizer tok = Tokenizer::from_gguf(file);
    const auto cases = read_cases(base);
    ASSERT_GE(cases.size(), 40u);
    for (const VectorCase& c : cases) {
        SCOPED_TRACE("input: '" + c.input + "'");
        EXPECT_EQ(tok.tokenize(c.input, false, false), c.expected);
    }
}

// Where llama.cpp's llama_detokenize gives the input back, so must we: for SPM and BPE
// vocabularies the text comes back exactly, or as clean_spaces leaves it (" ?" -> "?").
// WPM lowercases and drops accents and whitespace, so it has nothing to round-trip.
TEST_P(VocabVectors, DetokenizeRoundTrips) {
    const auto dir = test::vocab_dir();
    const auto base = dir / ("ggml-vocab-" + GetParam() + ".gguf");
    const auto file = gguf::GgufFile::open(base.string());
    const Tokenizer tok = Tokenizer::from_gguf(file);
    if (tok.vocab().type() == VocabType::wpm) GTEST_SKIP() << "WPM normalizes its input";
    for (const VectorCase& c : read_cases(base)) {
        SCOPED_TRACE("input: '" + c.input + "'");
        const std::string want = tok.vocab().clean_spaces() ? clean_up_tokenization_spaces(c.input) : c.input;
        EXPECT_EQ(tok.detokenize(c.expected, false, false), want);
    }
}

// The streaming detokenizer gives the same text as detokenize(), token by token.
TEST_P(VocabVectors, StreamingDetokenizerMatchesDetokenize) {
    const auto dir = test::vocab_dir();
    const auto base = dir / ("ggml-vocab-" + GetParam() + ".gguf");
    const auto file = gguf::GgufFile::open(base.string());
    const Tokenizer tok = Tokenizer::from_gguf(file);
    for (const VectorCase& c : read_cases(base)) {
        SCOPED_TRACE("input: '" + c.input + "'");
        for (const bool add_special : {false, true}) {
            const std::vector<TokenId> ids = tok.tokenize(c.input, add_special, false);
            for (const bool remove_special : {false, true}) {
                Detokenizer stream(tok, remove_special, false);
                std::string streamed;
                for (TokenId id : ids) streamed += stream.feed(id);
                streamed += stream.flush();
                EXPECT_EQ(streamed, tok.detokenize(ids, remove_special, false));
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Families, VocabVectors,
                         ::testing::Values("llama-spm", "phi-3", "bert-bge", "gpt-2", "falcon", "deepseek-llm",
                                           "deepseek-coder", "starcoder", "refact", "mpt"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                             std::string name = param_info.param;
                             for (char& ch : name)
                                 if (ch == '-') ch = '_';
                             return name;
                         });

}  // namespace
}  // namespace fitllm::tokenizer
