#pragma once
// Internal to tokenizer/: one Segmenter per vocabulary type turns a fragment of plain text
// (the text between special tokens, after the Tokenizer has split those out and applied any
// type-specific prefixing such as SPM's leading space) into token ids.
#include <memory>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace fitllm::tokenizer {

class Segmenter {
public:
    virtual ~Segmenter() = default;
    // Appends the ids of `fragment` to `out`. Must be safe to call from several threads at once.
    virtual void tokenize(std::string_view fragment, std::vector<TokenId>& out) const = 0;
};

// Each throws VocabError when the vocabulary cannot drive it (e.g. an unknown BPE pre-tokenizer).
std::unique_ptr<Segmenter> make_spm_segmenter(const Vocab& vocab);  // spm.cpp
std::unique_ptr<Segmenter> make_bpe_segmenter(const Vocab& vocab);  // bpe.cpp
std::unique_ptr<Segmenter> make_wpm_segmenter(const Vocab& vocab);  // wpm.cpp

}  // namespace fitllm::tokenizer
