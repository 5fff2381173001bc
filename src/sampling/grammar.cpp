// GrammarVocab and GrammarMatcher: parse stacks advanced code point by code point, and the walk
// over the sorted vocabulary that gives a state's mask of allowed tokens.
#include "sampling/grammar.h"

#include <algorithm>
#include <cstring>

namespace fitllm::sampling {
namespace {
// The least code point a UTF-8 sequence of n bytes may encode (shorter forms are invalid).
constexpr uint32_t kLeast[5] = {0, 0, 0x80, 0x800, 0x10000};
}  // namespace

// ---------------------------------------------------------------------------------------------
// GrammarVocab

GrammarVocab::GrammarVocab(const std::vector<std::string>& texts, std::vector<int32_t> eog,
                           std::vector<std::pair<std::string, int32_t>> specials)
    : n_vocab_(static_cast<int32_t>(texts.size())), eog_(std::move(eog)), specials_(std::move(specials)) {
    std::sort(specials_.begin(), specials_.end());
    std::sort(eog_.begin(), eog_.end());
    eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());
    size_t total = 0;
    for (const auto& t : texts) total += t.size(), longest_ = std::max(longest_, t.size());
    bytes_.reserve(total);
    offsets_.reserve(texts.size() + 1);
    offsets_.push_back(0);
    for (const auto& t : texts) {
        bytes_ += t;
        offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
    }
    for (int32_t id = 0; id < n_vocab_; ++id)
        if (!texts[size_t(id)].empty() && !is_eog(id)) sorted_.push_back(id);
    std::sort(sorted_.begin(), sorted_.end(), [this](int32_t a, int32_t b) {
        const auto ta = text(a), tb = text(b);
        return ta < tb || (ta == tb && a < b);
    });
    lcp_.assign(sorted_.size(), 0);
    for (size_t i = 1; i < sorted_.size(); ++i) {
        const auto a = text(sorted_[i - 1]), b = text(sorted_[i]);
        size_t n = 0;
        while (n < a.size() && n < b.size() && n < 0xFFFF && a[n] == b[n]) ++n;
        lcp_[i] = static_cast<uint16_t>(n);
    }
}

uint64_t GrammarMatcher::memory_bound(const Grammar& grammar, const GrammarVocab& vocab) {
    const uint64_t state = (kMaxStateEntries + kMaxStacks + 1) * sizeof(uint32_t);
    const uint64_t mask = (uint64_t(vocab.size()) + 63) / 64 * sizeof(uint64_t);
    // The walk's memo: its states (and their keys) up to the bounds, plus one token's worth past them.
    const uint64_t walk =
        (kWalkStates + vocab.longest() + 1) * (sizeof(State) + 1024 + 64) +
        2 * (kWalkEntries + (vocab.longest() + 1) * (kMaxStateEntries + kMaxStacks)) * sizeof(uint32_t);
    return sizeof(GrammarMatcher) + grammar.memory_bytes() + kMaskCacheBytes + 2 * mask + 4 * state + walk +
           grammar.tokens().size() * sizeof(std::pair<int32_t, uint32_t>) +
           uint64_t(kMaxExpandDepth + 1) * kMaxStackDepth * sizeof(uint32_t);
}

int32_t GrammarVocab::special_token(std::string_view text) const {
    const auto it = std::lower_bound(specials_.begin(), specials_.end(), text,
                                     [](const auto& e, std::string_view t) { return std::string_view(e.first) < t; });
    return it != specials_.end() && it->first == text ? it->second : -1;
}

bool GrammarVocab::is_eog(int32_t id) const {
    return std::binary_search(eog_.begin(), eog_.end(), id);
}

uint64_t GrammarVocab::memory_bytes() const {
    return sizeof(*this) + bytes_.capacity() + offsets_.capacity() * 4 + sorted_.capacity() * 4 + lcp_.capacity() * 2 +
           eog_.capacity() * 4 + specials_.capacity() * sizeof(specials_[0]) + [this] {
               size_t n = 0;
               for (const auto& e : specials_) n += e.first.capacity();
               return n;
           }();
}

// ---------------------------------------------------------------------------------------------
// GrammarMatcher

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const GrammarVocab> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
    if (!grammar_ || !vocab_) throw GrammarError("grammar: a matcher needs a grammar and a vocabulary");
    const auto& tokens = grammar_->tokens();
    for (size_t k = 0; k < tokens.size(); ++k) {
        const int32_t id = vocab_->special_token(tokens[k]);
        if (id < 0 || id >= vocab_->size())
            throw GrammarError("grammar: the token reference " + tokens[k] +
                               " names no control or user-defined token of the model's vocabulary");
        token_refs_.emplace_back(id, kTokenCodePoint + static_cast<uint32_t>(k));
    }
    std::sort(token_refs_.begin(), token_refs_.end());
    reset();
}

