// Pre-tokenizer splits: against Python's `regex` on tricky strings (goldens from
// tools/gen_pre_tokenizer_goldens.py), plus the places where llama.cpp departs from a plain
// regex engine. End-to-end ids from llama.cpp for every pre-tokenizer are in bpe_test.cpp.
#include "tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_support.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace fitllm::tokenizer {
namespace {

using Pieces = std::vector<std::string>;

constexpr PreTokenizerType kAllTypes[] = {
    PreTokenizerType::standard,       PreTokenizerType::llama3,     PreTokenizerType::qwen2,
    PreTokenizerType::gpt2,           PreTokenizerType::falcon,     PreTokenizerType::deepseek_llm,
    PreTokenizerType::deepseek_coder, PreTokenizerType::starcoder,  PreTokenizerType::bloom,
    PreTokenizerType::viking,         PreTokenizerType::tekken,     PreTokenizerType::gpt4o,
    PreTokenizerType::deepseek3,      PreTokenizerType::seed_coder, PreTokenizerType::qwen35,
};

Pieces split(PreTokenizerType type, std::string_view text) {
    return PreTokenizer(type).split_to_strings(text);
}

nlohmann::json load_goldens() {
    std::ifstream in(test::source_dir() / "tests" / "tokenizer" / "goldens" / "pre_tokenizer_splits.json");
    if (!in) throw std::runtime_error("missing tests/tokenizer/goldens/pre_tokenizer_splits.json");
    return nlohmann::json::parse(in);
}

// A golden case's input: "text", or "hex" for bytes that are not UTF-8.
std::string case_input(const nlohmann::json& c) {
    if (c.contains("text")) return c.at("text").get<std::string>();
    const std::string hex = c.at("hex");
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    return out;
}

TEST(PreTokenizerNames, MapsLlamaCppNames) {
    EXPECT_EQ(pre_tokenizer_type_for_name("default"), PreTokenizerType::standard);
    EXPECT_EQ(pre_tokenizer_type_for_name(""), PreTokenizerType::standard);
    EXPECT_EQ(pre_tokenizer_type_for_name("llama-bpe"), PreTokenizerType::llama3);
    EXPECT_EQ(pre_tokenizer_type_for_name("llama3"), PreTokenizerType::llama3);
    EXPECT_EQ(pre_tokenizer_type_for_name("dbrx"), PreTokenizerType::llama3);
    EXPECT_EQ(pre_tokenizer_type_for_name("qwen2"), PreTokenizerType::qwen2);
    EXPECT_EQ(pre_tokenizer_type_for_name("deepseek-r1-qwen"), PreTokenizerType::qwen2);
    EXPECT_EQ(pre_tokenizer_type_for_name("gpt-2"), PreTokenizerType::gpt2);
    EXPECT_EQ(pre_tokenizer_type_for_name("mpt"), PreTokenizerType::gpt2);
    EXPECT_EQ(pre_tokenizer_type_for_name("olmo"), PreTokenizerType::gpt2);
    EXPECT_EQ(pre_tokenizer_type_for_name("falcon"), PreTokenizerType::falcon);
    EXPECT_EQ(pre_tokenizer_type_for_name("deepseek-llm"), PreTokenizerType::deepseek_llm);
    EXPECT_EQ(pre_tokenizer_type_for_name("deepseek-coder"), PreTokenizerType::deepseek_coder);
    EXPECT_EQ(pre_tokenizer_type_for_name("starcoder"), PreTokenizerType::starcoder);
    EXPECT_EQ(pre_tokenizer_type_for_name("refact"), PreTokenizerType::starcoder);
    EXPECT_EQ(pre_tokenizer_type_for_name("smollm"), PreTokenizerType::starcoder);
    EXPECT_EQ(pre_tokenizer_type_for_name("command-r"), PreTokenizerType::starcoder);
    EXPECT_EQ(pre_tokenizer_type_for_name("poro-chat"), PreTokenizerType::bloom);
    EXPECT_EQ(pre_tokenizer_type_for_name("viking"), PreTokenizerType::viking);
    EXPECT_EQ(pre_tokenizer_type_for_name("grok-2"), PreTokenizerType::qwen2);
    EXPECT_EQ(pre_tokenizer_type_for_name("tekken"), PreTokenizerType::tekken);
    EXPECT_EQ(pre_tokenizer_type_for_name("llama4"), PreTokenizerType::gpt4o);
    EXPECT_EQ(pre_tokenizer_type_for_name("deepseek-v3"), PreTokenizerType::deepseek3);
    EXPECT_EQ(pre_tokenizer_type_for_name("seed-coder"), PreTokenizerType::seed_coder);
    EXPECT_EQ(pre_tokenizer_type_for_name("qwen35"), PreTokenizerType::qwen35);
}

TEST(PreTokenizerNames, UnknownNameIsAVocabErrorListingTheSupportedOnes) {
    try {
        pre_tokenizer_type_for_name("no-such-pre");
        FAIL() << "expected VocabError";
    } catch (const VocabError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("tokenizer.ggml.pre"), std::string::npos) << message;
        EXPECT_NE(message.find("'no-such-pre'"), std::string::npos) << message;
        for (const std::string_view name : supported_pre_tokenizer_names())
            EXPECT_NE(message.find(name), std::string::npos) << name;
    }
}

