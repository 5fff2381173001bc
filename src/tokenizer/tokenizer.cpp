// The public tokenizer: special-token partition, per-type framing (BOS/EOS, SPM's leading
// space and U+2581 escaping) around the segmenters, and the way back to bytes.
// The order of steps and every flag follow llama.cpp's llama_vocab::impl::tokenize,
// token_to_piece and detokenize.
#include "tokenizer/tokenizer.h"

#include <cstdio>

#include "tokenizer/segmenter.h"
#include "tokenizer/special_partition.h"
#include "tokenizer/unicode.h"

namespace fitllm::tokenizer {
namespace {

constexpr std::string_view kEscapedSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

std::string escape_spaces(std::string_view text) {
    std::string out;
    out.reserve(text.size() + text.size() / 4);
    for (char c : text) {
        if (c == ' ') {
            out += kEscapedSpace;
        } else {
            out += c;
        }
    }
    return out;
}

std::string unescape_spaces(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        if (text.compare(i, kEscapedSpace.size(), kEscapedSpace) == 0) {
            out += ' ';
            i += kEscapedSpace.size();
        } else {
            out += text[i++];
        }
    }
    return out;
}

// Whether GPT-2's byte-to-unicode mapping produces this code point: printable Latin-1
// stands for itself, the other 68 bytes were moved to U+0100..U+0143.
bool is_gpt2_byte_char(char32_t cp) {
    return (cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF) ||
           (cp >= 0x100 && cp < 0x100 + 68);
}

// llama_decode_text: each code point back to its byte; one outside the mapping is spelled out
// the way llama.cpp does (including its habit of repeating the whole token text).
std::string decode_gpt2_text(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
        const size_t start = pos;
        const char32_t cp = utf8_decode(text, pos);
        const std::string_view utf8 = text.substr(start, pos - start);
        if (is_gpt2_byte_char(cp)) {
            out += gpt2_unicode_to_bytes(utf8);
            continue;
        }
        out += "[UNK_BYTE_0x";
        for (char c : utf8_encode(cp)) {
            char hex[3];
            std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned>(static_cast<uint8_t>(c)));
            out += hex;
        }
        out += text;
        out += ']';
    }
    return out;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const gguf::GgufFile& file) {
    try {
        return Tokenizer(Vocab::from_gguf(file));
    } catch (const VocabError& e) {
        const std::string what = e.what();
        if (what.rfind(file.source(), 0) == 0) throw;
        throw VocabError(file.source() + ": " + what);
    }
}

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::make_unique<const Vocab>(std::move(vocab))) {
    const Vocab& v = *vocab_;
    switch (v.type()) {
        case VocabType::spm:
            segmenter_ = make_spm_segmenter(v);
            break;
        case VocabType::bpe:
            segmenter_ = make_bpe_segmenter(v);
            break;
        case VocabType::wpm:
            segmenter_ = make_wpm_segmenter(v);
            break;
        case VocabType::none:
            break;
        case VocabType::ugm:
        case VocabType::rwkv:
            throw VocabError("tokenizer.ggml.model: '" + v.model_name() + "' vocabularies are not supported yet");
    }
    matcher_ = std::make_unique<const SpecialTokenMatcher>(v);

    // Pieces as llama.cpp caches them (special = true); token_to_piece() hides control and
    // unknown tokens on top when asked to.
    pieces_.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        const auto id = static_cast<TokenId>(i);
        const uint32_t attr = v.attributes(id);
        const std::string& text = v.text(id);
        std::string& piece = pieces_[i];
        if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
            piece = text;
        } else if (attr & kAttrNormal) {
            const bool byte_level = v.type() == VocabType::bpe && !v.escape_whitespaces();
            piece = byte_level ? decode_gpt2_text(text) : unescape_spaces(text);
        } else if ((attr & kAttrByte) && v.type() != VocabType::wpm) {
            piece = std::string(1, static_cast<char>(v.byte_of(id)));
        }
        // Anything else (undefined, unused) renders as nothing, as in llama.cpp.
    }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::append_fragment_tokens(std::string_view fragment, bool prefix_space, std::vector<TokenId>& out) const {
    const Vocab& v = *vocab_;
    switch (v.type()) {
        case VocabType::spm: {
            std::string text = prefix_space ? std::string(kEscapedSpace) : std::string();
            text += escape_spaces(fragment);
            segmenter_->tokenize(text, out);
            break;
        }
        case VocabType::bpe:
            if (v.escape_whitespaces()) {
                segmenter_->tokenize(escape_spaces(fragment), out);
            } else {
                segmenter_->tokenize(fragment, out);
            }
            break;
        default:
            segmenter_->tokenize(fragment, out);
    }
}