void GrammarMatcher::reset() {
    state_.clear();
    for (const uint32_t alt : grammar_->rules()[grammar_->root()]) {
        std::vector<uint32_t>& st = scratch_.empty() ? scratch_.emplace_back() : scratch_[0];
        st.assign(1, alt);
        expand(st, state_, 0);
    }
}

void GrammarMatcher::add_stack(State& out, const uint32_t* begin, size_t n) {
    for (size_t k = 0; k < out.count(); ++k) {
        const uint32_t b = out.start[k], e = out.start[k + 1];
        if (e - b == n && (n == 0 || std::memcmp(out.data.data() + b, begin, n * sizeof(uint32_t)) == 0)) return;
    }
    if (out.data.size() + n > kMaxStateEntries)
        throw GrammarError("grammar: parse stacks over " + std::to_string(kMaxStateEntries) +
                           " entries at once (the grammar is too ambiguous or nests too deeply)");
    if (out.count() >= kMaxStacks)
        throw GrammarError("grammar: more than " + std::to_string(kMaxStacks) +
                           " parse stacks at once (the grammar is too ambiguous)");
    out.data.insert(out.data.end(), begin, begin + n);
    out.start.push_back(static_cast<uint32_t>(out.data.size()));
}

// Moves the stack's top to a character element (or pops it empty: the text may end), trying every
// alternative of a rule on top; each result goes into out. A rule reference at the end of an
// alternative replaces its caller's entry (a tail call), so repetition keeps the stack flat.
void GrammarMatcher::expand(std::vector<uint32_t>& st, State& out, int depth) {
    const auto& el = grammar_->elements();
    for (;;) {
        if (st.empty()) {
            add_stack(out, nullptr, 0);
            return;
        }
        const uint32_t pos = st.back();
        const Grammar::Element e = el[pos];
        if (e.kind == Grammar::Kind::end) {
            st.pop_back();
            continue;
        }
        if (e.kind == Grammar::Kind::chars) {
            add_stack(out, st.data(), st.size());
            return;
        }
        st.pop_back();
        if (el[pos + 1].kind != Grammar::Kind::end) st.push_back(pos + 1);
        if (st.size() >= kMaxStackDepth)
            throw GrammarError("grammar: parse stack deeper than " + std::to_string(kMaxStackDepth) +
                               " (nesting through rule '" + grammar_->rule_name(e.value) + "')");
        if (depth + 1 >= kMaxExpandDepth)
            throw GrammarError("grammar: rule '" + grammar_->rule_name(e.value) + "' expands too deeply");
        while (scratch_.size() <= size_t(depth) + 1) scratch_.emplace_back();
        std::vector<uint32_t>& next = scratch_[size_t(depth) + 1];
        for (const uint32_t alt : grammar_->rules()[e.value]) {
            next.assign(st.begin(), st.end());
            next.push_back(alt);
            expand(next, out, depth + 1);
        }
        return;
    }
}

void GrammarMatcher::advance_cp(const State& from, uint32_t cp, State& to) {
    to.clear();
    const auto& el = grammar_->elements();
    const auto& classes = grammar_->classes();
    if (scratch_.empty()) scratch_.emplace_back();
    for (size_t k = 0; k < from.count(); ++k) {
        const uint32_t b = from.start[k], e = from.start[k + 1];
        if (b == e) continue;
        const uint32_t top = from.data[e - 1];
        if (!classes[el[top].value].contains(cp)) continue;
        std::vector<uint32_t>& st = scratch_[0];
        st.assign(from.data.begin() + b, from.data.begin() + e);
        st.back() = top + 1;
        expand(st, to, 0);
    }
}

bool GrammarMatcher::viable(const State& s) const {
    if (s.partial_left == 0) return s.count() > 0;
    // A code point in progress: the values its completions can take form one range.
    const uint32_t shift = 6u * s.partial_left;
    const uint32_t least = kLeast[s.partial_len + s.partial_left];  // shorter forms are invalid
    // (Up to U+10FFFF: past it are the grammar's token references, which no text reaches.)
    const uint32_t lo = std::max(s.partial_value << shift, least),
                   hi = std::min((s.partial_value << shift) | ((1u << shift) - 1), uint32_t{0x10FFFF});
    if (lo > hi || lo > 0x10FFFF) return false;
    const auto& el = grammar_->elements();
    for (size_t k = 0; k < s.count(); ++k) {
        if (s.start[k] == s.start[k + 1]) continue;
        if (grammar_->classes()[el[s.data[s.start[k + 1] - 1]].value].intersects(lo, hi)) return true;
    }
    return false;
}

