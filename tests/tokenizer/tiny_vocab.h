#pragma once
// Small vocabularies written as in-memory GGUF files, for tokenizer unit tests.
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"

namespace fitllm::tokenizer::tiny {

struct TinyVocabSpec {
    std::string model = "llama";
    std::vector<std::string> tokens;
    std::vector<float> scores;        // empty: no scores key
    std::vector<int32_t> types;       // empty: no token_type key
    std::vector<std::string> merges;  // empty: no merges key
    // Anything else (special ids, flags), written after the arrays.
    std::function<void(gguf::GgufWriter&)> extra;
};

// Owns the bytes the parsed file points into.
class TinyGguf {
public:
    explicit TinyGguf(const TinyVocabSpec& spec)
        : bytes_(write(spec)), file_(gguf::GgufFile::parse(bytes_, "tiny.gguf")) {}
    const gguf::GgufFile& file() const { return file_; }

private:
    static std::vector<std::byte> write(const TinyVocabSpec& spec) {
        gguf::GgufWriter w;
        w.add_string("general.architecture", "llama");
        w.add_string("tokenizer.ggml.model", spec.model);
        w.add_string_array("tokenizer.ggml.tokens", std::span<const std::string>(spec.tokens));
        if (!spec.scores.empty()) w.add_array<float>("tokenizer.ggml.scores", spec.scores);
        if (!spec.types.empty()) w.add_array<int32_t>("tokenizer.ggml.token_type", spec.types);
        if (!spec.merges.empty())
            w.add_string_array("tokenizer.ggml.merges", std::span<const std::string>(spec.merges));
        if (spec.extra) spec.extra(w);
        return w.to_bytes();
    }
    std::vector<std::byte> bytes_;
    gguf::GgufFile file_;
};

// A SentencePiece-style vocabulary: <unk> <s> </s>, optionally the 256 byte tokens, then
// `pieces` with their scores (all normal tokens).
inline TinyVocabSpec spm_spec(const std::vector<std::pair<std::string, float>>& pieces, bool byte_tokens = true) {
    TinyVocabSpec spec;
    spec.tokens = {"<unk>", "<s>", "</s>"};
    spec.scores = {0, 0, 0};
    spec.types = {2, 3, 3};
    if (byte_tokens) {
        static constexpr char kHex[] = "0123456789ABCDEF";
        for (int b = 0; b < 256; ++b) {
            spec.tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
            spec.scores.push_back(0);
            spec.types.push_back(6);
        }
    }
    for (const auto& [text, score] : pieces) {
        spec.tokens.push_back(text);
        spec.scores.push_back(score);
        spec.types.push_back(1);
    }
    return spec;
}

}  // namespace fitllm::tokenizer::tiny
