// GBNF text -> Grammar: a recursive-descent parser into a small syntax tree, then a compiler that
// lowers groups and repetitions into rules of flat element sequences and checks the grammar
// (undefined rules, left recursion, limits).
#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "sampling/grammar.h"

namespace fitllm::sampling {
namespace {

constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct Item;
using Sequence = std::vector<Item>;
using Alternatives = std::vector<Sequence>;

struct Item {
    enum class Kind { literal, chars, name, group, token } kind = Kind::literal;
    std::vector<uint32_t> text;                         // literal
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // chars, normalized
    std::string name;                                   // name; token: its text, "<...>"
    Alternatives alts;                                  // group
    uint32_t min = 1, max = 1;
    size_t offset = 0;  // where it starts in the text
};

struct RuleDef {
    std::string name;
    size_t offset = 0;
    Alternatives alts;
};

// Sorts and merges ranges; negated: their complement in [0, kMaxCodePoint].
std::vector<std::pair<uint32_t, uint32_t>> normalize(std::vector<std::pair<uint32_t, uint32_t>> r, bool negated) {
    std::sort(r.begin(), r.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& p : r) {
        if (!merged.empty() && p.first <= merged.back().second + 1)
            merged.back().second = std::max(merged.back().second, p.second);
        else
            merged.push_back(p);
    }
    if (!negated) return merged;
    std::vector<std::pair<uint32_t, uint32_t>> out;
    uint32_t next = 0;
    for (const auto& p : merged) {
        if (p.first > next) out.emplace_back(next, p.first - 1);
        next = p.second + 1;
    }
    if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
    return out;
}

// Surrogates (U+D800..U+DFFF) are not characters: no class holds them, so text stays valid UTF-8.
std::vector<std::pair<uint32_t, uint32_t>> without_surrogates(const std::vector<std::pair<uint32_t, uint32_t>>& in) {
    std::vector<std::pair<uint32_t, uint32_t>> out;
    for (const auto& r : in) {
        if (r.second < 0xD800 || r.first > 0xDFFF) {
            out.push_back(r);
            continue;
        }
        if (r.first < 0xD800) out.emplace_back(r.first, 0xD7FF);
        if (r.second > 0xDFFF) out.emplace_back(0xE000, r.second);
    }
    return out;
}

class Parser {
public:
    explicit Parser(std::string_view text) : text_(text) {}

    std::vector<RuleDef> parse() {
        std::vector<RuleDef> rules;
        skip_space();
        while (pos_ < text_.size()) {
            RuleDef rule;
            rule.offset = pos_;
            rule.name = parse_name();
            if (rule.name.empty()) fail(pos_, "expected a rule name (letters, digits, '-' or '_')");
            skip_space();
            if (text_.substr(pos_, 3) != "::=") fail(pos_, "expected '::=' after the rule name '" + rule.name + "'");
            pos_ += 3;
            rule.alts = parse_alternatives(0);
            if (pos_ < text_.size() && text_[pos_] == ')') fail(pos_, "unexpected ')' with no '(' open");
            rules.push_back(std::move(rule));
            if (rules.size() > kMaxRules) fail(pos_, "more than " + std::to_string(kMaxRules) + " rules");
            skip_space();
        }
        if (rules.empty()) fail(0, "the grammar is empty (it needs at least a 'root ::= ...' rule)");
        return rules;
    }

    [[noreturn]] void fail(size_t at, const std::string& what) const {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < at && i < text_.size(); ++i) {
            if (text_[i] == '\n') {
                ++line;
                col = 1;
            } else if ((static_cast<uint8_t>(text_[i]) & 0xC0) != 0x80) {
                ++col;
            }
        }
        throw GrammarError("grammar: line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what);
    }

private:
    static bool name_char(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    }

    void skip_space() {
        while (pos_ < text_.size()) {
            const char c = text_[pos_];
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
                ++pos_;
            } else if (c == '#') {
                while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
            } else {
                break;
            }
        }
    }

    std::string parse_name() {
        const size_t begin = pos_;
        while (pos_ < text_.size() && name_char(text_[pos_])) ++pos_;
        return std::string(text_.substr(begin, pos_ - begin));
    }

    // At a name followed by '::=': the next rule starts here.
    bool at_rule_start() const {
        size_t p = pos_;
        while (p < text_.size() && name_char(text_[p])) ++p;
        if (p == pos_) return false;
        while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t' || text_[p] == '\n' || text_[p] == '\r')) ++p;
        return text_.substr(p, 3) == "::=";
    }