bool GrammarMatcher::advance_byte(const State& from, uint8_t byte, State& to) {
    if (from.partial_left == 0) {
        if (byte < 0x80) {
            advance_cp(from, byte, to);
            return to.count() > 0;
        }
        uint32_t value;
        uint8_t left;
        if ((byte & 0xE0) == 0xC0 && byte >= 0xC2) {
            value = byte & 0x1F, left = 1;
        } else if ((byte & 0xF0) == 0xE0) {
            value = byte & 0x0F, left = 2;
        } else if ((byte & 0xF8) == 0xF0 && byte <= 0xF4) {
            value = byte & 0x07, left = 3;
        } else {
            return false;
        }
        to.data = from.data;
        to.start = from.start;
        to.partial_value = value, to.partial_left = left, to.partial_len = 1;
        return viable(to);
    }
    if ((byte & 0xC0) != 0x80) return false;
    const uint32_t value = (from.partial_value << 6) | (byte & 0x3F);
    if (from.partial_left == 1) {
        if (value < kLeast[from.partial_len + 1] || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF))
            return false;  // an overlong form, a surrogate or past U+10FFFF
        advance_cp(from, value, to);
        return to.count() > 0;
    }
    to.data = from.data;
    to.start = from.start;
    to.partial_value = value, to.partial_left = uint8_t(from.partial_left - 1),
    to.partial_len = uint8_t(from.partial_len + 1);
    return viable(to);
}

uint32_t GrammarMatcher::token_code_point(int32_t id) const {
    const auto it = std::lower_bound(token_refs_.begin(), token_refs_.end(), std::make_pair(id, uint32_t{0}));
    return it != token_refs_.end() && it->first == id ? it->second : 0;
}

bool GrammarMatcher::advance_token(const State& from, uint32_t cp, State& to) {
    if (from.partial_left != 0) {
        to.clear();
        return false;
    }
    advance_cp(from, cp, to);
    return to.count() > 0;
}

bool GrammarMatcher::allows_text(std::string_view text) {
    const State* from = &state_;
    State* bufs[2] = {&tmp_a_, &tmp_b_};
    for (size_t i = 0; i < text.size(); ++i) {
        State* to = bufs[i & 1];
        if (!advance_byte(*from, static_cast<uint8_t>(text[i]), *to)) return false;
        from = to;
    }
    return viable(*from);
}

void GrammarMatcher::accept_text(std::string_view text) {
    if (text.empty()) return;
    if (!allows_text(text)) throw GrammarError("grammar: the text does not continue the grammar here");
    std::swap(state_, (text.size() & 1) ? tmp_a_ : tmp_b_);
}

bool GrammarMatcher::allows_token(int32_t id) {
    if (id < 0 || id >= vocab_->size()) return false;
    if (const uint32_t cp = token_code_point(id)) return advance_token(state_, cp, tmp_a_);
    if (vocab_->is_eog(id)) return can_end();
    const std::string_view text = vocab_->text(id);
    return !text.empty() && allows_text(text);
}

void GrammarMatcher::accept_token(int32_t id) {
    if (const uint32_t cp = token_code_point(id)) {
        if (!advance_token(state_, cp, tmp_a_))
            throw GrammarError("grammar: the token " + std::to_string(id) + " is not allowed here");
        std::swap(state_, tmp_a_);
        return;
    }
    if (id >= 0 && id < vocab_->size() && vocab_->is_eog(id)) {
        if (!can_end()) throw GrammarError("grammar: the end of the text is not allowed here");
        return;
    }
    if (id < 0 || id >= vocab_->size() || vocab_->text(id).empty())
        throw GrammarError("grammar: token " + std::to_string(id) + " has no text a grammar allows");
    accept_text(vocab_->text(id));
}

bool GrammarMatcher::state_can_end(const State& s) const {
    if (s.partial_left != 0) return false;
    for (size_t k = 0; k < s.count(); ++k)
        if (s.start[k] == s.start[k + 1]) return true;
    return false;
}

bool GrammarMatcher::can_end() const {
    return state_can_end(state_);
}

bool GrammarMatcher::must_end() const {
    return state_.partial_left == 0 && state_.data.empty() && state_.count() > 0;
}

