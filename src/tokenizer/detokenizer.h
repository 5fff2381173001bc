#pragma once
// Streaming detokenization: feed token ids one at a time as a model produces them, get back
// the text that is final so far. The concatenation of every feed() and the closing flush()
// equals Tokenizer::detokenize() of all the ids with the same flags.
//
// What is held back, and why:
//  - bytes of an unfinished UTF-8 sequence (a token may end inside a character, as byte
//    tokens and GPT-2 byte-level tokens do), until the sequence completes;
//  - with clean_spaces (most BPE and WPM vocabularies), a space that the next characters may
//    remove (" ?" -> "?", " 's" -> "'s");
//  - with remove_special, an EOS that would be dropped if it turns out to be the last token.
#include <string>

#include "tokenizer/tokenizer.h"

namespace fitllm::tokenizer {

class Detokenizer {
public:
    // The tokenizer must outlive the Detokenizer.
    Detokenizer(const Tokenizer& tokenizer, bool remove_special, bool unparse_special);

    // Text completed by this token (possibly empty). Throws VocabError for an unknown id.
    std::string feed(TokenId id);
    // Everything still held back, including an incomplete UTF-8 sequence as its raw bytes;
    // the Detokenizer is then ready for a new sequence.
    std::string flush();
    void reset();

private:
    // clean_up_tokenization_spaces as three chained filters, each holding back at most the
    // few characters its rule needs to see past.
    class SpaceCleaner {
    public:
        void push(char c, std::string& out);
        void finish(std::string& out);

    private:
        void stage2(char c, std::string& out);
        void stage3(char c, std::string& out);
        void finish2(std::string& out);
        void finish3(std::string& out);
        bool space1_ = false;  // stage 1: a held space
        std::string held2_;    // stage 2: "", " " or " '"
        std::string held3_;    // stage 3: "", " ", " '", " 'r" or " 'v"
    };

    void emit_piece(TokenId id, std::string& out);
    std::string release_complete_utf8();

    const Tokenizer& tokenizer_;
    bool remove_special_;
    bool unparse_special_;
    bool first_ = true;
    bool remove_space_ = false;
    bool eos_held_ = false;
    SpaceCleaner cleaner_;
    std::string pending_;  // cleaned bytes not yet returned (an unfinished UTF-8 sequence)
};

}  // namespace fitllm::tokenizer
