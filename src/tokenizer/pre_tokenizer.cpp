#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <stdexcept>

#include "fitllm/error.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace fitllm::tokenizer {
namespace {

// ---------------------------------------------------------------------------------------------
// The expressions. They are llama.cpp's (which took them from each model's tokenizer.json), in a
// dialect where \s and \S mean llama.cpp's whitespace: the Unicode White_Space property, as the
// table llama.cpp generates with Python's `regex` module. PCRE2's own \s adds U+180E.
//
// How llama.cpp runs them, and what that means here:
// - GPT-2's and Llama 3's patterns run through hand-written splitters that behave like the
//   pattern (GPT-2's with a final `|\s+`, which only changes what counts as a gap, never a cut).
// - Every other pattern runs through std::regex over one code point per character, where a
//   non-ASCII whitespace character has first been replaced by U+000B. An explicit character
//   range that spans such a character (U+3000 in `　-。`, U+1680..U+3000 in `ࠀ-一`) therefore
//   never matches it there; the ranges below leave those characters out to keep that.
// - Patterns with \p{..} see the text "collapsed" to one byte per category, with ASCII kept:
//   the same as matching categories directly, so PCRE2's \p{L}/\p{N}/\p{P} stand in for them.
// - std::regex's `$` matches only at the very end (PCRE2_DOLLAR_ENDONLY), and its \d is ASCII
//   only, so the dialect rejects \d, \w and \b rather than let PCRE2_UCP widen them.
// - llama.cpp rewrote patterns that need \p{Lu}/\p{Ll} (which the collapsed form cannot tell
//   apart) with lookaheads: "an uppercase letter" became "a letter that is not a-z", so every
//   non-ASCII letter counts as both cases. Those rewrites are used here as they are.
// Every list was checked against llama.cpp itself (PyPI llama-cpp-python 0.3.36): the goldens
// of bpe_test.cpp, and while writing this, 60k random strings of mixed scripts, whitespace and
// malformed bytes per pre-tokenizer name, with no difference.
// ---------------------------------------------------------------------------------------------

// The patterns read best one alternative group per line.
// clang-format off
constexpr std::string_view kGpt2Pattern =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";

// The case-insensitive contractions of the patterns derived from tiktoken's, with the cases
// spelled out because llama.cpp does: a (?i:...) group would also match U+017F (long s)
// through Unicode case folding, as Python's `regex` does with the tokenizer.json original.
#define FITLLM_CONTRACTIONS R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))re"

constexpr std::string_view kLlama3Pattern =
    FITLLM_CONTRACTIONS R"re(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})re"
    R"re(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

constexpr std::string_view kQwen2Pattern =
    FITLLM_CONTRACTIONS R"re(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})re"
    R"re(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// Mistral's tekken: words split where lowercase turns to uppercase, single digits.
constexpr std::string_view kTekkenPattern =
    R"re([^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+)re"
    R"re(|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*)re"
    R"re(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// OpenAI's o200k (gpt-4o, Llama 4): tekken's words with contractions attached, 3-digit numbers.
constexpr std::string_view kGpt4oPattern =
    R"re([^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+)re" FITLLM_CONTRACTIONS "?"
    R"re(|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*)re" FITLLM_CONTRACTIONS "?"
    R"re(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// DeepSeek V3: an ASCII punctuation mark glued to the ASCII word after it, letters with their
// combining marks, runs of punctuation and symbols.
constexpr std::string_view kDeepseek3Words =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)re"
    R"re(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

constexpr std::string_view kSeedCoderPattern =
    FITLLM_CONTRACTIONS R"re(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// Qwen 3.5: Qwen 2's pattern with combining marks kept in words.
constexpr std::string_view kQwen35Pattern =
    FITLLM_CONTRACTIONS R"re(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*)re"
    R"re(|\s*[\r\n]+|\s+(?!\S)|\s+)re";

#undef FITLLM_CONTRACTIONS

// DeepSeek LLM's letters: the cased letters (Lu, Ll, Lt) of the Unicode version its tokenizer
// was made with, as ranges.
constexpr std::string_view kDeepseekLlmLetters =
    R"re(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})re"
    R"re(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})re"
    R"re(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})re"
    R"re(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})re"
    R"re(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})re"
    R"re(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D})re"
    R"re(\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3})re"
    R"re(\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})re"
    R"re(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D})re"
    R"re(\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184})re"
    R"re(\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D})re"
    R"re(\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF})re"
    R"re(\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F})re"
    R"re(\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})re"
    R"re(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)re";