std::vector<TokenId> Tokenizer::tokenize(std::string_view text, bool add_special, bool parse_special) const {
    const Vocab& v = *vocab_;
    const SpecialTokens& special = v.special();
    std::vector<TokenId> out;
    if (v.type() == VocabType::none) return out;
    out.reserve(text.size() / 3 + 4);
    const std::vector<Fragment> fragments = matcher_->partition(text, parse_special);

    const bool wpm = v.type() == VocabType::wpm;
    // WPM frames every sequence as [CLS] ... [SEP] whatever the add_* flags say.
    if (add_special && (v.add_bos() || wpm)) {
        if (special.bos == kNoToken) throw VocabError("tokenize: the vocabulary adds BOS but has no BOS token");
        out.push_back(special.bos);
    }
    // SPM: a text fragment at the start or right after a special token gets a leading space.
    bool after_special = true;
    for (const Fragment& f : fragments) {
        if (f.is_text()) {
            const bool prefix = v.type() == VocabType::spm && v.add_space_prefix() && after_special;
            append_fragment_tokens(text.substr(f.offset, f.length), prefix, out);
            after_special = false;
        } else {
            out.push_back(f.token);
            after_special = true;
        }
    }
    if (add_special && wpm) {
        if (special.sep == kNoToken) throw VocabError("tokenize: a WPM vocabulary needs a SEP token");
        out.push_back(special.sep);
    } else if (add_special && v.add_eos()) {
        if (special.eos == kNoToken) throw VocabError("tokenize: the vocabulary adds EOS but has no EOS token");
        out.push_back(special.eos);
    }
    return out;
}

void Tokenizer::check_id(TokenId id) const {
    if (!vocab_->valid(id))
        throw VocabError("token id " + std::to_string(id) + " is outside the vocabulary (" +
                         std::to_string(vocab_->size()) + " tokens)");
}

std::string Tokenizer::token_to_piece(TokenId id, bool special) const {
    return token_to_piece(id, special, 0);
}

std::string Tokenizer::token_to_piece(TokenId id, bool special, int lstrip) const {
    check_id(id);
    if (!special && (vocab_->attributes(id) & (kAttrUnknown | kAttrControl))) return {};
    std::string_view piece = pieces_[static_cast<size_t>(id)];
    for (int i = 0; i < lstrip && !piece.empty() && piece.front() == ' '; ++i) piece.remove_prefix(1);
    return std::string(piece);
}

std::string Tokenizer::detokenize(std::span<const TokenId> ids, bool remove_special, bool unparse_special) const {
    const Vocab& v = *vocab_;
    if (v.type() == VocabType::none) return {};
    // The space SPM put in front of the text comes off again, unless a BOS is being removed
    // (llama.cpp's rule, kept as is).
    bool remove_space = v.add_space_prefix();
    if (remove_special && v.add_bos() && !ids.empty() && ids.front() == v.special().bos) {
        remove_space = false;
        ids = ids.subspan(1);
    }
    if (remove_special && v.add_eos() && !ids.empty() && ids.back() == v.special().eos) ids = ids.first(ids.size() - 1);

    std::string text;
    for (TokenId id : ids) {
        text += token_to_piece(id, unparse_special, remove_space ? 1 : 0);
        remove_space = false;
    }
    if (v.clean_spaces()) text = clean_up_tokenization_spaces(std::move(text));
    return text;
}

std::string clean_up_tokenization_spaces(std::string text) {
    // Three passes over the text, each compacting it in place like llama.cpp's. Reads of
    // text[i - 1] see the pass's input: writes only ever go to indexes below i.
    size_t n = text.size();
    // 1. " ?", " !", " .", " ," lose the space.
    size_t total = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
        const char x = text[i];
        if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
        text[total++] = x;
    }
    // 2. " ' " becomes "'" (a lone apostrophe between spaces).
    n = total;
    total = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
        const char x = text[i];
        if (x == '\'' && i + 1 < n && text[i - 1] == ' ' && text[i + 1] == ' ') {
            --total;
            text[++i] = '\0';  // the space after is skipped, and is no longer a space to what follows
        }
        text[total++] = x;
    }
    // 3. " 's", " 'm", " 're", " 've" lose the space; " 't", " 'd", " 'll" keep it.
    n = total;
    total = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
        const char x = text[i];
        if (text[i - 1] == ' ' && x == '\'' && i + 1 < n) {
            const char x1 = text[i + 1];
            if (x1 == 's' || x1 == 'm') {
                --total;
            } else if (x1 != 't' && x1 != 'd' && i + 2 < n) {
                const char x2 = text[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
            }
        }
        text[total++] = x;
    }
    text.resize(total);
    return text;
}

}  // namespace fitllm::tokenizer
