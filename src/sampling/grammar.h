#pragma once
// Constrained sampling with a formal grammar in llama.cpp's GBNF syntax:
//
//   root   ::= "{" ws pair ("," ws pair)* "}"      # rules; `root` is where a text starts
//   pair   ::= [a-z]+ ":" ws ("true" | "false")    # literals, classes, groups, alternation
//   ws     ::= [ \t\n]{0,4}                          # repetition: * + ? {m} {m,} {m,n}
//   call   ::= <|channel|> "commentary" <|message|>  # a special token, by its text
//
// A Grammar is parsed and compiled once (immutable, shared between requests); a GrammarMatcher
// follows one generation through it with a set of parse stacks (the grammar's positions the text so
// far may be at; a pushdown automaton run breadth first, as llama.cpp's grammar sampler does).
// Text is matched by Unicode code points; a token may end inside a UTF-8 sequence and the next one
// completes it.
//
// Tokens are checked against a GrammarVocab: the vocabulary's token texts sorted, so that a walk
// over all of them shares the work of common prefixes (a trie without nodes: each token keeps the
// state of the prefix it shares with the previous one). The mask of the tokens a state allows is
// cached per state (bounded), so a state the generation comes back to (inside a string, between
// list items) costs one look-up.
//
// A token reference <...> matches that one token of the vocabulary (its text, brackets included,
// is a control or user-defined token's: GrammarVocab::special_token), never text that spells it
// with other tokens: the k-th distinct reference is compiled as the code point kTokenCodePoint + k,
// past Unicode, which no UTF-8 text reaches; the matcher advances by it when that token is drawn.
// A grammar naming a token the vocabulary does not have as a special token is refused when a
// matcher is made for that vocabulary. (gpt-oss's harmony markers <|channel|>, <|message|>, ...)
//
// Limits, so that a hostile grammar cannot crash the process or take its memory: at most
// kMaxGrammarBytes of text, kMaxRules rules, kMaxElements compiled elements, kMaxNesting nested
// groups, repetition counts up to kMaxRepeat; left recursion is refused when compiling (it would
// never end); at run time at most kMaxStacks parse stacks of kMaxStackDepth entries (more: an
// error, never unbounded memory). A matcher's mask cache holds at most kMaskCacheBytes; all it
// holds is at most GrammarMatcher::memory_bound() (what the server charges a request for).
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fitllm/error.h"

namespace fitllm::tokenizer {
class Tokenizer;
}

namespace fitllm::sampling {

// A grammar that cannot be parsed or used: the message names the line and column, or the rule.
class GrammarError : public Error {
public:
    using Error::Error;
};

inline constexpr size_t kMaxGrammarBytes = size_t{1} << 20;
inline constexpr size_t kMaxRules = 20000;
inline constexpr size_t kMaxElements = 500000;
inline constexpr int kMaxNesting = 64;
inline constexpr uint32_t kMaxRepeat = 10000;
inline constexpr size_t kMaxStacks = 1024;
inline constexpr size_t kMaxStackDepth = 1024;
inline constexpr size_t kMaxStateEntries = 4096;  // all stacks of a state together
inline constexpr int kMaxExpandDepth = 512;       // rule references followed before a character
inline constexpr size_t kMaskCacheBytes = size_t{4} << 20;
inline constexpr size_t kWalkStates = 2048;  // states the mask walk memoizes
inline constexpr size_t kWalkEntries = size_t{1} << 17;
inline constexpr uint32_t kTokenCodePoint = 0x110000;  // token reference k: this + k
inline constexpr size_t kMaxTokenRefs = 256;           // distinct token references in a grammar
inline constexpr size_t kMaxTokenText = 128;           // bytes between a reference's < and >

class Grammar {
public:
    // Parses and compiles GBNF text. Throws GrammarError ("grammar: line 3, column 7: ...") for
    // bad syntax, an undefined rule, a missing root, a rule defined twice, left recursion, or a
    // limit passed.
    static std::shared_ptr<const Grammar> parse(std::string_view text);