// ASCII and fullwidth punctuation, curly quotes, and U+3001..U+3002 (the tokenizer's range
// starts at U+3000, the ideographic space, which llama.cpp's std::regex never sees; see above).
constexpr std::string_view kDeepseekLlmPunctuation =
    R"re(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3001}-\x{3002}]+)re";

// CJK ideographs, U+0800..U+4E00 and Hangul: the tokenizer's `[一-龥ࠀ-一가-퟿]+` without the
// whitespace characters inside U+0800..U+4E00, for the reason above.
constexpr std::string_view kDeepseekCjk =
    R"re([\x{4E00}-\x{9FA5}\x{800}-\x{167F}\x{1681}-\x{1FFF}\x{200B}-\x{2027}\x{202A}-\x{202E})re"
    R"re(\x{2030}-\x{205E}\x{2060}-\x{2FFF}\x{3001}-\x{4E00}\x{AC00}-\x{D7FF}]+)re";

// `\s+$`, written so that a long run of whitespace before a non-space costs linear time rather
// than quadratic: both match exactly the piece's trailing run of whitespace.
constexpr std::string_view kTrailingWhitespace =
    R"re((?<!\s)\s++$)re";

constexpr std::string_view kBloomPattern =
    R"re( ?[^(\s|.,!?…。，、।۔،)]+)re";

// clang-format on

