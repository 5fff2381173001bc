// Prompts refused by their size before they are tokenized whole: the bound (no token stands for
// more bytes than the longest piece of its vocabulary) holds on every kind of text for the test
// vocabularies and the demo model, counting in pieces agrees with tokenizing whole within the
// allowance per cut, what fits is tokenized exactly as Tokenizer::tokenize does, and the
// tokenizer's work is charged to the request's memory.
#include "server/prompt_bounds.h"

#include <gtest/gtest.h>

#include <random>

#include "gguf/gguf_reader.h"
#include "memory/device.h"
#include "server/api_error.h"
#include "test_support.h"

namespace fitllm::server {
namespace {

std::vector<std::filesystem::path> models() {
    std::vector<std::filesystem::path> out = {test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf",
                                              test::source_dir() / "tests/model/data/tiny-qwen2-q8_0.gguf"};
    if (const auto demo = test::demo_model()) out.push_back(*demo);
    return out;
}

tokenizer::Tokenizer load(const std::filesystem::path& path) {
    const gguf::GgufFile file = gguf::GgufFile::open(path.string());
    return tokenizer::Tokenizer::from_gguf(file);
}

// Words, letters without spaces, random bytes (invalid UTF-8 too), specials spelled out, CJK.
std::vector<std::string> texts(size_t bytes) {
    std::mt19937 rng(7);
    const char* words[] = {"hello",         "world", "the",    "fox", "\n",    "  ", "<start_of_turn>",
                           "<|endoftext|>", "<s>",   "日本語", "ß",   "=====", "\t", "0123456789",
                           "</s>",          "<unk>"};
    std::vector<std::string> out(4);
    while (out[0].size() < bytes) out[0] += std::string(words[rng() % 16]) + " ";
    while (out[1].size() < bytes) out[1] += static_cast<char>('a' + rng() % 26);
    while (out[2].size() < bytes) out[2] += static_cast<char>(rng() % 255 + 1);
    while (out[3].size() < bytes) out[3] += words[rng() % 16];
    return out;
}

TEST(PromptBounds, NoTokenStandsForMoreThanTheLongestPiece) {
    for (const auto& path : models()) {
        const tokenizer::Tokenizer tok = load(path);
        const size_t longest = longest_token_bytes(tok);
        ASSERT_GE(longest, 4u) << path;
        for (const std::string& text : texts(20000)) {
            for (const bool parse_special : {false, true}) {
                const size_t n = tok.tokenize(text, false, parse_special).size();
                EXPECT_GE(n * longest, text.size()) << path << ": " << n << " tokens of at most " << longest
                                                    << " bytes each for " << text.size() << " bytes";
            }
        }
    }
}

TEST(PromptBounds, CountingInPiecesAgreesWithTokenizingWhole) {
    for (const auto& path : models()) {
        const tokenizer::Tokenizer tok = load(path);
        for (const std::string& text : texts(5 * kCountPieceBytes + 777)) {
            const size_t whole = tok.tokenize(text, false, true).size();
            // Just under the whole count: counted in pieces, it must not be refused by the count
            // of the pieces alone (it is tokenized whole and found over by one token).
            const BoundedTokens under = tokenize_within(tok, text, false, true, whole - 1, 0, nullptr);
            EXPECT_TRUE(under.over) << path;
            EXPECT_EQ(under.at_least, whole) << path << ": refused by the pieces' count, not by the whole";
            const BoundedTokens fits = tokenize_within(tok, text, false, true, whole, 0, nullptr);
            EXPECT_FALSE(fits.over) << path;
            EXPECT_EQ(fits.ids, tok.tokenize(text, false, true)) << path;
        }
    }
}

TEST(PromptBounds, RefusedBySizeOrByCount) {
    const tokenizer::Tokenizer tok = load(test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf");
    const size_t longest = longest_token_bytes(tok);
    // Over max_tokens x longest bytes: refused without tokenizing.
    const std::string big(100 * longest + 1, 'a');
    BoundedTokens t = tokenize_within(tok, big, true, true, 100, longest, nullptr);
    EXPECT_TRUE(t.over && t.by_size);
    EXPECT_EQ(t.at_least, 101u);
    // Within the size bound but far over by count: refused while counting in pieces.
    std::string words;
    while (words.size() < 8 * kCountPieceBytes) words += "the fox ";
    const size_t max_tokens = words.size() / longest + 1;  // the size alone does not refuse it
    t = tokenize_within(tok, words, true, true, max_tokens, longest, nullptr);
    EXPECT_TRUE(t.over);
    EXPECT_FALSE(t.by_size);
    EXPECT_GT(t.at_least, max_tokens);
    EXPECT_TRUE(t.ids.empty());
    // What fits: exactly the tokenizer's ids, specials added.
    t = tokenize_within(tok, "Once upon a time", true, true, 100, longest, nullptr);
    EXPECT_FALSE(t.over);
    EXPECT_EQ(t.ids, tok.tokenize("Once upon a time", true, true));
}

TEST(PromptBounds, TheTokenizersWorkIsCharged) {
    const tokenizer::Tokenizer tok = load(test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf");
    memory::Device device("host", 1 << 20);
    memory::Pool& pool = device.pool(kRequestPool);
    {
        RequestMemory memory(&pool);
        const std::string text(4096, 'a');  // 4096 x 96 bytes of work: fits 1 MiB
        EXPECT_FALSE(tokenize_within(tok, text, true, true, 100000, 0, &memory).over);
        EXPECT_EQ(pool.peak(), text.size() * kTokenizeBytesPerByte);
    }
    EXPECT_EQ(pool.live(), 0u);
    RequestMemory memory(&pool);
    try {
        tokenize_within(tok, std::string(20000, 'a'), true, true, 100000, 0, &memory);
        FAIL() << "20000 bytes of text need more work memory than the 1 MiB budget";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.status(), 413);
        EXPECT_EQ(e.code(), "request_too_large");
    }
    // When other requests hold the room: 503, try again.
    memory::Charge other = pool.charge(900 << 10, "another request");
    try {
        tokenize_within(tok, std::string(2000, 'a'), true, true, 100000, 0, &memory);
        FAIL() << "the budget's room is held by another request";
    } catch (const ApiError& e) {
        EXPECT_EQ(e.status(), 503);
        EXPECT_EQ(e.code(), "over_budget");
    }
}

}  // namespace
}  // namespace fitllm::server