    enum class Kind : uint8_t { end, chars, ref };
    struct Element {
        Kind kind;
        uint32_t value;  // chars: class index; ref: rule index
    };
    // A set of code points: sorted, disjoint inclusive ranges (a negated class is stored as its
    // complement), and a bitmap of its ASCII members for the common case.
    struct CharClass {
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        uint64_t ascii[2] = {0, 0};
        bool contains(uint32_t cp) const;
        bool intersects(uint32_t lo, uint32_t hi) const;
    };

    // Each rule's alternatives: indexes into elements() of their first element; an alternative
    // runs to the next Kind::end.
    const std::vector<std::vector<uint32_t>>& rules() const { return rules_; }
    const std::vector<Element>& elements() const { return elements_; }
    const std::vector<CharClass>& classes() const { return classes_; }
    const std::string& rule_name(size_t rule) const { return names_[rule]; }
    // The texts of the tokens referenced (<|channel|>): reference k is code point kTokenCodePoint + k.
    const std::vector<std::string>& tokens() const { return tokens_; }
    uint32_t root() const { return root_; }
    // What the compiled grammar holds, in bytes.
    uint64_t memory_bytes() const;

private:
    friend class GrammarCompiler;
    std::vector<std::vector<uint32_t>> rules_;
    std::vector<std::string> names_;
    std::vector<Element> elements_;
    std::vector<CharClass> classes_;
    std::vector<std::string> tokens_;
    uint32_t root_ = 0;
};

// The vocabulary as the grammar sees it: each token's bytes (as it is detokenized in generated
// text), sorted, with the end-of-generation tokens apart. Control and other empty tokens are
// never allowed by a grammar; end-of-generation tokens only where the grammar may end.
class GrammarVocab {
public:
    // texts[id]: the bytes of token id ("" for a token a grammar never allows); eog: the
    // end-of-generation ids; specials: the control and user-defined tokens by their text, which a
    // grammar's token references (<|channel|>) name.
    GrammarVocab(const std::vector<std::string>& texts, std::vector<int32_t> eog,
                 std::vector<std::pair<std::string, int32_t>> specials = {});
    // From a tokenizer: each token as token_to_piece(id, special=false) gives it (control and
    // unknown tokens: ""), its end-of-generation tokens, its control and user-defined tokens by
    // their text. Build it once per model and share it.
    static std::shared_ptr<const GrammarVocab> from_tokenizer(const tokenizer::Tokenizer& tokenizer);

    int32_t size() const { return n_vocab_; }
    std::string_view text(int32_t id) const {
        return {bytes_.data() + offsets_[size_t(id)], offsets_[size_t(id) + 1] - offsets_[size_t(id)]};
    }
    bool is_eog(int32_t id) const;
    size_t longest() const { return longest_; }  // the longest token text, in bytes
    const std::vector<int32_t>& eog() const { return eog_; }
    // The id of the control or user-defined token with this text, or -1.
    int32_t special_token(std::string_view text) const;
    uint64_t memory_bytes() const;

private:
    friend class GrammarMatcher;
    int32_t n_vocab_ = 0;
    std::string bytes_;              // every token's text, by id
    std::vector<uint32_t> offsets_;  // n_vocab + 1
    std::vector<int32_t> sorted_;    // ids of non-empty tokens in byte order of their texts
    std::vector<uint16_t> lcp_;      // lcp_[i]: common prefix of sorted_[i-1] and sorted_[i] (capped)
    std::vector<int32_t> eog_;       // sorted
    std::vector<std::pair<std::string, int32_t>> specials_;  // sorted by text
    size_t longest_ = 0;
};

class GrammarMatcher {
public:
    // Throws GrammarError when the grammar references a token the vocabulary has not as a special
    // token.
    GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const GrammarVocab> vocab);
    // The most heap memory a matcher of this grammar over this vocabulary holds (the grammar, the
    // mask cache, the walk's states and buffers), by the limits above.
    static uint64_t memory_bound(const Grammar& grammar, const GrammarVocab& vocab);