    Alternatives parse_alternatives(int depth) {
        Alternatives alts;
        alts.push_back(parse_sequence(depth));
        while (pos_ < text_.size() && text_[pos_] == '|') {
            ++pos_;
            alts.push_back(parse_sequence(depth));
        }
        return alts;
    }

    Sequence parse_sequence(int depth) {
        Sequence seq;
        for (;;) {
            skip_space();
            if (pos_ >= text_.size()) break;
            const char c = text_[pos_];
            if (c == '|' || c == ')') break;
            if (depth == 0 && at_rule_start()) break;
            Item item = parse_item(depth);
            skip_space();
            parse_repetition(item);
            seq.push_back(std::move(item));
        }
        return seq;
    }

    void parse_repetition(Item& item) {
        if (pos_ >= text_.size()) return;
        const char c = text_[pos_];
        if (c == '*') {
            item.min = 0, item.max = kUnbounded, ++pos_;
        } else if (c == '+') {
            item.min = 1, item.max = kUnbounded, ++pos_;
        } else if (c == '?') {
            item.min = 0, item.max = 1, ++pos_;
        } else if (c == '{') {
            const size_t open = pos_++;
            skip_space();
            const uint32_t m = parse_count(open);
            uint32_t n = m;
            skip_space();
            if (pos_ < text_.size() && text_[pos_] == ',') {
                ++pos_;
                skip_space();
                n = pos_ < text_.size() && text_[pos_] == '}' ? kUnbounded : parse_count(open);
                skip_space();
            }
            if (pos_ >= text_.size() || text_[pos_] != '}') fail(pos_, "expected '}' to close the repetition");
            ++pos_;
            if (n < m) fail(open, "repetition {" + std::to_string(m) + "," + std::to_string(n) + "}: max < min");
            item.min = m, item.max = n;
        } else {
            return;
        }
        skip_space();
        if (pos_ < text_.size() &&
            (text_[pos_] == '*' || text_[pos_] == '+' || text_[pos_] == '?' || text_[pos_] == '{'))
            fail(pos_, "two repetition operators in a row (use a group: (x*)?)");
    }

    uint32_t parse_count(size_t open) {
        const size_t begin = pos_;
        uint64_t v = 0;
        while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
            v = v * 10 + static_cast<uint64_t>(text_[pos_] - '0');
            if (v > kMaxRepeat) fail(open, "repetition count over the limit of " + std::to_string(kMaxRepeat));
            ++pos_;
        }
        if (pos_ == begin) fail(pos_, "expected a number in the repetition {m,n}");
        return static_cast<uint32_t>(v);
    }

