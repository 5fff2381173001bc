#pragma once
// BPE pre-tokenization: before merging, text is cut into pieces ("words") by a list of regular
// expressions that tokenizer.ggml.pre selects, exactly as llama.cpp cuts it. Each expression
// of the list splits every piece the previous one produced into its matches and the unmatched
// stretches between them (both kept), so a later expression never sees across an earlier cut.
// Unicode categories (\p{L}, \p{N}, \p{P}) come from PCRE2; whitespace is llama.cpp's set
// (the Unicode White_Space property), which differs from PCRE2's own \s by U+180E.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fitllm::tokenizer {

// The distinct expression lists; several tokenizer.ggml.pre names share one.
enum class PreTokenizerType {
    standard,  // "default", or no tokenizer.ggml.pre at all
    llama3,    // Llama 3's tiktoken-style pattern, numbers in runs of up to three digits
    qwen2,     // the same pattern with single digits
    gpt2,      // GPT-2's original pattern
    falcon,
    deepseek_llm,
    deepseek_coder,
    starcoder,  // single digits, then GPT-2's pattern
    bloom,      // splits on spaces and a few punctuation marks only
    viking,     // bloom's, then single digits
    tekken,     // Mistral's: words split at case changes, single digits
    gpt4o,      // OpenAI's o200k (also Llama 4)
    deepseek3,  // DeepSeek V3: 3-digit numbers, CJK/kana runs, then words and punctuation
    seed_coder,
    qwen35,  // qwen2's with combining marks kept in words
};

std::string_view to_string(PreTokenizerType type);

// What tokenizer.ggml.pre = `name` means ("" means the default). Throws VocabError naming the
// value and listing the supported ones. (Whether merges are skipped for whole-token pieces,
// llama.cpp's ignore_merges, is a property of the Vocab.)
PreTokenizerType pre_tokenizer_type_for_name(std::string_view name);
std::vector<std::string_view> supported_pre_tokenizer_names();

// The expressions of one pre-tokenizer, compiled once (JIT where available). Thread-safe:
// split() keeps its matching state on its own stack.
class PreTokenizer {
public:
    explicit PreTokenizer(PreTokenizerType type);
    ~PreTokenizer();
    PreTokenizer(PreTokenizer&&) noexcept;
    PreTokenizer& operator=(PreTokenizer&&) noexcept;

    PreTokenizerType type() const { return type_; }

    // Appends the pieces of `text` to `pieces`, as views into `text`, in order and covering it
    // all. `text` must be what reencode_utf8_leniently() returns (well-formed UTF-8 is).
    void split(std::string_view text, std::vector<std::string_view>& pieces) const;

    // For tests and tools: re-encodes raw bytes the way llama.cpp reads them, then splits.
    std::vector<std::string> split_to_strings(std::string_view raw_text) const;

private:
    class Rule;
    PreTokenizerType type_;
    std::vector<std::unique_ptr<Rule>> rules_;
    uint32_t capture_pairs_ = 1;  // what one match-data block must hold for every rule
};

}  // namespace fitllm::tokenizer
