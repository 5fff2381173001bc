#pragma once
// A tokenizer's vocabulary as a GGUF file describes it (tokenizer.ggml.*): token texts, scores,
// types, BPE merges, special token ids and the flags that change how text is split. The data
// is copied out of the file, so a Vocab outlives the GgufFile it came from.
//
// Where llama.cpp patches the file's data at load time (end-of-turn tokens found by their
// text, per-model strip flags, defaults per vocabulary type), Vocab applies the same patches
// so that tokenizing with it gives llama.cpp's ids for the same file.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fitllm/error.h"
#include "gguf/gguf_reader.h"

namespace fitllm::tokenizer {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// A vocabulary the file describes inconsistently (names the key and what is wrong).
class VocabError : public Error {
public:
    using Error::Error;
};

// tokenizer.ggml.model: "llama" -> spm, "gpt2" -> bpe, "bert" -> wpm, "t5" -> ugm, "no_vocab" -> none.
enum class VocabType { none, spm, bpe, wpm, ugm, rwkv };

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
    undefined = 0,
    normal = 1,
    unknown = 2,
    control = 3,
    user_defined = 4,
    unused = 5,
    byte = 6
};

// What llama.cpp derives from a token's type plus its load-time patches (llama_token_attr):
// a bit set, because a token can be e.g. control and unused, or user-defined and rstrip.
enum TokenAttr : uint32_t {
    kAttrUndefined = 0,
    kAttrUnknown = 1u << 0,
    kAttrUnused = 1u << 1,
    kAttrNormal = 1u << 2,
    kAttrControl = 1u << 3,
    kAttrUserDefined = 1u << 4,
    kAttrByte = 1u << 5,
    kAttrNormalized = 1u << 6,
    kAttrLstrip = 1u << 7,  // a matched special token swallows the whitespace before it
    kAttrRstrip = 1u << 8,  // ... and after it
    kAttrSingleWord = 1u << 9,
};

struct SpecialTokens {
    TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken;
    TokenId pad = kNoToken, sep = kNoToken, mask = kNoToken, linefeed = kNoToken;
    // Fill-in-the-middle: prefix, suffix, middle, pad, repository, file separator.
    TokenId fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken;
    TokenId fim_pad = kNoToken, fim_rep = kNoToken, fim_sep = kNoToken;
};

class Vocab {
public:
    // Throws VocabError (or gguf::KeyError) naming the key that is missing or malformed.
    static Vocab from_gguf(const gguf::GgufFile& file);

    // Not copyable: ids_ holds views into texts_. Moving keeps the strings where they are.
    Vocab(const Vocab&) = delete;
    Vocab& operator=(const Vocab&) = delete;
    Vocab(Vocab&&) noexcept = default;
    Vocab& operator=(Vocab&&) noexcept = default;

    VocabType type() const { return type_; }
    const std::string& model_name() const { return model_name_; }  // tokenizer.ggml.model as written
    const std::string& pre() const { return pre_; }                // tokenizer.ggml.pre ("" if absent)
    size_t size() const { return texts_.size(); }
    bool valid(TokenId id) const { return id >= 0 && static_cast<size_t>(id) < texts_.size(); }

    const std::string& text(TokenId id) const { return texts_.at(static_cast<size_t>(id)); }
    float score(TokenId id) const { return scores_.empty() ? 0.0f : scores_.at(static_cast<size_t>(id)); }
    // The type as the file wrote it (before llama.cpp's patches; see attributes()).
    TokenType token_type(TokenId id) const;
    uint32_t attributes(TokenId id) const { return attrs_.at(static_cast<size_t>(id)); }
    bool has_attr(TokenId id, TokenAttr attr) const { return (attributes(id) & attr) != 0; }
    bool is_control(TokenId id) const { return has_attr(id, kAttrControl); }
    bool is_user_defined(TokenId id) const { return has_attr(id, kAttrUserDefined); }
    bool is_unknown(TokenId id) const { return has_attr(id, kAttrUnknown); }
    bool is_byte(TokenId id) const { return has_attr(id, kAttrByte); }
    bool is_unused(TokenId id) const { return has_attr(id, kAttrUnused); }
    bool is_normal(TokenId id) const { return has_attr(id, kAttrNormal); }
    TokenId find(std::string_view text) const;                     // kNoToken when absent
    size_t max_token_length() const { return max_token_length_; }  // bytes of the longest text

