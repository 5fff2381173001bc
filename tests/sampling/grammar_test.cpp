// GBNF parsing (good, bad and hostile grammars), the matcher, the vocabulary masks and the
// Sampler drawing under a grammar.
#include "sampling/grammar.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace fitllm::sampling {
namespace {

std::shared_ptr<const GrammarVocab> tiny_vocab(std::vector<std::string> texts, std::vector<int32_t> eog = {}) {
    return std::make_shared<GrammarVocab>(texts, std::move(eog));
}

// A matcher over a vocabulary of single bytes (enough to check text acceptance).
GrammarMatcher matcher(const std::string& gbnf) {
    std::vector<std::string> texts;
    for (int b = 0; b < 256; ++b) texts.emplace_back(1, static_cast<char>(b));
    return GrammarMatcher(Grammar::parse(gbnf), tiny_vocab(texts));
}

// Whether the whole text is a sentence of the grammar.
bool matches(const std::string& gbnf, const std::string& text) {
    GrammarMatcher m = matcher(gbnf);
    if (!m.allows_text(text)) return false;
    m.accept_text(text);
    return m.can_end();
}

std::string error_of(const std::string& gbnf) {
    try {
        Grammar::parse(gbnf);
    } catch (const GrammarError& e) {
        return e.what();
    }
    return "";
}

TEST(GrammarParse, LiteralsClassesGroupsRepetition) {
    const std::string g = R"(
        # a comment
        root ::= "a" [b-d]+ ("x" | "y")? rest   # trailing comment
        rest ::= [^\n0-9]{2,3} "\x21\u00e9"
    )";
    EXPECT_TRUE(matches(g, "abbxzz!\xC3\xA9"));
    EXPECT_TRUE(matches(g, "adzzz!\xC3\xA9"));
    EXPECT_FALSE(matches(g, "a!!!\xC3\xA9"));      // needs [b-d]+
    EXPECT_FALSE(matches(g, "abz!\xC3\xA9"));      // {2,3}: one is too few
    EXPECT_FALSE(matches(g, "abzzzz!\xC3\xA9"));   // four is too many
    EXPECT_FALSE(matches(g, "abz1!\xC3\xA9"));     // digit excluded
    EXPECT_FALSE(matches(g, "abxyzzz!\xC3\xA9"));  // "yzzz": four is too many
}

TEST(GrammarParse, MultiLineAlternativesAndExactCounts) {
    const std::string g = "root ::=\n  \"a\"\n  | \"b\" [0-9]{3}\n  | x\nx ::= \"\" | \"c\"*\n";
    EXPECT_TRUE(matches(g, "a"));
    EXPECT_TRUE(matches(g, "b123"));
    EXPECT_FALSE(matches(g, "b12"));
    EXPECT_TRUE(matches(g, ""));
    EXPECT_TRUE(matches(g, "cccc"));
    EXPECT_FALSE(matches(g, "ca"));
}

TEST(GrammarParse, DotAndUnicodeRanges) {
    const std::string g = "root ::= . [α-ω]";
    EXPECT_TRUE(matches(g, "xβ"));
    EXPECT_TRUE(matches(g, "\xE2\x82\xAC\xCE\xB1"));  // € α
    EXPECT_FALSE(matches(g, "xb"));
}

TEST(GrammarParse, ErrorsNameLineAndColumn) {
    EXPECT_EQ(error_of("root ::= \"a\"\nfoo ::= bar"), "grammar: line 2, column 9: rule 'bar' is not defined");
    EXPECT_EQ(error_of("root ::= \"abc"), "grammar: line 1, column 10: unterminated string literal");
    EXPECT_EQ(error_of("root ::= [a-"), "grammar: line 1, column 10: unterminated character class");
    EXPECT_EQ(error_of("root ::= (\"a\""), "grammar: line 1, column 10: '(' is never closed");
    EXPECT_EQ(error_of("item ::= \"a\""), "grammar: line 1, column 1: no 'root' rule (where a text starts)");
    EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""), "grammar: line 2, column 1: rule 'root' is defined twice");
    EXPECT_EQ(error_of("root ::= \"a\" {2,1}"), "grammar: line 1, column 14: repetition {2,1}: max < min");
    EXPECT_EQ(error_of("root ::= \"\\q\""), "grammar: line 1, column 11: unknown escape '\\q'");
    EXPECT_EQ(error_of("root ::= \"a\" )"), "grammar: line 1, column 14: unexpected ')' with no '(' open");
    EXPECT_EQ(error_of("root ::= @"), "grammar: line 1, column 10: unexpected character '@'");
    EXPECT_EQ(error_of("root = \"a\""), "grammar: line 1, column 6: expected '::=' after the rule name 'root'");
    EXPECT_EQ(error_of(""),
              "grammar: line 1, column 1: the grammar is empty (it needs at least a 'root ::= ...' rule)");
    EXPECT_EQ(error_of("root ::= [z-a]"), "grammar: line 1, column 11: character range with its end before its start");
    EXPECT_EQ(error_of("root ::= <[12]>"),
              "grammar: line 1, column 10: token references by id (<[id]>) are not supported: name the token by its "
              "text");
    EXPECT_EQ(error_of("root ::= <think"), "grammar: line 1, column 10: token reference '<' is never closed by '>'");
    EXPECT_EQ(error_of("root ::= <>"),
              "grammar: line 1, column 10: a token reference names a token's text, 1 to 128 bytes between '<' and '>'");
    EXPECT_EQ(error_of("root ::= \"a\"**"),
              "grammar: line 1, column 14: two repetition operators in a row (use a group: (x*)?)");
}