    // Whether the text may follow what was accepted so far (a prefix of a sentence of the grammar).
    bool allows_text(std::string_view text);
    // Whether the token may come next (an end-of-generation token: when the grammar may end; a
    // token the grammar references: where the reference may come, whether it ends the generation
    // or not).
    bool allows_token(int32_t id);
    // Advances by the token. Throws GrammarError when the grammar does not allow it.
    void accept_token(int32_t id);
    // Advances by text. Throws GrammarError when the grammar does not allow it.
    void accept_text(std::string_view text);
    // The text so far is a whole sentence of the grammar (generation may end here).
    bool can_end() const;
    // Nothing but the end may follow.
    bool must_end() const;
    // Bit id set: the token may come next. Cached per state; the span stays valid until the next
    // call that changes the state or the cache. Throws GrammarError when no token can go on
    // (the grammar needs text the vocabulary cannot spell).
    const std::vector<uint64_t>& allowed_tokens();
    // Back to the start.
    void reset();

    size_t n_stacks() const { return state_.count(); }
    uint64_t cache_hits() const { return cache_hits_; }
    uint64_t cache_misses() const { return cache_misses_; }

    // A set of parse stacks: stack k is data[start[k], start[k + 1]), its top at the end; an empty
    // stack means the text may end there. Plus a code point in progress (a UTF-8 sequence not
    // complete yet).
    struct State {
        std::vector<uint32_t> data;
        std::vector<uint32_t> start{0};
        uint32_t partial_value = 0;  // bits of the code point so far
        uint8_t partial_left = 0;    // continuation bytes still to come
        uint8_t partial_len = 0;     // bytes of the sequence seen
        size_t count() const { return start.size() - 1; }
        void clear() {
            data.clear();
            start.assign(1, 0);
            partial_value = 0;
            partial_left = 0;
            partial_len = 0;
        }
    };

private:
    bool advance_byte(const State& from, uint8_t byte, State& to);
    void advance_cp(const State& from, uint32_t cp, State& to);
    void expand(std::vector<uint32_t>& stack, State& out, int depth);
    void add_stack(State& out, const uint32_t* begin, size_t n);
    bool viable(const State& s) const;  // some text may follow (or end) from here
    // The code point of the grammar's reference to token id, or 0 when the grammar names it not.
    uint32_t token_code_point(int32_t id) const;
    bool advance_token(const State& from, uint32_t cp, State& to);
    bool state_can_end(const State& s) const;
    void compute_mask(std::vector<uint64_t>& mask);
    static std::string state_key(const State& s);
    int32_t intern(const State& s);          // the walk's id of a state
    int32_t step(int32_t id, uint8_t byte);  // the state after a byte (-1: none), memoized
    void clear_walk();

    std::shared_ptr<const Grammar> grammar_;
    std::shared_ptr<const GrammarVocab> vocab_;
    std::vector<std::pair<int32_t, uint32_t>> token_refs_;  // (token id, code point), by id
    State state_;
    // The mask walk's states, interned, and their transitions by byte (kept across walks: a
    // state's transitions do not change; cleared past kWalkStates states or kWalkEntries entries).
    std::vector<State> walk_states_;
    std::unordered_map<std::string, int32_t> walk_index_;
    std::vector<std::array<int32_t, 256>> walk_next_;
    size_t walk_entries_ = 0;
    std::vector<int32_t> level_ids_;             // the walk's state per byte depth
    std::deque<std::vector<uint32_t>> scratch_;  // expand()'s stacks per recursion depth
    State tmp_a_, tmp_b_;
    std::unordered_map<std::string, std::vector<uint64_t>> cache_;
    size_t cache_bytes_ = 0;
    std::vector<uint64_t> uncached_;
    uint64_t cache_hits_ = 0, cache_misses_ = 0;
};

}  // namespace fitllm::sampling
