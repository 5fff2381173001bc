#include "tokenizer/detokenizer.h"

#include "tokenizer/unicode.h"

namespace fitllm::tokenizer {

Detokenizer::Detokenizer(const Tokenizer& tokenizer, bool remove_special, bool unparse_special)
    : tokenizer_(tokenizer), remove_special_(remove_special), unparse_special_(unparse_special) {
    reset();
}

void Detokenizer::reset() {
    first_ = true;
    remove_space_ = tokenizer_.vocab().add_space_prefix();
    eos_held_ = false;
    cleaner_ = SpaceCleaner{};
    pending_.clear();
}

void Detokenizer::emit_piece(TokenId id, std::string& out) {
    const std::string piece = tokenizer_.token_to_piece(id, unparse_special_, remove_space_ ? 1 : 0);
    remove_space_ = false;
    if (!tokenizer_.vocab().clean_spaces()) {
        out += piece;
        return;
    }
    for (char c : piece) cleaner_.push(c, out);
}

std::string Detokenizer::feed(TokenId id) {
    const Vocab& vocab = tokenizer_.vocab();
    if (!vocab.valid(id)) tokenizer_.token_to_piece(id, true);  // throws the usual VocabError
    if (vocab.type() == VocabType::none) return {};
    const bool first = first_;
    first_ = false;
    if (first && remove_special_ && vocab.add_bos() && id == vocab.special().bos) {
        remove_space_ = false;  // as llama_detokenize: removing BOS keeps the text's first space
        return {};
    }
    if (eos_held_) {
        eos_held_ = false;
        emit_piece(vocab.special().eos, pending_);
    }
    if (remove_special_ && vocab.add_eos() && id == vocab.special().eos) {
        eos_held_ = true;  // dropped if it is the last token
    } else {
        emit_piece(id, pending_);
    }
    return release_complete_utf8();
}

std::string Detokenizer::flush() {
    eos_held_ = false;
    if (tokenizer_.vocab().clean_spaces()) cleaner_.finish(pending_);
    std::string out = std::move(pending_);
    reset();
    return out;
}

std::string Detokenizer::release_complete_utf8() {
    // Find where the last sequence starts; hold it back only if its lead byte announces more
    // bytes than have arrived (anything malformed is passed on as it is).
    size_t start = pending_.size();
    for (size_t back = 0; back < 4 && start > 0; ++back) {
        const auto byte = static_cast<uint8_t>(pending_[start - 1]);
        --start;
        if ((byte & 0xC0) != 0x80) break;  // not a continuation byte: a lead byte or ASCII
    }
    size_t keep = 0;
    if (start < pending_.size()) {
        const auto lead = static_cast<uint8_t>(pending_[start]);
        const size_t have = pending_.size() - start;
        const size_t want = lead >= 0xF0 && lead <= 0xF4   ? 4
                            : lead >= 0xE0 && lead <= 0xEF ? 3
                            : lead >= 0xC2 && lead <= 0xDF ? 2
                                                           : 1;
        bool continuations_ok = true;
        for (size_t i = start + 1; i < pending_.size(); ++i)
            continuations_ok = continuations_ok && (static_cast<uint8_t>(pending_[i]) & 0xC0) == 0x80;
        if (want > have && continuations_ok) keep = have;
    }
    std::string out = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return out;
}

// Stage 1: a space followed by ? ! . or , goes.
void Detokenizer::SpaceCleaner::push(char c, std::string& out) {
    if (space1_) {
        space1_ = false;
        if (c != '?' && c != '!' && c != '.' && c != ',') stage2(' ', out);
    }
    if (c == ' ') {
        space1_ = true;
    } else {
        stage2(c, out);
    }
}

// Stage 2: " ' " becomes "'"; the space it swallows cannot start another match.
void Detokenizer::SpaceCleaner::stage2(char c, std::string& out) {
    if (held2_ == " '") {
        held2_.clear();
        if (c == ' ') {
            stage3('\'', out);
            return;
        }
        stage3(' ', out);
        stage3('\'', out);
    } else if (held2_ == " ") {
        if (c == '\'') {
            held2_ = " '";
            return;
        }
        held2_.clear();
        stage3(' ', out);
    }
    if (c == ' ') {
        held2_ = " ";
    } else {
        stage3(c, out);
    }
}

// Stage 3: " 's", " 'm", " 're", " 've" lose the space.
void Detokenizer::SpaceCleaner::stage3(char c, std::string& out) {
    if (held3_ == " ") {
        if (c == '\'') {
            held3_ = " '";
            return;
        }
        out += ' ';
        held3_.clear();
    } else if (held3_ == " '") {
        if (c == 's' || c == 'm') {
            out += '\'';
            out += c;
            held3_.clear();
            return;
        }
        if (c == 'r' || c == 'v') {
            held3_ += c;
            return;
        }
        out += held3_;
        held3_.clear();
    } else if (!held3_.empty()) {  // " 'r" or " 'v"
        if (c == 'e') {
            out.append(held3_, 1);
            out += c;
            held3_.clear();
            return;
        }
        out += held3_;
        held3_.clear();
    }
    if (c == ' ') {
        held3_ = " ";
    } else {
        out += c;
    }
}

void Detokenizer::SpaceCleaner::finish(std::string& out) {
    if (space1_) {
        space1_ = false;
        stage2(' ', out);
    }
    finish2(out);
}

void Detokenizer::SpaceCleaner::finish2(std::string& out) {
    const std::string held = std::move(held2_);
    held2_.clear();
    for (char c : held) stage3(c, out);
    finish3(out);
}

void Detokenizer::SpaceCleaner::finish3(std::string& out) {
    out += held3_;
    held3_.clear();
}

}  // namespace fitllm::tokenizer