TEST(GrammarParse, LeftRecursionIsRefused) {
    EXPECT_NE(error_of("root ::= root \"a\" | \"b\"").find("rule 'root' is left-recursive (root -> root)"),
              std::string::npos);
    EXPECT_NE(error_of("root ::= x\nx ::= y? root \"a\"\ny ::= \"b\"").find("left-recursive"), std::string::npos);
    EXPECT_NE(error_of("root ::= (\"\")*").find("left-recursive"), std::string::npos);
    // Right recursion is fine.
    EXPECT_TRUE(matches("root ::= \"a\" root | \"b\"", "aaab"));
}

TEST(GrammarParse, HostileGrammarsHitLimitsNotMemory) {
    // Deep nesting.
    std::string deep = "root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')');
    EXPECT_NE(error_of(deep).find("nested deeper than 64"), std::string::npos);
    // A repetition count past the limit.
    EXPECT_NE(error_of("root ::= \"a\"{0,99999999999}").find("over the limit"), std::string::npos);
    // Repetitions that multiply into tens of thousands of rules.
    EXPECT_NE(error_of("root ::= ((\"ab\"{0,10000}){0,10000}){0,10000}").find("rules"), std::string::npos);
    // A literal too long to compile.
    EXPECT_NE(error_of("root ::= \"" + std::string(600000, 'a') + "\"").find("elements"), std::string::npos);
    // Too many rules.
    std::string many;
    for (int i = 0; i < 20005; ++i) many += "r" + std::to_string(i) + " ::= \"a\"\n";
    EXPECT_NE(error_of("root ::= \"a\"\n" + many).find("rules"), std::string::npos);
    // Text too large.
    EXPECT_NE(error_of(std::string(kMaxGrammarBytes + 1, ' ')).find("over the limit"), std::string::npos);
    // Wildly ambiguous: the number of parse stacks is capped (an error, not memory).
    GrammarMatcher m = matcher("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"\"");
    EXPECT_THROW(
        {
            for (int i = 0; i < 200; ++i) m.accept_text("a");
        },
        GrammarError);
    // A stack that grows with the text is capped too.
    GrammarMatcher nest = matcher("root ::= \"(\" root \")\" | \"x\"");
    EXPECT_THROW(nest.accept_text(std::string(5000, '(')), GrammarError);
}

TEST(GrammarParse, RandomBytesNeverCrash) {
    std::mt19937 rng(7);
    const std::string alphabet = "root ::=\"[]()|*+?{},-^\\ax#\n.";
    for (int i = 0; i < 3000; ++i) {
        std::string text;
        const int n = static_cast<int>(rng() % 40);
        for (int k = 0; k < n; ++k) text += alphabet[rng() % alphabet.size()];
        try {
            auto g = Grammar::parse(text);
            GrammarMatcher m(g, tiny_vocab({"a", "(", ")", "x"}));
            (void)m.allows_text("a(x)");
        } catch (const GrammarError&) {
        }
    }
}

TEST(GrammarMatcher, PartialUtf8AcrossTokens) {
    // Token 0 is the first byte of "é" (C3 A9), token 1 its second byte.
    auto vocab = tiny_vocab({"\xC3", "\xA9", "a", "\xC3\xA8"}, {});
    GrammarMatcher m(Grammar::parse("root ::= \"é\" \"a\""), vocab);
    EXPECT_TRUE(m.allows_token(0));
    EXPECT_FALSE(m.allows_token(1));  // a lone continuation byte
    EXPECT_FALSE(m.allows_token(3));  // è
    m.accept_token(0);
    EXPECT_FALSE(m.can_end());
    EXPECT_TRUE(m.allows_token(1));
    EXPECT_FALSE(m.allows_token(2));
    m.accept_token(1);
    m.accept_token(2);
    EXPECT_TRUE(m.can_end());
    EXPECT_TRUE(m.must_end());
}