std::string GrammarMatcher::state_key(const State& s) {
    std::string key;
    key.reserve(4 * (s.data.size() + s.start.size()) + 8);
    const auto put = [&key](uint32_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
    put(s.partial_value);
    put(uint32_t(s.partial_left) | uint32_t(s.partial_len) << 8);
    for (const uint32_t v : s.start) put(v);
    for (const uint32_t v : s.data) put(v);
    return key;
}

void GrammarMatcher::clear_walk() {
    walk_states_.clear();
    walk_index_.clear();
    walk_next_.clear();
    walk_entries_ = 0;
}

int32_t GrammarMatcher::intern(const State& s) {
    std::string key = state_key(s);
    if (const auto it = walk_index_.find(key); it != walk_index_.end()) return it->second;
    const auto id = static_cast<int32_t>(walk_states_.size());
    walk_states_.push_back(s);
    walk_next_.emplace_back();
    walk_next_.back().fill(-2);
    walk_entries_ += s.data.size() + s.start.size();
    walk_index_.emplace(std::move(key), id);
    return id;
}

int32_t GrammarMatcher::step(int32_t id, uint8_t byte) {
    const int32_t known = walk_next_[size_t(id)][byte];
    if (known != -2) return known;
    const int32_t next = advance_byte(walk_states_[size_t(id)], byte, tmp_a_) ? intern(tmp_a_) : -1;
    walk_next_[size_t(id)][byte] = next;
    return next;
}

// Walks the sorted vocabulary: level_ids_[d] is the state after the first d bytes of the current
// token, valid up to the prefix it shares with the previous one; a byte that no stack takes kills
// its prefix, and every following token that shares it is skipped without a look. Transitions are
// memoized per state, so a state that comes back (inside a string: after every character) costs
// one look-up per byte.
void GrammarMatcher::compute_mask(std::vector<uint64_t>& mask) {
    const size_t n_words = (size_t(vocab_->size()) + 63) / 64;
    mask.assign(n_words, 0);
    if (state_can_end(state_))
        for (const int32_t id : vocab_->eog_) mask[size_t(id) >> 6] |= uint64_t{1} << (id & 63);
    if (walk_states_.size() > kWalkStates || walk_entries_ > kWalkEntries) clear_walk();
    level_ids_.assign(1, intern(state_));
    const auto& sorted = vocab_->sorted_;
    const auto& lcp = vocab_->lcp_;
    size_t valid = 0;  // level_ids_[0, valid] hold the previous token's prefixes
    size_t i = 0;
    while (i < sorted.size()) {
        if (walk_states_.size() > kWalkStates || walk_entries_ > kWalkEntries) {
            // Past the memo's bounds: start it again with the states of the current prefix.
            std::vector<State> path;
            for (size_t d = 0; d <= valid; ++d) path.push_back(walk_states_[size_t(level_ids_[d])]);
            clear_walk();
            for (size_t d = 0; d <= valid; ++d) level_ids_[d] = intern(path[d]);
        }
        const int32_t id = sorted[i];
        const std::string_view text = vocab_->text(id);
        size_t d = std::min<size_t>(i == 0 ? 0 : lcp[i], valid);
        bool dead = false;
        while (d < text.size()) {
            const int32_t next = step(level_ids_[d], static_cast<uint8_t>(text[d]));
            if (next < 0) {
                dead = true;
                break;
            }
            if (level_ids_.size() <= d + 1) level_ids_.resize(d + 2);
            level_ids_[d + 1] = next;
            ++d;
        }
        ++i;
        valid = d;
        if (!dead) {
            mask[size_t(id) >> 6] |= uint64_t{1} << (id & 63);
        } else {
            while (i < sorted.size() && lcp[i] > d) ++i;  // they share the dead prefix
        }
    }
    // The referenced tokens: by the reference alone, not by their text (nor as an end).
    for (const auto& [id, cp] : token_refs_) {
        mask[size_t(id) >> 6] &= ~(uint64_t{1} << (id & 63));
        if (advance_token(state_, cp, tmp_b_)) mask[size_t(id) >> 6] |= uint64_t{1} << (id & 63);
    }
    bool any = false;
    for (const uint64_t w : mask) any |= w != 0;
    if (!any)
        throw GrammarError(
            "grammar: no token of the vocabulary can continue the text here (the grammar needs text "
            "the vocabulary cannot spell)");
}

const std::vector<uint64_t>& GrammarMatcher::allowed_tokens() {
    std::string key = state_key(state_);
    if (const auto it = cache_.find(key); it != cache_.end()) {
        ++cache_hits_;
        return it->second;
    }
    ++cache_misses_;
    compute_mask(uncached_);
    const size_t bytes = uncached_.size() * sizeof(uint64_t) + key.size() + 64;
    if (bytes > kMaskCacheBytes) return uncached_;
    if (cache_bytes_ + bytes > kMaskCacheBytes) {
        cache_.clear();
        cache_bytes_ = 0;
    }
    cache_bytes_ += bytes;
    return cache_.emplace(std::move(key), uncached_).first->second;
}

}  // namespace fitllm::sampling
