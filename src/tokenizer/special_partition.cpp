// Splitting text at special tokens. llama.cpp (tokenizer_st_partition) takes each special token
// in turn, longest first, and splits every still-raw fragment at that token's leftmost
// non-overlapping occurrences. Doing that for all of a vocabulary's special tokens costs one
// pass over the text per token (6,400 passes for Gemma 3), so a trie first finds which tokens
// occur at all, and only those are tried, in the same order: same fragments, a fraction of the work.
#include "tokenizer/special_partition.h"

#include <algorithm>

namespace fitllm::tokenizer {
namespace {

// C isspace() in the "C" locale, which is what llama.cpp's LSTRIP/RSTRIP test.
bool is_c_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

}  // namespace

SpecialTokenMatcher::SpecialTokenMatcher(const Vocab& vocab) : vocab_(vocab), order_(vocab.partition_tokens()) {
    nodes_.emplace_back();
    always_.resize(order_.size());
    for (size_t rank = 0; rank < order_.size(); ++rank) {
        const TokenId id = order_[rank];
        always_[rank] = (vocab.attributes(id) & (kAttrControl | kAttrUnknown)) == 0;
        const std::string& text = vocab.text(id);
        first_byte_[static_cast<uint8_t>(text[0])] = true;
        int32_t node = 0;
        for (char c : text) {
            const auto byte = static_cast<uint8_t>(c);
            int32_t next = child(node, byte);
            if (next < 0) {
                next = static_cast<int32_t>(nodes_.size());
                auto& children = nodes_[static_cast<size_t>(node)].children;
                children.insert(std::upper_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1})),
                                {byte, next});
                nodes_.emplace_back();  // may reallocate: `children` is not used after this
            }
            node = next;
        }
        nodes_[static_cast<size_t>(node)].rank = static_cast<int32_t>(rank);
    }
}

int32_t SpecialTokenMatcher::child(int32_t node, uint8_t byte) const {
    const auto& children = nodes_[static_cast<size_t>(node)].children;
    const auto it = std::lower_bound(children.begin(), children.end(), byte,
                                     [](const std::pair<uint8_t, int32_t>& c, uint8_t b) { return c.first < b; });
    return it != children.end() && it->first == byte ? it->second : -1;
}

std::vector<uint8_t> SpecialTokenMatcher::occurring_ranks(std::string_view text, bool parse_special) const {
    std::vector<uint8_t> occurs(order_.size(), 0);
    for (size_t start = 0; start < text.size(); ++start) {
        if (!first_byte_[static_cast<uint8_t>(text[start])]) continue;
        int32_t node = 0;
        for (size_t i = start; i < text.size(); ++i) {
            node = child(node, static_cast<uint8_t>(text[i]));
            if (node < 0) break;
            const int32_t rank = nodes_[static_cast<size_t>(node)].rank;
            if (rank >= 0 && (parse_special || always_[static_cast<size_t>(rank)]))
                occurs[static_cast<size_t>(rank)] = 1;
        }
    }
    return occurs;
}

void SpecialTokenMatcher::split_at(std::string_view text, TokenId id, std::vector<Fragment>& fragments) const {
    const std::string& token_text = vocab_.text(id);
    const bool lstrip = vocab_.has_attr(id, kAttrLstrip);
    const bool rstrip = vocab_.has_attr(id, kAttrRstrip);
    std::vector<Fragment> result;
    result.reserve(fragments.size() + 8);
    for (const Fragment& f : fragments) {
        if (!f.is_text()) {
            result.push_back(f);
            continue;
        }
        size_t begin = f.offset;
        const size_t end = f.offset + f.length;
        const std::string_view window = text.substr(0, end);
        while (begin < end) {
            const size_t match = window.find(token_text, begin);
            if (match == std::string_view::npos) break;
            size_t left_end = match;
            if (lstrip) {
                while (left_end > begin && is_c_space(text[left_end - 1])) --left_end;
            }
            if (left_end > begin) result.push_back({kNoToken, begin, left_end - begin});
            result.push_back({id, 0, 0});
            begin = match + token_text.size();
            if (rstrip) {
                while (begin < end && is_c_space(text[begin])) ++begin;
            }
        }
        if (begin < end) result.push_back({kNoToken, begin, end - begin});
    }
    fragments.swap(result);
}

std::vector<Fragment> SpecialTokenMatcher::partition(std::string_view text, bool parse_special) const {
    std::vector<Fragment> fragments;
    if (text.empty()) return fragments;
    fragments.push_back({kNoToken, 0, text.size()});
    const std::vector<uint8_t> occurs = occurring_ranks(text, parse_special);
    for (size_t rank = 0; rank < order_.size(); ++rank) {
        if (occurs[rank]) split_at(text, order_[rank], fragments);
    }
    return fragments;
}

}  // namespace fitllm::tokenizer
