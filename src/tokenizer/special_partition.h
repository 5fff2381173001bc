#pragma once
// Internal to tokenizer/: splitting input text at special tokens before the segmenters run,
// with the result of llama.cpp's tokenizer_st_partition (which tries each special token in
// turn, longest first, over the text that earlier tokens left unsplit).
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace fitllm::tokenizer {

// Either a special token or a span of raw text (token == kNoToken).
struct Fragment {
    TokenId token = kNoToken;
    size_t offset = 0;
    size_t length = 0;
    bool is_text() const { return token == kNoToken; }
};

class SpecialTokenMatcher {
public:
    explicit SpecialTokenMatcher(const Vocab& vocab);

    // parse_special: control and unknown tokens match too (user-defined ones always do).
    std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

private:
    struct Node {
        std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
        int32_t rank = -1;                                  // index into partition order when a token ends here
    };
    int32_t child(int32_t node, uint8_t byte) const;
    // Marks which partition tokens occur anywhere in text, so that only those are tried.
    std::vector<uint8_t> occurring_ranks(std::string_view text, bool parse_special) const;
    void split_at(std::string_view text, TokenId id, std::vector<Fragment>& fragments) const;

    const Vocab& vocab_;
    std::vector<TokenId> order_;   // vocab.partition_tokens()
    std::vector<uint8_t> always_;  // per rank: matched even without parse_special (user-defined)
    std::vector<Node> nodes_;      // nodes_[0] is the root
    bool first_byte_[256] = {};
};

}  // namespace fitllm::tokenizer