    // The token of one raw byte: "<0x0A>" (SPM byte fallback), else the one-byte text itself;
    // kNoToken when the vocabulary has neither.
    TokenId byte_token(uint8_t byte) const;
    // The byte an SPM byte token ("<0x41>") stands for.
    uint8_t byte_of(TokenId id) const;

    // BPE merge rank of the pair (left, right), lower merges first; -1 when the pair never merges.
    int merge_rank(std::string_view left, std::string_view right) const;
    size_t merge_count() const { return merge_ranks_.size(); }

    const SpecialTokens& special() const { return special_; }
    // End-of-generation tokens (eos, eot, eom and the texts llama.cpp knows end a turn).
    const std::vector<TokenId>& eog_tokens() const { return eog_; }
    bool is_eog(TokenId id) const;
    // Tokens matched as whole units in the input before splitting (control, user-defined and
    // unknown tokens), longest text first so that "<|im_start|>" wins over "<".
    const std::vector<TokenId>& partition_tokens() const { return partition_tokens_; }

    // Flags (with llama.cpp's defaults per vocabulary type when the file does not set them).
    bool add_bos() const { return add_bos_; }
    bool add_eos() const { return add_eos_; }
    bool add_sep() const { return add_sep_; }
    bool add_space_prefix() const { return add_space_prefix_; }
    bool remove_extra_whitespaces() const { return remove_extra_whitespaces_; }
    bool clean_spaces() const { return clean_spaces_; }
    // BPE: a pre-tokenized word that is itself a token is taken whole (llama3, tekken, ...).
    bool ignore_merges() const { return ignore_merges_; }
    // Spaces are written as U+2581 in token texts (SPM; SPM-style BPE such as gemma4).
    bool escape_whitespaces() const { return escape_whitespaces_; }
    // WPM (BertNormalizer) options.
    bool lowercase() const { return lowercase_; }
    bool strip_accents() const { return strip_accents_; }

private:
    Vocab() = default;
    void load_type_and_flags(const gguf::GgufFile& file);
    void load_tokens(const gguf::GgufFile& file);
    void load_merges(const gguf::GgufFile& file);
    void load_special_ids(const gguf::GgufFile& file);
    void apply_text_patches(const gguf::GgufFile& file);
    void find_linefeed();
    void build_partition_tokens();

    struct StringHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };

    VocabType type_ = VocabType::none;
    std::string model_name_;
    std::string pre_;
    std::vector<std::string> texts_;
    std::vector<float> scores_;
    std::vector<TokenType> types_;
    std::vector<uint32_t> attrs_;
    std::unordered_map<std::string_view, TokenId> ids_;  // views into texts_ (stable: never resized after load)
    std::unordered_map<std::string, int, StringHash, std::equal_to<>> merge_ranks_;  // key: left + ' ' + right
    SpecialTokens special_;
    std::vector<TokenId> eog_;
    std::vector<TokenId> partition_tokens_;
    size_t max_token_length_ = 0;
    bool add_bos_ = false;
    bool add_eos_ = false;
    bool add_sep_ = false;
    bool add_space_prefix_ = false;
    bool remove_extra_whitespaces_ = false;
    bool clean_spaces_ = false;
    bool ignore_merges_ = false;
    bool escape_whitespaces_ = true;
    bool lowercase_ = true;
    bool strip_accents_ = true;
};

}  // namespace fitllm::tokenizer
