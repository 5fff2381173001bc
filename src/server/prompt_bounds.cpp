#include "server/prompt_bounds.h"

namespace fitllm::server {
namespace {

// Where a piece that starts at `begin` ends: after a newline or before a space within its last
// 1 KiB, else at the start of a UTF-8 character.
size_t piece_end(std::string_view text, size_t begin) {
    if (text.size() - begin <= kCountPieceBytes) return text.size();
    size_t end = begin + kCountPieceBytes;
    const size_t floor = end - 1024;
    for (size_t i = end; i > floor; --i) {
        if (text[i - 1] == '\n') return i;
        if (text[i] == ' ') return i;
    }
    while (end > begin + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    return end;
}

}  // namespace

size_t longest_token_bytes(const tokenizer::Tokenizer& tok) {
    const tokenizer::VocabType type = tok.vocab().type();
    if (type != tokenizer::VocabType::spm && type != tokenizer::VocabType::bpe) return 0;
    size_t longest = 4;  // an unknown character that becomes one token (at most 4 bytes of UTF-8)
    for (size_t id = 0; id < tok.vocab().size(); ++id) {
        longest = std::max(longest, tok.token_to_piece(static_cast<tokenizer::TokenId>(id), /*special=*/true).size());
    }
    return longest;
}

BoundedTokens tokenize_within(const tokenizer::Tokenizer& tok, std::string_view text, bool add_special,
                              bool parse_special, size_t max_tokens, size_t longest_token, RequestMemory* memory) {
    BoundedTokens r;
    const size_t min_tokens = longest_token > 0 ? (text.size() + longest_token - 1) / longest_token : 0;
    if (min_tokens > max_tokens) {
        r.over = true;
        r.by_size = true;
        r.at_least = min_tokens;
        return r;
    }
    // No text has more than 3 tokens a byte (a byte-level BPE writes an invalid byte as U+FFFD).
    const bool may_be_over = max_tokens / 3 <= text.size() + 1;
    if (text.size() > kCountPieceBytes && may_be_over) {
        const memory::Charge work =
            memory ? memory->charge(kCountPieceBytes * kTokenizeBytesPerByte, "tokenizing the prompt")
                   : memory::Charge{};
        size_t counted = 0;
        size_t cuts = 0;
        for (size_t begin = 0; begin < text.size(); ++cuts) {
            const size_t end = piece_end(text, begin);
            counted += tok.tokenize(text.substr(begin, end - begin), /*add_special=*/false, parse_special).size();
            if (counted > max_tokens + kTokensPerCut * cuts) {
                r.over = true;
                r.counted_in_pieces = true;
                r.at_least = counted - kTokensPerCut * cuts;
                return r;
            }
            begin = end;
        }
    }
    const memory::Charge work =
        memory ? memory->charge(text.size() * kTokenizeBytesPerByte, "tokenizing the prompt") : memory::Charge{};
    r.ids = tok.tokenize(text, add_special, parse_special);
    if (r.ids.size() > max_tokens) {
        r.over = true;
        r.at_least = r.ids.size();
        r.ids = {};
    }
    return r;
}

}  // namespace fitllm::server