TEST(GrammarMatcher, MaskMatchesTokenByTokenChecks) {
    // A vocabulary with shared prefixes, an EOG token (5) and an empty (control) token (6).
    std::vector<std::string> texts = {"{",  "{\"", "\"",  "a",     "ab", "",   "",   "}",  "\"}", ":",   " ",      "1",
                                      "12", "x",   "\"a", "\"a\"", ": ", "1}", "{}", "aa", "b",   "\"b", "\"ab\":"};
    auto vocab = tiny_vocab(texts, {5});
    const std::string g =
        "root ::= \"{\" (pair (\",\" pair)*)? \"}\"\npair ::= \"\\\"\" [ab]+ \"\\\"\" \":\" \" \"? [0-9]+";
    GrammarMatcher m(Grammar::parse(g), vocab);
    std::mt19937 rng(3);
    for (int step = 0; step < 40 && !m.must_end(); ++step) {
        const std::vector<uint64_t> mask = m.allowed_tokens();
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < vocab->size(); ++id) {
            const bool bit = (mask[size_t(id) >> 6] >> (id & 63)) & 1;
            ASSERT_EQ(bit, m.allows_token(id)) << "token " << id << " step " << step;
            if (bit) allowed.push_back(id);
        }
        ASSERT_FALSE(allowed.empty());
        EXPECT_FALSE((mask[0] >> 6) & 1);  // the empty token never
        const int32_t pick = allowed[rng() % allowed.size()];
        if (pick == 5) break;
        m.accept_token(pick);
    }
    // A second look at the same state comes from the cache.
    (void)m.allowed_tokens();
    const uint64_t hits = m.cache_hits();
    (void)m.allowed_tokens();
    EXPECT_EQ(m.cache_hits(), hits + 1);
}

TEST(GrammarMatcher, RejectsWhatTheGrammarDoesNot) {
    auto vocab = tiny_vocab({"a", "b", "end"}, {2});
    GrammarMatcher m(Grammar::parse("root ::= \"a\" \"b\"?"), vocab);
    EXPECT_FALSE(m.allows_token(2));  // EOG before the grammar may end
    EXPECT_THROW(m.accept_token(1), GrammarError);
    m.accept_token(0);
    EXPECT_TRUE(m.allows_token(2));
    EXPECT_TRUE(m.can_end());
    EXPECT_FALSE(m.must_end());
    m.accept_token(1);
    EXPECT_TRUE(m.must_end());
    const auto& mask = m.allowed_tokens();
    EXPECT_EQ(mask[0], uint64_t{1} << 2);  // only the end
    // A grammar the vocabulary cannot spell.
    GrammarMatcher z(Grammar::parse("root ::= \"z\""), vocab);
    EXPECT_THROW(z.allowed_tokens(), GrammarError);
}

