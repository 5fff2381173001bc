#pragma once
// A tokenizer's vocabulary as a GGUF file describes it (tokenizer.ggml.*): token texts, scores,
// types, BPE merges, special token ids and the flags that change how text is split. The data
// is copied out of the file, so a Vocab outlives the GgufFile it came from.
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
enum class TokenType : int32_t { undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

struct SpecialTokens {
    TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken;
    TokenId pad = kNoToken, sep = kNoToken, mask = kNoToken, linefeed = kNoToken;
};

class Vocab {
public:
    // Throws VocabError (or gguf::KeyError) naming the key that is missing or malformed.
    static Vocab from_gguf(const gguf::GgufFile& file);

    VocabType type() const { return type_; }
    const std::string& model_name() const { return model_name_; }  // tokenizer.ggml.model as written
    const std::string& pre() const { return pre_; }                // tokenizer.ggml.pre ("" if absent)
    size_t size() const { return texts_.size(); }
    bool valid(TokenId id) const { return id >= 0 && static_cast<size_t>(id) < texts_.size(); }

    const std::string& text(TokenId id) const { return texts_.at(static_cast<size_t>(id)); }
    float score(TokenId id) const { return scores_.empty() ? 0.0f : scores_.at(static_cast<size_t>(id)); }
    TokenType token_type(TokenId id) const;
    bool is_control(TokenId id) const { return token_type(id) == TokenType::control; }
    TokenId find(std::string_view text) const;  // kNoToken when absent

    // BPE merge rank of the pair (left, right), lower merges first; -1 when the pair never merges.
    int merge_rank(std::string_view left, std::string_view right) const;
    size_t merge_count() const { return merge_ranks_.size(); }

    const SpecialTokens& special() const { return special_; }
    // Tokens matched as whole units in the input before splitting (control, user-defined and
    // unknown tokens), longest text first so that "<|im_start|>" wins over "<".
    const std::vector<TokenId>& partition_tokens() const { return partition_tokens_; }

    // Flags (with llama.cpp's defaults per vocabulary type when the file does not set them).
    bool add_bos() const { return add_bos_; }
    bool add_eos() const { return add_eos_; }
    bool add_space_prefix() const { return add_space_prefix_; }
    bool remove_extra_whitespaces() const { return remove_extra_whitespaces_; }
    bool clean_spaces() const { return clean_spaces_; }

private:
    VocabType type_ = VocabType::none;
    std::string model_name_;
    std::string pre_;
    std::vector<std::string> texts_;
    std::vector<float> scores_;
    std::vector<TokenType> types_;
    std::unordered_map<std::string_view, TokenId> ids_;  // views into texts_ (stable: never resized after load)
    std::unordered_map<std::string, int> merge_ranks_;  // key: left + ' ' + right
    SpecialTokens special_;
    std::vector<TokenId> partition_tokens_;
    bool add_bos_ = false;
    bool add_eos_ = false;
    bool add_space_prefix_ = false;
    bool remove_extra_whitespaces_ = false;
    bool clean_spaces_ = true;
};

}  // namespace fitllm::tokenizer
