#pragma once
// A prompt is refused by its size before it is tokenized whole. Every token stands for at most
// the longest piece of its vocabulary (special tokens spelled out), so a text of more than
// max_tokens x longest bytes cannot fit max_tokens tokens; below that, a long text is counted in
// pieces first and refused as soon as the count passes the limit.
//
//   const size_t longest = longest_token_bytes(tok);  // once per model
//   BoundedTokens t = tokenize_within(tok, text, true, true, n_ctx - 1, longest, &request_memory);
//   if (t.over) refuse(t.at_least);
#include <cstdint>
#include <string_view>
#include <vector>

#include "server/request_memory.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::server {

// The heap the tokenizers use while they work, per byte of text, the ids included (measured:
// at most 74 for Gemma 3's SPM on random letters, 40 for the test models' BPE).
inline constexpr uint64_t kTokenizeBytesPerByte = 96;
// Texts longer than this are counted in pieces of this size before they are tokenized whole.
inline constexpr size_t kCountPieceBytes = size_t{16} << 10;
// Tokens a cut between two pieces may add to the count (a word or a special token split).
inline constexpr size_t kTokensPerCut = 16;

// The most bytes of text one token of this vocabulary stands for; 0 when its tokenizer has no
// such bound (WPM turns a whole unknown word into one token).
size_t longest_token_bytes(const tokenizer::Tokenizer& tok);

struct BoundedTokens {
    std::vector<tokenizer::TokenId> ids;  // when not over
    bool over = false;                    // more than max_tokens
    bool by_size = false;                 // over: told by the text's size alone
    size_t at_least = 0;                  // over: tokens the text has at least
    bool counted_in_pieces = false;       // over: at_least is the pieces' count (about the whole's)
};

// Tokenizes text (as Tokenizer::tokenize) for a request that may use at most max_tokens tokens,
// charging the tokenizer's work to `memory` (may be nullptr). longest_token: from
// longest_token_bytes (0: no bound by size).
BoundedTokens tokenize_within(const tokenizer::Tokenizer& tok, std::string_view text, bool add_special,
                              bool parse_special, size_t max_tokens, size_t longest_token, RequestMemory* memory);

}  // namespace fitllm::server
