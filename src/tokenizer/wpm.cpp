// WordPiece (BERT) as llama.cpp runs it (llm_tokenizer_wpm): BertNormalizer-style
// pre-processing into words, then for each word the longest vocabulary match from the left,
// over and over; a word that cannot be covered completely becomes the unknown token.
// GGUF BERT vocabularies mark word starts with U+2581 instead of marking continuations
// with "##", so each word is looked up with a leading U+2581.
#include <utf8proc.h>

#include "tokenizer/segmenter.h"
#include "tokenizer/unicode.h"

namespace fitllm::tokenizer {
namespace {

constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581

// Unicode's White_Space property (what llama.cpp tests as is_whitespace).
bool is_white_space(char32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

// The CJK ideograph blocks BERT splits into single characters (as HF's tokenizers has them,
// including its 0x2B920 start where the block really starts at 0x2B820).
bool is_cjk_ideograph(char32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

enum class CharClass { other, control, accent_mark, punctuation, symbol };

CharClass classify(char32_t cp) {
    switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
        case UTF8PROC_CATEGORY_CC:
        case UTF8PROC_CATEGORY_CF:
        case UTF8PROC_CATEGORY_CS:
        case UTF8PROC_CATEGORY_CO:
            return CharClass::control;
        case UTF8PROC_CATEGORY_MN:
        case UTF8PROC_CATEGORY_MC:
        case UTF8PROC_CATEGORY_ME:
            return CharClass::accent_mark;
        case UTF8PROC_CATEGORY_PC:
        case UTF8PROC_CATEGORY_PD:
        case UTF8PROC_CATEGORY_PS:
        case UTF8PROC_CATEGORY_PE:
        case UTF8PROC_CATEGORY_PI:
        case UTF8PROC_CATEGORY_PF:
        case UTF8PROC_CATEGORY_PO:
            return CharClass::punctuation;
        case UTF8PROC_CATEGORY_SM:
        case UTF8PROC_CATEGORY_SC:
        case UTF8PROC_CATEGORY_SK:
        case UTF8PROC_CATEGORY_SO:
            return CharClass::symbol;
        default:
            return CharClass::other;
    }
}

// llama.cpp's "NFD" keeps only the first code point of each character's canonical
// decomposition ("é" -> "e"); with accent marks dropped afterwards, that is accent stripping.
char32_t decompose_first(char32_t cp) {
    utf8proc_int32_t buffer[8];
    int boundclass = 0;
    const utf8proc_ssize_t n =
        utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buffer, 8, UTF8PROC_DECOMPOSE, &boundclass);
    return n >= 1 ? static_cast<char32_t>(buffer[0]) : cp;
}

class WpmSegmenter final : public Segmenter {
public:
    explicit WpmSegmenter(const Vocab& vocab) : vocab_(vocab) {}

    void tokenize(std::string_view fragment, std::vector<TokenId>& out) const override {
        std::string word(kWordStart);
        for (size_t pos = 0; pos <= fragment.size();) {
            if (pos == fragment.size()) {
                finish_word(word, out);
                break;
            }
            char32_t cp = utf8_decode(fragment, pos);
            if (vocab_.strip_accents()) cp = decompose_first(cp);
            if (is_white_space(cp)) {
                finish_word(word, out);
                continue;
            }
            const CharClass cls = classify(cp);
            if (cp == 0 || cp == kReplacementChar || cls == CharClass::control) continue;
            if (vocab_.strip_accents() && cls == CharClass::accent_mark) continue;
            const char32_t cased =
                vocab_.lowercase() ? static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))) : cp;
            if (cls == CharClass::punctuation || (cp < 0x7F && cls == CharClass::symbol) || is_cjk_ideograph(cp)) {
                finish_word(word, out);
                utf8_append(word, cased);
                finish_word(word, out);
            } else {
                utf8_append(word, cased);
            }
        }
    }

private:
    // Tokenizes the word collected in `word` (U+2581 + text) and resets it to U+2581.
    void finish_word(std::string& word, std::vector<TokenId>& out) const {
        if (word.size() == kWordStart.size()) return;
        const size_t first_token = out.size();
        const size_t n = word.size();
        const size_t max_length = vocab_.max_token_length();
        for (size_t i = 0; i < n;) {
            bool matched = false;
            for (size_t j = std::min(n, i + max_length + 1); j > i; --j) {
                const TokenId id = vocab_.find(std::string_view(word).substr(i, j - i));
                if (id != kNoToken) {
                    out.push_back(id);
                    i = j;
                    matched = true;
                    break;
                }
            }
            if (!matched) {
                out.resize(first_token);
                break;
            }
        }
        if (out.size() == first_token) out.push_back(vocab_.special().unk);
        word.resize(kWordStart.size());
    }

    const Vocab& vocab_;
};

}  // namespace

std::unique_ptr<Segmenter> make_wpm_segmenter(const Vocab& vocab) {
    if (vocab.special().unk == kNoToken)
        throw VocabError("WPM vocabulary without an unknown token (tokenizer.ggml.unknown_token_id)");
    return std::make_unique<WpmSegmenter>(vocab);
}

}  // namespace fitllm::tokenizer
