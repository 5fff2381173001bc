#pragma once
// Text to token ids and back, exactly as llama.cpp does it for the same GGUF file
// (llama_tokenize, llama_token_to_piece, llama_detokenize).
//
//   const auto file = gguf::GgufFile::open(path);
//   const Tokenizer tok = Tokenizer::from_gguf(file);
//   std::vector<TokenId> ids = tok.tokenize("Hello", /*add_special=*/true, /*parse_special=*/false);
//   std::string text = tok.detokenize(ids, /*remove_special=*/true, /*unparse_special=*/false);
//
// A Tokenizer is immutable after construction and safe to use from several threads at once.
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace fitllm::tokenizer {

class Segmenter;
class SpecialTokenMatcher;

class Tokenizer {
public:
    // Throws VocabError when the file's vocabulary is malformed or of a type fitllm cannot
    // tokenize (UGM, RWKV), naming the key.
    static Tokenizer from_gguf(const gguf::GgufFile& file);
    explicit Tokenizer(Vocab vocab);
    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;

    const Vocab& vocab() const { return *vocab_; }

    // add_special: add BOS/EOS (SPM, BPE: as the file's add_bos/add_eos say; WPM: CLS and SEP).
    // parse_special: text that spells a control token ("<start_of_turn>") becomes that token;
    // user-defined tokens are matched either way.
    std::vector<TokenId> tokenize(std::string_view text, bool add_special, bool parse_special) const;

    // The bytes a token stands for. special: render control and unknown tokens as their text
    // (otherwise they render as nothing). Throws VocabError for an id outside the vocabulary.
    std::string token_to_piece(TokenId id, bool special) const;
    // As above, dropping up to `lstrip` leading spaces (llama.cpp's lstrip argument).
    std::string token_to_piece(TokenId id, bool special, int lstrip) const;

    // remove_special: drop a leading BOS and a trailing EOS where the vocabulary adds them.
    // unparse_special: render control tokens as their text. Applies llama.cpp's SPM
    // leading-space removal and clean_spaces rules.
    std::string detokenize(std::span<const TokenId> ids, bool remove_special, bool unparse_special) const;

private:
    void check_id(TokenId id) const;
    void append_fragment_tokens(std::string_view fragment, bool prefix_space, std::vector<TokenId>& out) const;

    std::unique_ptr<const Vocab> vocab_;  // on the heap: the segmenter keeps a reference to it
    std::unique_ptr<const Segmenter> segmenter_;
    std::unique_ptr<const SpecialTokenMatcher> matcher_;
    std::vector<std::string> pieces_;  // token_to_piece(id, special=true) for every id
};

// llama.cpp's clean_up_tokenization_spaces for detokenized text: " ?" -> "?", " ' " -> "'",
// " 's" -> "'s" and so on. Exposed for the streaming Detokenizer and its tests.
std::string clean_up_tokenization_spaces(std::string text);

}  // namespace fitllm::tokenizer