    Item parse_item(int depth) {
        Item item;
        item.offset = pos_;
        const char c = text_[pos_];
        if (c == '"') {
            ++pos_;
            item.kind = Item::Kind::literal;
            for (;;) {
                if (pos_ >= text_.size()) fail(item.offset, "unterminated string literal");
                if (text_[pos_] == '"') break;
                if (text_[pos_] == '\n') fail(pos_, "newline inside a string literal (write \\n)");
                item.text.push_back(parse_char());
            }
            ++pos_;
        } else if (c == '[') {
            ++pos_;
            item.kind = Item::Kind::chars;
            bool negated = false;
            if (pos_ < text_.size() && text_[pos_] == '^') negated = true, ++pos_;
            std::vector<std::pair<uint32_t, uint32_t>> ranges;
            for (;;) {
                if (pos_ >= text_.size()) fail(item.offset, "unterminated character class");
                if (text_[pos_] == ']') break;
                const size_t at = pos_;
                const uint32_t lo = parse_char();
                uint32_t hi = lo;
                if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
                    ++pos_;
                    hi = parse_char();
                    if (hi < lo) fail(at, "character range with its end before its start");
                }
                ranges.emplace_back(lo, hi);
            }
            ++pos_;
            item.ranges = without_surrogates(normalize(std::move(ranges), negated));
        } else if (c == '.') {
            ++pos_;
            item.kind = Item::Kind::chars;
            item.ranges = without_surrogates({{0, kMaxCodePoint}});
        } else if (c == '(') {
            if (depth + 1 > kMaxNesting) fail(pos_, "groups nested deeper than " + std::to_string(kMaxNesting));
            ++pos_;
            item.kind = Item::Kind::group;
            item.alts = parse_alternatives(depth + 1);
            if (pos_ >= text_.size() || text_[pos_] != ')') fail(item.offset, "'(' is never closed");
            ++pos_;
        } else if (name_char(c)) {
            item.kind = Item::Kind::name;
            item.name = parse_name();
        } else if (c == '<') {
            // A special token by its text, brackets included: <|channel|> (up to the first '>').
            const size_t close = text_.find('>', pos_ + 1);
            if (close == std::string_view::npos) fail(pos_, "token reference '<' is never closed by '>'");
            const std::string_view inner = text_.substr(pos_ + 1, close - pos_ - 1);
            if (inner.empty() || inner.size() > kMaxTokenText)
                fail(pos_, "a token reference names a token's text, 1 to " + std::to_string(kMaxTokenText) +
                               " bytes between '<' and '>'");
            if (inner.front() == '[')
                fail(pos_, "token references by id (<[id]>) are not supported: name the token by its text");
            for (const char ch : inner)
                if (ch == '\n' || ch == '<' || ch == ' ')
                    fail(pos_, "a token reference holds no space, newline or '<'");
            item.kind = Item::Kind::token;
            item.name = std::string(text_.substr(pos_, close - pos_ + 1));
            pos_ = close + 1;
        } else if (c == ':' && text_.substr(pos_, 3) == "::=") {
            fail(pos_, "'::=' without a rule name before it");
        } else {
            fail(pos_, std::string("unexpected character '") + c + "'");
        }
        return item;
    }

    uint32_t hex(size_t n) {
        uint32_t v = 0;
        for (size_t i = 0; i < n; ++i) {
            if (pos_ >= text_.size()) fail(pos_, "incomplete escape");
            const char h = text_[pos_++];
            v <<= 4;
            if (h >= '0' && h <= '9')
                v |= uint32_t(h - '0');
            else if (h >= 'a' && h <= 'f')
                v |= uint32_t(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F')
                v |= uint32_t(h - 'A' + 10);
            else
                fail(pos_ - 1, "expected a hex digit in the escape");
        }
        return v;
    }

    // One character of a literal or class: an escape or a UTF-8 code point.
    uint32_t parse_char() {
        const size_t at = pos_;
        const auto b = static_cast<uint8_t>(text_[pos_]);
        if (b == '\\') {
            ++pos_;
            if (pos_ >= text_.size()) fail(at, "incomplete escape");
            const char e = text_[pos_++];
            switch (e) {
                case 'n':
                    return '\n';
                case 'r':
                    return '\r';
                case 't':
                    return '\t';
                case '0':
                    return 0;
                case '\\':
                case '"':
                case '\'':
                case '[':
                case ']':
                case '-':
                case '^':
                case '/':
                case '.':
                    return static_cast<uint8_t>(e);
                case 'x':
                    return hex(2);
                case 'u': {
                    const uint32_t v = hex(4);
                    return v;
                }
                case 'U': {
                    const uint32_t v = hex(8);
                    if (v > kMaxCodePoint) fail(at, "code point over U+10FFFF");
                    return v;
                }
                default:
                    fail(at, std::string("unknown escape '\\") + e + "'");
            }
        }
        if (b < 0x80) {
            ++pos_;
            return b;
        }
        const int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
        if (len == 0 || b >= 0xF8 || pos_ + size_t(len) > text_.size()) fail(at, "invalid UTF-8 in the grammar");
        uint32_t cp = b & (0x7F >> len);
        for (int i = 1; i < len; ++i) {
            const auto c = static_cast<uint8_t>(text_[pos_ + size_t(i)]);
            if ((c & 0xC0) != 0x80) fail(at, "invalid UTF-8 in the grammar");
            cp = (cp << 6) | (c & 0x3F);
        }
        pos_ += size_t(len);
        return cp;
    }

    std::string_view text_;
    size_t pos_ = 0;
};

}  // namespace

class GrammarCompiler {
public:
    GrammarCompiler(const Parser& parser, Grammar& g) : parser_(parser), g_(g) {}

    void compile(std::vector<RuleDef>& defs) {
        for (const RuleDef& d : defs) {
            if (index_.count(d.name)) parser_.fail(d.offset, "rule '" + d.name + "' is defined twice");
            index_[d.name] = static_cast<uint32_t>(g_.rules_.size());
            g_.rules_.emplace_back();
            g_.names_.push_back(d.name);
        }
        const auto root = index_.find("root");
        if (root == index_.end()) parser_.fail(0, "no 'root' rule (where a text starts)");
        g_.root_ = root->second;
        for (size_t i = 0; i < defs.size(); ++i)
            set_rule(static_cast<uint32_t>(i), lower_alts(defs[i].alts, defs[i].name));
        check_left_recursion();
    }

private:
    using Seq = std::vector<Grammar::Element>;