TEST(PreTokenizerNames, EveryNameBuildsAPreTokenizer) {
    for (const std::string_view name : supported_pre_tokenizer_names()) {
        const PreTokenizer pre(pre_tokenizer_type_for_name(name));
        EXPECT_FALSE(pre.split_to_strings("Hello world 123").empty()) << name;
    }
}

TEST(PreTokenizer, Llama3Examples) {
    EXPECT_EQ(split(PreTokenizerType::llama3, "Hello world"), (Pieces{"Hello", " world"}));
    EXPECT_EQ(split(PreTokenizerType::llama3, "1234567"), (Pieces{"123", "456", "7"}));
    EXPECT_EQ(split(PreTokenizerType::llama3, "I'M here"), (Pieces{"I", "'M", " here"}));
    // \s+(?!\S) leaves the last space to the word after it; \s*[\r\n]+ keeps the newlines.
    EXPECT_EQ(split(PreTokenizerType::llama3, "a   b"), (Pieces{"a", "  ", " b"}));
    EXPECT_EQ(split(PreTokenizerType::llama3, "a \n\n  b"), (Pieces{"a", " \n\n", " ", " b"}));
    EXPECT_EQ(split(PreTokenizerType::llama3, "x!!\n\ny"), (Pieces{"x", "!!\n\n", "y"}));
    EXPECT_EQ(split(PreTokenizerType::qwen2, "1234"), (Pieces{"1", "2", "3", "4"}));
}

TEST(PreTokenizer, Gpt2Examples) {
    EXPECT_EQ(split(PreTokenizerType::gpt2, "Hello world's 42!!"), (Pieces{"Hello", " world", "'s", " 42", "!!"}));
    EXPECT_EQ(split(PreTokenizerType::gpt2, "a  \n b"), (Pieces{"a", "  \n", " b"}));
    EXPECT_EQ(split(PreTokenizerType::gpt2, "end   "), (Pieces{"end", "   "}));
    EXPECT_EQ(split(PreTokenizerType::gpt2, "I'M"), (Pieces{"I", "'", "M"}));  // case-sensitive
}

TEST(PreTokenizer, ListsSplitInSequence) {
    // starcoder: single digits first, then GPT-2's pattern inside each remaining piece.
    EXPECT_EQ(split(PreTokenizerType::starcoder, "abc 123"), (Pieces{"abc", " ", "1", "2", "3"}));
    // falcon: punctuation runs first, then GPT-2's pattern, then groups of three ASCII digits.
    EXPECT_EQ(split(PreTokenizerType::falcon, "x, 12345"), (Pieces{"x", ",", " ", "123", "45"}));
    // default: the same, with number runs cut off their leading space first.
    EXPECT_EQ(split(PreTokenizerType::standard, "x 12345"), (Pieces{"x", " ", "123", "45"}));
}

TEST(PreTokenizer, MatchesPythonRegexGoldens) {
    const nlohmann::json goldens = load_goldens();
    const std::pair<std::string, PreTokenizerType> patterns[] = {
        {"llama3", PreTokenizerType::llama3}, {"qwen2", PreTokenizerType::qwen2}, {"gpt-2", PreTokenizerType::gpt2}};
    int checked = 0;
    for (const auto& [name, type] : patterns) {
        const PreTokenizer pre(type);
        for (const auto& c : goldens.at("cases")) {
            if (!c.contains("splits")) continue;
            const std::string text = c.at("text");
            EXPECT_EQ(pre.split_to_strings(text), c.at("splits").at(name).get<Pieces>()) << name << ": " << text;
            ++checked;
        }
    }
    EXPECT_GT(checked, 200);
}

TEST(PreTokenizer, PiecesCoverTheReencodedText) {
    const nlohmann::json goldens = load_goldens();
    for (const PreTokenizerType type : kAllTypes) {
        const PreTokenizer pre(type);
        for (const auto& c : goldens.at("cases")) {
            const std::string raw = case_input(c);
            const Pieces pieces = pre.split_to_strings(raw);
            std::string joined;
            for (const auto& piece : pieces) {
                EXPECT_FALSE(piece.empty()) << to_string(type);
                joined += piece;
            }
            EXPECT_EQ(joined, reencode_utf8_leniently(raw)) << to_string(type) << ": " << c.dump();
        }
    }
}