// A token reference (<|channel|>) is that special token alone: text that spells it with other
// tokens is refused, the token is in the mask only where the reference may come, whether or not
// it ends the generation, and a reference to a token the vocabulary lacks is refused by name.
TEST(GrammarMatcher, TokenReferencesMatchOnlyTheirToken) {
    // 0..6: "<", "|", "c", "|>", "<|c|>" (a user-defined token, its text shown), "x", "<|call|>"
    // (a control token that ends the generation: no text).
    const std::vector<std::string> texts = {"<", "|", "c", "|>", "<|c|>", "x", ""};
    auto vocab = std::make_shared<GrammarVocab>(
        texts, std::vector<int32_t>{6}, std::vector<std::pair<std::string, int32_t>>{{"<|c|>", 4}, {"<|call|>", 6}});
    EXPECT_EQ(vocab->special_token("<|c|>"), 4);
    EXPECT_EQ(vocab->special_token("<|cal|>"), -1);
    const auto g = Grammar::parse("root ::= <|c|> \"x\"* <|call|>");
    ASSERT_EQ(g->tokens(), (std::vector<std::string>{"<|c|>", "<|call|>"}));
    GrammarMatcher m(g, vocab);
    EXPECT_FALSE(m.allows_text("<|c|>"));  // spelled, by the token's own text or by others
    EXPECT_FALSE(m.allows_token(0));
    EXPECT_FALSE(m.allows_token(6));      // not yet the end
    EXPECT_FALSE(m.allows_text("\xF4"));  // a UTF-8 lead byte of code points near the references'
    EXPECT_TRUE(m.allows_token(4));
    EXPECT_EQ(m.allowed_tokens()[0], uint64_t{1} << 4);
    m.accept_token(4);
    EXPECT_FALSE(m.can_end());
    EXPECT_EQ(m.allowed_tokens()[0], (uint64_t{1} << 5) | (uint64_t{1} << 6));
    m.accept_token(5);
    EXPECT_THROW(m.accept_token(4), GrammarError);
    EXPECT_TRUE(m.allows_token(6));
    m.accept_token(6);
    EXPECT_TRUE(m.must_end());
    // Beside text: the same token where text is allowed too, and the spelled form as text.
    GrammarMatcher both(Grammar::parse("root ::= (<|c|> | \"<|c\") \"x\""), vocab);
    EXPECT_EQ(both.allowed_tokens()[0], (uint64_t{1} << 0) | (uint64_t{1} << 4));
    both.accept_token(0);
    EXPECT_EQ(both.allowed_tokens()[0], uint64_t{1} << 1);
    // A token the vocabulary lacks, or has as ordinary text only.
    try {
        GrammarMatcher missing(Grammar::parse("root ::= <|end|>"), vocab);
        ADD_FAILURE() << "a reference to a missing token was accepted";
    } catch (const GrammarError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "grammar: the token reference <|end|> names no control or user-defined token of the model's "
                  "vocabulary");
    }
    EXPECT_THROW(GrammarMatcher(Grammar::parse("root ::= <x>"), tiny_vocab({"<x>"})), GrammarError);
}

TEST(GrammarSampler, EveryDrawFollowsTheGrammar) {
    std::vector<std::string> texts;
    for (const char* t : {"0", "1", "2", "9", "10", "-", ",", "[", "]", "[1", "1]", "x", "abc", " ", "", "00"})
        texts.emplace_back(t);
    auto vocab = tiny_vocab(texts, {14});
    auto grammar =
        Grammar::parse("root ::= \"[\" (num (\",\" num)*)? \"]\"\nnum ::= \"-\"? ([1-9] [0-9]{0,2} | \"0\")");
    for (uint64_t seed = 1; seed <= 30; ++seed) {
        SamplingParams p;
        p.temperature = 1.5f;
        p.top_k = 0;
        p.top_p = 1.0f;
        p.min_p = 0.0f;
        p.seed = seed;
        p.grammar = grammar;
        p.grammar_vocab = vocab;
        Sampler sampler(p, vocab->size());
        std::mt19937 rng(static_cast<uint32_t>(seed));
        std::normal_distribution<float> normal(0.0f, 2.0f);
        std::string out;
        bool ended = false;
        for (int i = 0; i < 200 && !ended; ++i) {
            std::vector<float> logits(texts.size());
            for (float& l : logits) l = normal(rng);
            const TokenId t = sampler.sample(logits);
            if (t == 14) {
                ended = true;
            } else {
                out += texts[size_t(t)];
            }
        }
        ASSERT_TRUE(ended) << out;
        EXPECT_TRUE(matches("root ::= \"[\" (num (\",\" num)*)? \"]\"\nnum ::= \"-\"? ([1-9] [0-9]{0,2} | \"0\")", out))
            << out;
    }
}

TEST(GrammarSampler, GreedyTakesTheBestAllowedToken) {
    auto vocab = tiny_vocab({"a", "b", "c", "<eos>"}, {3});
    SamplingParams p;
    p.temperature = 0.0f;
    p.grammar = Grammar::parse("root ::= [bc]");
    p.grammar_vocab = vocab;
    Sampler sampler(p, 4);
    EXPECT_EQ(sampler.sample(std::vector<float>{5.0f, 1.0f, 2.0f, 9.0f}), 2);
    EXPECT_EQ(sampler.sample(std::vector<float>{5.0f, 1.0f, 2.0f, 0.0f}), 3);  // only the end is left
    p.grammar_vocab.reset();
    EXPECT_THROW(Sampler(p, 4), SamplingError);
    // A grammar that fails at its start (rule references nested past the limit) is a SamplingError.
    std::string chain = "root ::= r0\n";
    for (int i = 0; i < 600; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
    chain += "r600 ::= \"a\"\n";
    p.grammar = Grammar::parse(chain);
    p.grammar_vocab = vocab;
    EXPECT_THROW(Sampler(p, 4), SamplingError);
}

}  // namespace
}  // namespace fitllm::sampling