std::vector<std::string_view> patterns_for(PreTokenizerType type) {
    switch (type) {
        case PreTokenizerType::standard:
            return {R"re([\p{P}\$\+<=>\^~\|]+)re", kGpt2Pattern, R"re(\p{N}+)re", "[0-9][0-9][0-9]"};
        case PreTokenizerType::llama3:
            return {kLlama3Pattern};
        case PreTokenizerType::qwen2:
            return {kQwen2Pattern};
        case PreTokenizerType::gpt2:
            return {kGpt2Pattern};
        case PreTokenizerType::falcon:
            return {R"re([\p{P}\$\+<=>\^~\|`]+)re", kGpt2Pattern, "[0-9][0-9][0-9]"};
        case PreTokenizerType::deepseek_llm:
            return {"[\\r\\n]",          kDeepseekLlmLetters, kDeepseekLlmPunctuation,
                    kTrailingWhitespace, kDeepseekCjk,        R"re(\p{N}+)re"};
        case PreTokenizerType::deepseek_coder:
            return {"[\\r\\n]", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", kDeepseekCjk, R"re(\p{N})re"};
        case PreTokenizerType::starcoder:
            return {R"re(\p{N})re", kGpt2Pattern};
        case PreTokenizerType::bloom:
            return {kBloomPattern};
        case PreTokenizerType::viking:
            return {kBloomPattern, R"re(\p{N})re"};
        case PreTokenizerType::tekken:
            return {kTekkenPattern};
        case PreTokenizerType::gpt4o:
            return {kGpt4oPattern};
        case PreTokenizerType::deepseek3:
            // Hiragana and katakana start at U+3040, past every whitespace character.
            return {R"re(\p{N}{1,3})re", R"re([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)re",
                    kDeepseek3Words};
        case PreTokenizerType::seed_coder:
            return {kSeedCoderPattern};
        case PreTokenizerType::qwen35:
            return {kQwen35Pattern};
    }
    throw std::logic_error("patterns_for: unhandled PreTokenizerType");
}

// llama.cpp's whitespace, as the inside of a character class.
constexpr std::string_view kWhitespaceClassBody =
    R"re(\x{09}-\x{0D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})re";

// Turns the dialect into PCRE2 syntax: \s and \S become explicit classes.
std::string expand_pattern(std::string_view pattern) {
    std::string out;
    out.reserve(pattern.size() + 64);
    bool in_class = false;
    for (size_t i = 0; i < pattern.size(); ++i) {
        const char c = pattern[i];
        if (c == '\\' && i + 1 < pattern.size()) {
            const char next = pattern[++i];
            if (next == 's') {
                if (in_class)
                    out += kWhitespaceClassBody;
                else
                    out.append("[").append(kWhitespaceClassBody).append("]");
            } else if (next == 'S' && !in_class) {
                out.append("[^").append(kWhitespaceClassBody).append("]");
            } else if (next == 'S' || next == 'd' || next == 'D' || next == 'w' || next == 'W' || next == 'b' ||
                       next == 'B') {
                throw std::logic_error(
                    "pre-tokenizer pattern uses \\" + std::string(1, next) +
                    ", which PCRE2_UCP would read differently from llama.cpp: " + std::string(pattern));
            } else {
                out += c;
                out += next;
            }
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            out += c;
            if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        out += c;
    }
    return out;
}

// Surrogates survive reencode_utf8_leniently as three raw bytes, which PCRE2 will not take as
// UTF-8. U+E000 has the same length and, like a surrogate, is neither a letter, a number,
// punctuation nor whitespace, nor inside any explicit range above.
bool has_surrogate(std::string_view text) {
    for (size_t i = 0; i + 1 < text.size(); ++i) {
        if (static_cast<uint8_t>(text[i]) == 0xED && static_cast<uint8_t>(text[i + 1]) >= 0xA0) return true;
    }
    return false;
}

std::string replace_surrogates(std::string_view text) {
    std::string out(text);
    for (size_t i = 0; i + 2 < out.size(); ++i) {
        if (static_cast<uint8_t>(out[i]) == 0xED && static_cast<uint8_t>(out[i + 1]) >= 0xA0) {
            out[i] = static_cast<char>(0xEE);
            out[i + 1] = static_cast<char>(0x80);
            out[i + 2] = static_cast<char>(0x80);
            i += 2;
        }
    }
    return out;
}

struct MatchDataDeleter {
    void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

std::string pcre2_message(int error_code) {
    std::array<PCRE2_UCHAR, 256> buffer{};
    pcre2_get_error_message(error_code, buffer.data(), buffer.size());
    return reinterpret_cast<const char*>(buffer.data());
}

}  // namespace

// One compiled expression of the list.
class PreTokenizer::Rule {
public:
    explicit Rule(std::string_view dialect_pattern) : pattern_(expand_pattern(dialect_pattern)) {
        int error_code = 0;
        PCRE2_SIZE error_offset = 0;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error_code, &error_offset, nullptr);
        if (code_ == nullptr) {
            throw std::logic_error("pre-tokenizer pattern does not compile at offset " + std::to_string(error_offset) +
                                   " (" + pcre2_message(error_code) + "): " + pattern_);
        }
        // Without JIT (a platform PCRE2 was built without it) the interpreter gives the same answers.
        jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
    }
    ~Rule() { pcre2_code_free(code_); }
    Rule(const Rule&) = delete;
    Rule& operator=(const Rule&) = delete;

    uint32_t capture_pairs() const {
        uint32_t count = 0;
        pcre2_pattern_info(code_, PCRE2_INFO_CAPTURECOUNT, &count);
        return count + 1;
    }

    // Splits `piece` into matches and the stretches between them, as std::regex_iterator walks
    // it in llama.cpp: an empty match still cuts, and the next search then wants a non-empty
    // match at the same place before moving on by one character.
    void split_piece(std::string_view subject, size_t begin, size_t end, pcre2_match_data* match_data,
                     std::vector<std::pair<size_t, size_t>>& out) const {
        const auto* piece = reinterpret_cast<PCRE2_SPTR>(subject.data() + begin);
        const size_t length = end - begin;
        size_t offset = 0;
        size_t gap_start = 0;
        bool last_was_empty = false;
        while (offset <= length) {
            uint32_t options = PCRE2_NO_UTF_CHECK;
            if (last_was_empty) options |= PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED;
            const int rc = match(piece, length, offset, options, match_data);
            if (rc == PCRE2_ERROR_NOMATCH) {
                if (!last_was_empty || offset >= length) break;
                last_was_empty = false;
                offset += std::min(utf8_length_from_lead_byte(piece[offset]), length - offset);
                continue;
            }
            if (rc < 0) {
                throw Error("pre-tokenizer: PCRE2 failed (" + pcre2_message(rc) + ") at byte " +
                            std::to_string(begin + offset) + " of a " + std::to_string(subject.size()) +
                            "-byte text, pattern " + pattern_);
            }
            const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
            const size_t match_begin = ovector[0];
            const size_t match_end = ovector[1];
            if (match_begin > gap_start) out.emplace_back(begin + gap_start, begin + match_begin);
            if (match_end > match_begin) out.emplace_back(begin + match_begin, begin + match_end);
            gap_start = match_end;
            last_was_empty = match_end == match_begin;
            offset = match_end;
        }
        if (gap_start < length) out.emplace_back(begin + gap_start, end);
    }

private:
    int match(PCRE2_SPTR piece, size_t length, size_t offset, uint32_t options, pcre2_match_data* match_data) const {
        if (jit_) {
            const int rc = pcre2_match(code_, piece, length, offset, options, match_data, nullptr);
            // JIT's default 32 KiB stack can run out on long pieces; the interpreter uses the heap.
            if (rc != PCRE2_ERROR_JIT_STACKLIMIT) return rc;
        }
        return pcre2_match(code_, piece, length, offset, options | PCRE2_NO_JIT, match_data, nullptr);
    }

    std::string pattern_;
    pcre2_code* code_ = nullptr;
    bool jit_ = false;
};

PreTokenizer::PreTokenizer(PreTokenizerType type) : type_(type) {
    for (const std::string_view pattern : patterns_for(type)) {
        rules_.push_back(std::make_unique<Rule>(pattern));
        capture_pairs_ = std::max(capture_pairs_, rules_.back()->capture_pairs());
    }
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
    if (text.empty()) return;
    std::string substituted;
    std::string_view subject = text;
    if (has_surrogate(text)) {
        substituted = replace_surrogates(text);
        subject = substituted;
    }

    const MatchData match_data(pcre2_match_data_create(capture_pairs_, nullptr));
    if (!match_data) throw std::bad_alloc();

    std::vector<std::pair<size_t, size_t>> current{{0, text.size()}};
    std::vector<std::pair<size_t, size_t>> next;
    for (const auto& rule : rules_) {
        next.clear();
        for (const auto& [begin, end] : current) rule->split_piece(subject, begin, end, match_data.get(), next);
        current.swap(next);
    }
    pieces.reserve(pieces.size() + current.size());
    for (const auto& [begin, end] : current) pieces.push_back(text.substr(begin, end - begin));
}

std::vector<std::string> PreTokenizer::split_to_strings(std::string_view raw_text) const {
    const std::string text = reencode_utf8_leniently(raw_text);
    std::vector<std::string_view> views;
    split(text, views);
    return {views.begin(), views.end()};
}

// ---------------------------------------------------------------------------------------------
// tokenizer.ggml.pre names, as llama.cpp's llama_vocab::impl::load maps them. Flags that live
// in the vocabulary rather than in the splitting (clean_spaces, add_bos, add_sep) are the
// Vocab's business.
// ---------------------------------------------------------------------------------------------
namespace {

struct NamedPreTokenizer {
    std::string_view name;
    PreTokenizerType type;
};

constexpr NamedPreTokenizer kNamedPreTokenizers[] = {
    {"default", PreTokenizerType::standard},
    // Llama 3 and the models that copied its tokenizer.json (these also set ignore_merges).
    {"llama3", PreTokenizerType::llama3},
    {"llama-v3", PreTokenizerType::llama3},
    {"llama-bpe", PreTokenizerType::llama3},
    {"falcon3", PreTokenizerType::llama3},
    {"falcon-h1", PreTokenizerType::llama3},
    {"pixtral", PreTokenizerType::llama3},
    {"midm-2.0", PreTokenizerType::llama3},
    {"lfm2", PreTokenizerType::llama3},
    {"jina-v5-nano", PreTokenizerType::llama3},
    // The same pattern without ignore_merges.
    {"dbrx", PreTokenizerType::llama3},
    {"smaug-bpe", PreTokenizerType::llama3},
    {"chatglm-bpe", PreTokenizerType::llama3},
    {"glm4", PreTokenizerType::llama3},
    {"qwen2", PreTokenizerType::qwen2},
    {"deepseek-r1-qwen", PreTokenizerType::qwen2},
    {"kormo", PreTokenizerType::qwen2},
    {"f2llmv2", PreTokenizerType::qwen2},
    {"megrez", PreTokenizerType::qwen2},
    {"stablelm2", PreTokenizerType::qwen2},
    {"hunyuan", PreTokenizerType::qwen2},
    {"solar-open", PreTokenizerType::qwen2},
    {"gpt-2", PreTokenizerType::gpt2},
    {"phi-2", PreTokenizerType::gpt2},
    {"mpt", PreTokenizerType::gpt2},
    {"olmo", PreTokenizerType::gpt2},
    {"jais", PreTokenizerType::gpt2},
    {"trillion", PreTokenizerType::gpt2},
    {"granite-docling", PreTokenizerType::gpt2},
    {"exaone4", PreTokenizerType::gpt2},
    {"jina-es", PreTokenizerType::gpt2},
    {"jina-de", PreTokenizerType::gpt2},
    {"jina-v2-es", PreTokenizerType::gpt2},
    {"jina-v2-de", PreTokenizerType::gpt2},
    {"jina-v1-en", PreTokenizerType::gpt2},
    {"jina-v2-code", PreTokenizerType::gpt2},
    {"roberta-bpe", PreTokenizerType::gpt2},
    {"gigachat", PreTokenizerType::gpt2},
    {"a.x-4.0", PreTokenizerType::gpt2},
    {"mellum", PreTokenizerType::gpt2},
    {"modern-bert", PreTokenizerType::gpt2},
    {"falcon", PreTokenizerType::falcon},
    {"deepseek-llm", PreTokenizerType::deepseek_llm},
    {"deepseek-coder", PreTokenizerType::deepseek_coder},
    {"starcoder", PreTokenizerType::starcoder},
    {"refact", PreTokenizerType::starcoder},
    {"command-r", PreTokenizerType::starcoder},
    {"smollm", PreTokenizerType::starcoder},
    {"codeshell", PreTokenizerType::starcoder},
    {"exaone", PreTokenizerType::starcoder},
    {"minerva-7b", PreTokenizerType::starcoder},
    {"mellum2", PreTokenizerType::starcoder},
    {"bloom", PreTokenizerType::bloom},
    {"gpt3-finnish", PreTokenizerType::bloom},
    {"poro-chat", PreTokenizerType::bloom},
    {"viking", PreTokenizerType::viking},
    {"grok-2", PreTokenizerType::qwen2},
    {"qwen35", PreTokenizerType::qwen35},
    {"tekken", PreTokenizerType::tekken},
    {"gpt-4o", PreTokenizerType::gpt4o},
    {"llama4", PreTokenizerType::gpt4o},
    {"kanana2", PreTokenizerType::gpt4o},
    {"talkie", PreTokenizerType::gpt4o},
    {"minimax-m2", PreTokenizerType::gpt4o},
    {"deepseek-v3", PreTokenizerType::deepseek3},
    {"hunyuan-dense", PreTokenizerType::deepseek3},
    {"hy_v4", PreTokenizerType::deepseek3},
    {"joyai-llm", PreTokenizerType::deepseek3},
    {"seed-coder", PreTokenizerType::seed_coder},
};

}  // namespace

std::string_view to_string(PreTokenizerType type) {
    switch (type) {
        case PreTokenizerType::standard:
            return "default";
        case PreTokenizerType::llama3:
            return "llama3";
        case PreTokenizerType::qwen2:
            return "qwen2";
        case PreTokenizerType::gpt2:
            return "gpt-2";
        case PreTokenizerType::falcon:
            return "falcon";
        case PreTokenizerType::deepseek_llm:
            return "deepseek-llm";
        case PreTokenizerType::deepseek_coder:
            return "deepseek-coder";
        case PreTokenizerType::starcoder:
            return "starcoder";
        case PreTokenizerType::bloom:
            return "bloom";
        case PreTokenizerType::viking:
            return "viking";
        case PreTokenizerType::tekken:
            return "tekken";
        case PreTokenizerType::gpt4o:
            return "gpt-4o";
        case PreTokenizerType::deepseek3:
            return "deepseek-v3";
        case PreTokenizerType::seed_coder:
            return "seed-coder";
        case PreTokenizerType::qwen35:
            return "qwen35";
    }
    return "?";
}

std::vector<std::string_view> supported_pre_tokenizer_names() {
    std::vector<std::string_view> names;
    for (const auto& entry : kNamedPreTokenizers) names.push_back(entry.name);
    return names;
}

PreTokenizerType pre_tokenizer_type_for_name(std::string_view name) {
    // llama.cpp warns that a file without the key tokenizes worse, and uses the default.
    if (name.empty()) return PreTokenizerType::standard;
    for (const auto& entry : kNamedPreTokenizers) {
        if (entry.name == name) return entry.type;
    }
    std::string supported;
    for (const auto& entry : kNamedPreTokenizers) {
        if (!supported.empty()) supported += ", ";
        supported += entry.name;
    }
    throw VocabError("tokenizer.ggml.pre: unknown BPE pre-tokenizer '" + std::string(name) +
                     "'; supported: " + supported);
}

}  // namespace fitllm::tokenizer