    uint32_t class_index(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
        std::string key;
        for (const auto& r : ranges) key.append(reinterpret_cast<const char*>(&r), sizeof r);
        const auto [it, fresh] = classes_.emplace(key, static_cast<uint32_t>(g_.classes_.size()));
        if (fresh) {
            Grammar::CharClass c;
            c.ranges = ranges;
            for (const auto& r : ranges)
                for (uint32_t cp = r.first; cp <= r.second && cp < 128; ++cp)
                    c.ascii[cp >> 6] |= uint64_t{1} << (cp & 63);
            g_.classes_.push_back(std::move(c));
        }
        return it->second;
    }

    std::vector<Seq> lower_alts(const Alternatives& alts, const std::string& name) {
        std::vector<Seq> out;
        for (const Sequence& s : alts) out.push_back(lower_seq(s, name));
        return out;
    }

    void count(size_t n) {
        n_elements_ += n;
        if (n_elements_ > kMaxElements)
            throw GrammarError("grammar: more than " + std::to_string(kMaxElements) +
                               " elements once repetitions are expanded (a grammar that large is refused)");
    }

    uint32_t new_rule(const std::string& base, std::vector<Seq> alts) {
        const auto id = static_cast<uint32_t>(g_.rules_.size());
        if (id >= kMaxRules)
            throw GrammarError("grammar: more than " + std::to_string(kMaxRules) +
                               " rules once groups and repetitions are expanded");
        g_.rules_.emplace_back();
        g_.names_.push_back(base + "-" + std::to_string(id));
        set_rule(id, std::move(alts));
        return id;
    }

    void set_rule(uint32_t id, std::vector<Seq> alts) {
        for (Seq& s : alts) {
            count(s.size() + 1);
            g_.rules_[id].push_back(static_cast<uint32_t>(g_.elements_.size()));
            g_.elements_.insert(g_.elements_.end(), s.begin(), s.end());
            g_.elements_.push_back({Grammar::Kind::end, 0});
        }
    }

    Seq lower_seq(const Sequence& seq, const std::string& name) {
        Seq out;
        for (const Item& item : seq) {
            Seq one;  // one occurrence
            switch (item.kind) {
                case Item::Kind::literal:
                    for (const uint32_t cp : item.text) one.push_back({Grammar::Kind::chars, class_index({{cp, cp}})});
                    break;
                case Item::Kind::chars:
                    one.push_back({Grammar::Kind::chars, class_index(item.ranges)});
                    break;
                case Item::Kind::token: {
                    // The k-th distinct token is the code point kTokenCodePoint + k: no UTF-8 text
                    // spells it, only the token itself (GrammarMatcher) advances past it.
                    auto at = std::find(g_.tokens_.begin(), g_.tokens_.end(), item.name);
                    if (at == g_.tokens_.end()) {
                        if (g_.tokens_.size() >= kMaxTokenRefs)
                            parser_.fail(item.offset,
                                         "more than " + std::to_string(kMaxTokenRefs) + " distinct token references");
                        at = g_.tokens_.insert(g_.tokens_.end(), item.name);
                    }
                    const auto cp = kTokenCodePoint + static_cast<uint32_t>(at - g_.tokens_.begin());
                    one.push_back({Grammar::Kind::chars, class_index({{cp, cp}})});
                    break;
                }
                case Item::Kind::name: {
                    const auto it = index_.find(item.name);
                    if (it == index_.end()) parser_.fail(item.offset, "rule '" + item.name + "' is not defined");
                    one.push_back({Grammar::Kind::ref, it->second});
                    break;
                }
                case Item::Kind::group:
                    if (item.alts.size() == 1) {
                        one = lower_seq(item.alts[0], name);
                    } else {
                        one.push_back({Grammar::Kind::ref, new_rule(name, lower_alts(item.alts, name))});
                    }
                    break;
            }
            if (item.min == 1 && item.max == 1) {
                count(one.size());
                out.insert(out.end(), one.begin(), one.end());
                continue;
            }
            if (one.size() > 1) one = {{Grammar::Kind::ref, new_rule(name, {one})}};
            for (uint32_t i = 0; i < item.min; ++i) {
                count(one.size());
                out.insert(out.end(), one.begin(), one.end());
            }
            if (item.max == kUnbounded) {
                // star ::= one star | (empty)
                const auto id = static_cast<uint32_t>(g_.rules_.size());
                if (id >= kMaxRules) throw GrammarError("grammar: more than " + std::to_string(kMaxRules) + " rules");
                g_.rules_.emplace_back();
                g_.names_.push_back(name + "-" + std::to_string(id));
                Seq loop = one;
                loop.push_back({Grammar::Kind::ref, id});
                set_rule(id, {loop, Seq{}});
                out.push_back({Grammar::Kind::ref, id});
            } else if (item.max > item.min) {
                // opt_1 ::= one | ; opt_k ::= one opt_(k-1) |
                uint32_t prev = new_rule(name, {one, Seq{}});
                for (uint32_t k = 2; k <= item.max - item.min; ++k) {
                    Seq s = one;
                    s.push_back({Grammar::Kind::ref, prev});
                    prev = new_rule(name, {s, Seq{}});
                }
                out.push_back({Grammar::Kind::ref, prev});
            }
        }
        return out;
    }