TEST(PreTokenizer, WhitespaceIsLlamaCppsSetNotPcre2s) {
    // U+180E (Mongolian vowel separator) is whitespace to PCRE2's \s but not to llama.cpp.
    EXPECT_EQ(split(PreTokenizerType::gpt2,
                    "a\xE1\xA0\x8E\xE1\xA0\x8E"
                    "b"),
              (Pieces{"a", "\xE1\xA0\x8E\xE1\xA0\x8E", "b"}));
    // U+001C..U+001F are whitespace to Python's str.isspace but not to llama.cpp either.
    EXPECT_EQ(split(PreTokenizerType::gpt2, "\x1C\x1D x"), (Pieces{"\x1C\x1D", " x"}));
    // U+3000 and U+00A0 are.
    EXPECT_EQ(split(PreTokenizerType::gpt2,
                    "a\xE3\x80\x80\xE3\x80\x80"
                    "b"),
              (Pieces{"a", "\xE3\x80\x80", "\xE3\x80\x80", "b"}));
}

TEST(PreTokenizer, DeepseekRangesSkipNonAsciiWhitespaceAsLlamaCppsStdRegexDoes) {
    // llama.cpp hands std::regex U+000B in place of U+3000, so the tokenizer's ranges
    // `　-。` and `ࠀ-一` never match the ideographic space itself.
    EXPECT_EQ(split(PreTokenizerType::deepseek_llm, "中文\xE3\x80\x80中文"), (Pieces{"中文", "\xE3\x80\x80", "中文"}));
    EXPECT_EQ(split(PreTokenizerType::deepseek_llm, "。\xE3\x80\x80。"), (Pieces{"。", "\xE3\x80\x80", "。"}));
    EXPECT_EQ(split(PreTokenizerType::deepseek_coder, "字\xE1\x9A\x80字"), (Pieces{"字", "\xE1\x9A\x80", "字"}));
}

TEST(PreTokenizer, DeepseekTrailingWhitespaceRule) {
    EXPECT_EQ(split(PreTokenizerType::deepseek_llm, "x1   "), (Pieces{"x", "1", "   "}));
    EXPECT_EQ(split(PreTokenizerType::deepseek_llm, "   1"), (Pieces{"   ", "1"}));
}

TEST(PreTokenizer, MalformedUtf8IsReadAsLlamaCppReadsIt) {
    EXPECT_EQ(split(PreTokenizerType::gpt2,
                    "a\x80"
                    "b"),
              (Pieces{"a", "\xEF\xBF\xBD", "b"}));
    // A surrogate stays its three bytes and is neither letter, number nor whitespace.
    EXPECT_EQ(split(PreTokenizerType::gpt2, "x\xED\xA0\x80 y"), (Pieces{"x", "\xED\xA0\x80", " y"}));
    EXPECT_EQ(split(PreTokenizerType::llama3, "\xED\xA0\x80y"), (Pieces{"\xED\xA0\x80y"}));
}

TEST(PreTokenizer, EmptyTextHasNoPieces) {
    for (const PreTokenizerType type : kAllTypes) EXPECT_TRUE(split(type, "").empty()) << to_string(type);
}

TEST(PreTokenizer, LongRunsTakeLinearTime) {
    // Long runs of one kind of character, where a backtracking engine could go quadratic or
    // exhaust PCRE2's JIT stack (tekken's and gpt-4o's letter groups repeat a group per letter).
    const std::string spaces(1'000'000, ' ');
    std::string mixed_case;
    while (mixed_case.size() < 1'000'000) mixed_case += "aAbBcC\xC3\xA9\xC3\x89";
    const std::string texts[] = {spaces + "x",
                                 spaces + "1",
                                 "x" + spaces,
                                 spaces + "\n" + spaces + "!",
                                 std::string(1'000'000, 'a'),
                                 mixed_case,
                                 std::string(1'000'000, '7'),
                                 std::string(1'000'000, '!')};
    const auto start = std::chrono::steady_clock::now();
    for (const PreTokenizerType type : kAllTypes) {
        const PreTokenizer pre(type);
        for (const std::string& text : texts) {
            size_t total = 0;
            for (const auto& piece : pre.split_to_strings(text)) total += piece.size();
            EXPECT_EQ(total, text.size()) << to_string(type);
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 20.0);  // quadratic behaviour would take hours
}

TEST(PreTokenizer, SplitIsThreadSafe) {
    const PreTokenizer pre(PreTokenizerType::llama3);
    std::string text;
    for (int i = 0; i < 200; ++i) text += "Hello, world! It's 12345 o'clock\n\n  tabs\tand 中文 🦙 ";
    const Pieces expected = pre.split_to_strings(text);
    std::vector<std::thread> threads;
    std::vector<int> mismatches(8, 0);
    for (size_t t = 0; t < mismatches.size(); ++t) {
        threads.emplace_back([&, t] {
            for (int round = 0; round < 20; ++round) mismatches[t] += pre.split_to_strings(text) != expected;
        });
    }
    for (auto& thread : threads) thread.join();
    for (const int m : mismatches) EXPECT_EQ(m, 0);
}

}  // namespace
}  // namespace fitllm::tokenizer