    // Left recursion (a rule reaching itself before any character) would make matching loop
    // forever, so it is refused, naming the cycle.
    void check_left_recursion() {
        const size_t n = g_.rules_.size();
        std::vector<uint8_t> nullable(n, 0);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < n; ++r) {
                if (nullable[r]) continue;
                for (const uint32_t a : g_.rules_[r]) {
                    bool all = true;
                    for (uint32_t p = a; g_.elements_[p].kind != Grammar::Kind::end; ++p) {
                        const auto& e = g_.elements_[p];
                        if (e.kind == Grammar::Kind::chars || !nullable[e.value]) {
                            all = false;
                            break;
                        }
                    }
                    if (all) {
                        nullable[r] = 1;
                        changed = true;
                        break;
                    }
                }
            }
        }
        std::vector<std::vector<uint32_t>> edges(n);
        for (size_t r = 0; r < n; ++r) {
            for (const uint32_t a : g_.rules_[r]) {
                for (uint32_t p = a; g_.elements_[p].kind == Grammar::Kind::ref; ++p) {
                    edges[r].push_back(g_.elements_[p].value);
                    if (!nullable[g_.elements_[p].value]) break;
                }
            }
        }
        // Iterative depth-first search; colour 1: on the path, 2: done.
        std::vector<uint8_t> colour(n, 0);
        std::vector<std::pair<uint32_t, size_t>> path;
        for (uint32_t start = 0; start < n; ++start) {
            if (colour[start]) continue;
            path.emplace_back(start, 0);
            colour[start] = 1;
            while (!path.empty()) {
                auto& [r, next] = path.back();
                if (next == edges[r].size()) {
                    colour[r] = 2;
                    path.pop_back();
                    continue;
                }
                const uint32_t to = edges[r][next++];
                if (colour[to] == 1) {
                    std::string cycle;
                    bool on = false;
                    for (const auto& step : path) {
                        if (step.first == to) on = true;
                        if (on) cycle += g_.names_[step.first] + " -> ";
                    }
                    throw GrammarError("grammar: rule '" + g_.names_[to] + "' is left-recursive (" + cycle +
                                       g_.names_[to] + "); rewrite it with repetition, e.g. x ::= y (\"+\" y)*");
                }
                if (colour[to] == 0) {
                    colour[to] = 1;
                    path.emplace_back(to, 0);
                }
            }
        }
    }

    const Parser& parser_;
    Grammar& g_;
    std::map<std::string, uint32_t> index_;
    std::map<std::string, uint32_t> classes_;
    size_t n_elements_ = 0;
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view text) {
    if (text.size() > kMaxGrammarBytes)
        throw GrammarError("grammar: " + std::to_string(text.size()) + " bytes, over the limit of " +
                           std::to_string(kMaxGrammarBytes));
    Parser parser(text);
    std::vector<RuleDef> defs = parser.parse();
    auto g = std::make_shared<Grammar>();
    GrammarCompiler(parser, *g).compile(defs);
    return g;
}

uint64_t Grammar::memory_bytes() const {
    uint64_t bytes = sizeof(Grammar) + elements_.capacity() * sizeof(Element);
    for (const auto& r : rules_) bytes += sizeof r + r.capacity() * sizeof(uint32_t);
    for (const auto& n : names_) bytes += sizeof n + n.capacity();
    for (const auto& c : classes_) bytes += sizeof c + c.ranges.capacity() * sizeof(c.ranges[0]);
    for (const auto& t : tokens_) bytes += sizeof t + t.capacity();
    return bytes;
}

bool Grammar::CharClass::contains(uint32_t cp) const {
    if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
    for (const auto& r : ranges) {
        if (cp < r.first) return false;
        if (cp <= r.second) return true;
    }
    return false;
}

bool Grammar::CharClass::intersects(uint32_t lo, uint32_t hi) const {
    for (const auto& r : ranges)
        if (r.first <= hi && lo <= r.second) return true;
    return false;
}

}  // namespace fitllm::sampling
