// Loading a Vocab from GGUF metadata, with llama.cpp's defaults and load-time patches (see
// llama-vocab.cpp, llama_vocab::impl::load): the patches change which tokens count as control
// or user-defined, and that changes tokenization, so they are part of "the same ids".
#include "tokenizer/vocab.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <optional>
#include <span>

namespace fitllm::tokenizer {
namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kPreKey = "tokenizer.ggml.pre";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";

std::string key_error(const gguf::GgufFile& file, std::string_view key, const std::string& problem) {
    return file.source() + ": " + std::string(key) + ": " + problem;
}

std::optional<bool> optional_bool(const gguf::GgufFile& file, std::string_view key) {
    const gguf::Value* v = file.find(key);
    if (!v) return std::nullopt;
    if (v->type() != gguf::ValueType::BOOL)
        throw VocabError(key_error(file, key, "expected bool, found " + v->type_name()));
    return v->get<bool>();
}

// Per pre-tokenizer flags that differ from the BPE defaults (clean_spaces on, nothing else).
struct PreFlags {
    std::string_view name;
    bool clean_spaces = true;
    bool add_bos = false;
    bool ignore_merges = false;
    bool escape_whitespaces = false;
};

constexpr PreFlags kPreFlags[] = {
    {"llama3", true, true, true},
    {"llama-v3", true, true, true},
    {"llama-bpe", true, true, true},
    {"falcon3", true, true, true},
    {"falcon-h1", true, true, true},
    {"pixtral", true, true, true},
    {"midm-2.0", true, true, true},
    {"lfm2", true, true, true},
    {"jina-v5-nano", true, true, true},
    {"minicpm5", true, false, true},
    {"tekken", false, true, true},
    {"chameleon", false, true, false},
    {"youtu", false, false, true},
    {"granite-embed-multi-97m", false, false, true},
    {"deepseek-llm", false},
    {"deepseek-coder", false},
    {"deepseek-v3", false},
    {"spark2_5", false},
    {"command-r", false},
    {"qwen2", false},
    {"deepseek-r1-qwen", false},
    {"kormo", false},
    {"f2llmv2", false},
    {"qwen35", false},
    {"poro-chat", false},
    {"viking", false},
    {"smollm", false},
    {"gpt-4o", false},
    {"llama4", false},
    {"kanana2", false},
    {"talkie", false},
    {"tiny_aya", false},
    {"cohere2moe", false},
    {"superbpe", false},
    {"trillion", false},
    {"granite-docling", false},
    {"bailingmoe", false},
    {"bailingmoe2", false},
    {"llada-moe", false},
    {"seed-coder", false},
    {"hunyuan", false},
    {"hunyuan-dense", false},
    {"hy_v4", false},
    {"joyai-llm", false},
    {"kimi-k2", false},
    {"ufakzeka", false},
    {"grok-2", false},
    {"afmoe", false},
    {"laguna", false},
    {"minimax-m2", false},
    {"solar-open", false},
    {"gemma4", true, false, false, true},
    {"granite-embed-multi-311m", true, false, false, true},
    {"sarvam-moe", false, false, false, true},
};

// Texts llama.cpp recognizes as end-of-turn etc. when the file names no id (llama-vocab.cpp:
// "auto-detect special tokens by text"). The first match in the id map's iteration wins.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<end_of_utterance>",
};
constexpr std::string_view kEomTexts[] = {"<|eom_id|>"};
constexpr std::string_view kFimPreTexts[] = {
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<\xef\xbd\x9c"
    "fim\xe2\x96\x81"
    "begin\xef\xbd\x9c>",
    "<PRE>",
    "\xe2\x96\x81<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
};
constexpr std::string_view kFimSufTexts[] = {
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<\xef\xbd\x9c"
    "fim\xe2\x96\x81hole\xef\xbd\x9c>",
    "<SUF>",
    "\xe2\x96\x81<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
};
constexpr std::string_view kFimMidTexts[] = {
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<\xef\xbd\x9c"
    "fim\xe2\x96\x81"
    "end\xef\xbd\x9c>",
    "<MID>",
    "\xe2\x96\x81<MID>",
    "<|code_middle|>",
    "<|middle|>",
};
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr std::string_view kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "[e~[",
};

template <size_t N>
bool one_of(std::string_view text, const std::string_view (&list)[N]) {
    return std::find(std::begin(list), std::end(list), text) != std::end(list);
}

uint32_t attr_from_type(int32_t type) {
    switch (static_cast<TokenType>(type)) {
        case TokenType::unknown:
            return kAttrUnknown;
        case TokenType::unused:
            return kAttrUnused;
        case TokenType::normal:
            return kAttrNormal;
        case TokenType::control:
            return kAttrControl;
        case TokenType::user_defined:
            return kAttrUserDefined;
        case TokenType::byte:
            return kAttrByte;
        default:
            return kAttrUndefined;
    }
}

std::string to_lower_ascii(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

}  // namespace

Vocab Vocab::from_gguf(const gguf::GgufFile& file) {
    Vocab vocab;
    vocab.load_type_and_flags(file);
    if (vocab.type_ == VocabType::none) return vocab;
    vocab.load_tokens(file);
    if (vocab.type_ == VocabType::bpe) vocab.load_merges(file);
    vocab.find_linefeed();
    vocab.load_special_ids(file);
    vocab.apply_text_patches(file);
    return vocab;
}

void Vocab::load_type_and_flags(const gguf::GgufFile& file) {
    const gguf::Value* model = file.find(kModelKey);
    if (!model) throw VocabError(key_error(file, kModelKey, "missing: the file has no tokenizer"));
    if (model->type() != gguf::ValueType::STRING)
        throw VocabError(key_error(file, kModelKey, "expected string, found " + model->type_name()));
    model_name_ = std::string(model->get<std::string_view>());
    if (const gguf::Value* pre = file.find(kPreKey)) {
        if (pre->type() != gguf::ValueType::STRING)
            throw VocabError(key_error(file, kPreKey, "expected string, found " + pre->type_name()));
        pre_ = std::string(pre->get<std::string_view>());
    }

    // Default special ids per type, as llama.cpp sets them before reading the file's.
    special_ = SpecialTokens{};
    if (model_name_ == "no_vocab" || model_name_ == "none") {
        type_ = VocabType::none;
        return;
    }
    if (model_name_ == "llama") {
        type_ = VocabType::spm;
        special_.bos = 1, special_.eos = 2, special_.unk = 0;
    } else if (model_name_ == "bert") {
        type_ = VocabType::wpm;
        special_.bos = 101, special_.unk = 100, special_.sep = 102, special_.pad = 0, special_.mask = 103;
    } else if (model_name_ == "gpt2" || model_name_ == "hybriddna" || model_name_ == "whitespace" ||
               model_name_ == "gemma4") {
        type_ = VocabType::bpe;
        if (model_name_ == "gemma4") {
            pre_ = "gemma4";
        } else {
            special_.bos = 11, special_.eos = 11;
        }
    } else if (model_name_ == "t5") {
        type_ = VocabType::ugm;
        special_.eos = 1, special_.unk = 2, special_.pad = 0;
    } else if (model_name_ == "rwkv") {
        type_ = VocabType::rwkv;
    } else {
        throw VocabError(
            key_error(file, kModelKey,
                      "unknown tokenizer model '" + model_name_ + "' (known: llama, gpt2, bert, t5, rwkv, no_vocab)"));
    }

    escape_whitespaces_ = true;
    switch (type_) {
        case VocabType::bpe: {
            add_space_prefix_ = false;
            escape_whitespaces_ = false;
            clean_spaces_ = true;
            if (pre_.empty()) pre_ = "default";
            for (const PreFlags& f : kPreFlags) {
                if (f.name != pre_) continue;
                clean_spaces_ = f.clean_spaces;
                add_bos_ = f.add_bos;
                ignore_merges_ = f.ignore_merges;
                escape_whitespaces_ = f.escape_whitespaces;
            }
            if (pre_ == "glm4" || pre_ == "chatglm-bpe") special_.bos = kNoToken;
            if (pre_ == "whitespace") lowercase_ = false;
            break;
        }
        case VocabType::spm:
            add_space_prefix_ = true, clean_spaces_ = false, add_bos_ = true, add_eos_ = false;
            break;
        case VocabType::wpm:
            add_space_prefix_ = false, clean_spaces_ = true, add_bos_ = true, add_eos_ = false, add_sep_ = true;
            break;
        case VocabType::ugm:
            add_bos_ = false, add_eos_ = true;
            break;
        case VocabType::rwkv:
            add_space_prefix_ = false, clean_spaces_ = false, add_bos_ = false, add_eos_ = false;
            break;
        case VocabType::none:
            break;
    }
    if (auto v = optional_bool(file, "tokenizer.ggml.add_space_prefix")) add_space_prefix_ = *v;
    if (auto v = optional_bool(file, "tokenizer.ggml.remove_extra_whitespaces")) remove_extra_whitespaces_ = *v;
}

void Vocab::load_tokens(const gguf::GgufFile& file) {
    const gguf::Value* tokens = file.find(kTokensKey);
    if (!tokens) throw VocabError(key_error(file, kTokensKey, "missing"));
    if (!tokens->is_array() || tokens->array_type() != gguf::ValueType::STRING)
        throw VocabError(key_error(file, kTokensKey, "expected array[string], found " + tokens->type_name()));
    const std::span<const std::string_view> words = tokens->strings();
    const size_t n = words.size();
    if (n > static_cast<size_t>(INT32_MAX)) throw VocabError(key_error(file, kTokensKey, "too many tokens"));

    if (const gguf::Value* scores = file.find(kScoresKey)) {
        if (!scores->is_array() ||
            (scores->array_type() != gguf::ValueType::FLOAT32 && scores->array_type() != gguf::ValueType::INT32))
            throw VocabError(key_error(file, kScoresKey, "expected array[float32], found " + scores->type_name()));
        if (scores->array_size() != n)
            throw VocabError(
                key_error(file, kScoresKey,
                          std::to_string(scores->array_size()) + " scores for " + std::to_string(n) + " tokens"));
        if (scores->array_type() == gguf::ValueType::FLOAT32) {
            scores_ = scores->array<float>();
        } else {
            const std::vector<int32_t> integer_scores = scores->array<int32_t>();
            scores_.assign(integer_scores.begin(), integer_scores.end());
        }
    }

    std::vector<int32_t> raw_types;
    if (const gguf::Value* types = file.find(kTypesKey)) {
        if (!types->is_array() || types->array_type() != gguf::ValueType::INT32)
            throw VocabError(key_error(file, kTypesKey, "expected array[int32], found " + types->type_name()));
        if (types->array_size() != n)
            throw VocabError(key_error(
                file, kTypesKey, std::to_string(types->array_size()) + " types for " + std::to_string(n) + " tokens"));
        raw_types = types->array<int32_t>();
    }

    texts_.resize(n);
    types_.resize(n, TokenType::normal);
    attrs_.resize(n, kAttrNormal);
    for (size_t i = 0; i < n; ++i) {
        // llama.cpp keeps empty texts unmatchable but distinct this way.
        texts_[i] = words[i].empty() ? "[EMPTY_" + std::to_string(i) + "]" : std::string(words[i]);
        if (!raw_types.empty()) {
            types_[i] = static_cast<TokenType>(raw_types[i]);
            attrs_[i] = attr_from_type(raw_types[i]);
        }
        max_token_length_ = std::max(max_token_length_, texts_[i].size());
    }
    // No reserve(): the map must grow as llama.cpp's token_to_id does, so that iterating it
    // (the text-based patches below) visits tokens in llama.cpp's order.
    for (size_t i = 0; i < n; ++i) {
        const auto [it, inserted] = ids_.emplace(texts_[i], static_cast<TokenId>(i));
        if (!inserted)
            throw VocabError(key_error(file, kTokensKey,
                                       "duplicate token '" + texts_[i] + "' at ids " + std::to_string(it->second) +
                                           " and " + std::to_string(i)));
    }
}

void Vocab::load_merges(const gguf::GgufFile& file) {
    const gguf::Value* merges = file.find(kMergesKey);
    if (!merges) {
        if (pre_ == "kimi-k2") return;  // Kimi-K2 tokenizes without merges
        throw VocabError(key_error(file, kMergesKey, "missing (a BPE vocabulary needs its merges)"));
    }
    if (!merges->is_array() || merges->array_type() != gguf::ValueType::STRING)
        throw VocabError(key_error(file, kMergesKey, "expected array[string], found " + merges->type_name()));
    const std::span<const std::string_view> lines = merges->strings();
    merge_ranks_.reserve(lines.size());
    for (size_t i = 0; i < lines.size(); ++i) {
        const std::string_view line = lines[i];
        // Split at the first space after the first byte, as llama.cpp does; a line without one
        // becomes the pair ("", "").
        const size_t space = line.size() > 1 ? line.find(' ', 1) : std::string_view::npos;
        std::string key = " ";
        if (space != std::string_view::npos) key = std::string(line);
        merge_ranks_.emplace(std::move(key), static_cast<int>(i));
    }
}

void Vocab::find_linefeed() {
    // llama.cpp determines this before reading the file's special ids, so a fallback to the
    // pad token means the type's default pad.
    switch (type_) {
        case VocabType::spm:
            special_.linefeed = byte_token('\n');
            if (special_.linefeed == kNoToken) special_.linefeed = special_.pad;
            break;
        case VocabType::wpm:
            special_.linefeed = special_.pad;
            break;
        default: {
            // What tokenizing "\n" gives before special tokens are known: one merged symbol.
            // "\xC4\x8A" is U+010A, GPT-2's printable stand-in for the byte '\n'.
            TokenId id = find(escape_whitespaces_ || model_name_ == "whitespace" ? "\n" : "\xC4\x8A");
            if (id == kNoToken && escape_whitespaces_) id = find("<0x0A>");
            special_.linefeed = id != kNoToken ? id : special_.pad;
        }
    }
}

void Vocab::load_special_ids(const gguf::GgufFile& file) {
    const std::pair<std::string_view, TokenId*> keys[] = {
        {"tokenizer.ggml.bos_token_id", &special_.bos},         {"tokenizer.ggml.eos_token_id", &special_.eos},
        {"tokenizer.ggml.eot_token_id", &special_.eot},         {"tokenizer.ggml.eom_token_id", &special_.eom},
        {"tokenizer.ggml.unknown_token_id", &special_.unk},     {"tokenizer.ggml.seperator_token_id", &special_.sep},
        {"tokenizer.ggml.padding_token_id", &special_.pad},     {"tokenizer.ggml.mask_token_id", &special_.mask},
        {"tokenizer.ggml.fim_pre_token_id", &special_.fim_pre}, {"tokenizer.ggml.fim_suf_token_id", &special_.fim_suf},
        {"tokenizer.ggml.fim_mid_token_id", &special_.fim_mid}, {"tokenizer.ggml.fim_pad_token_id", &special_.fim_pad},
        {"tokenizer.ggml.fim_rep_token_id", &special_.fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &special_.fim_sep},
        {"tokenizer.ggml.prefix_token_id", &special_.fim_pre},  {"tokenizer.ggml.suffix_token_id", &special_.fim_suf},
        {"tokenizer.ggml.middle_token_id", &special_.fim_mid},
    };
    for (const auto& [key, id] : keys) {
        // A default that this vocabulary is too small for is dropped, as in llama.cpp.
        if (*id != kNoToken && !valid(*id)) *id = kNoToken;
        const gguf::Value* v = file.find(key);
        if (!v) continue;
        int64_t value = 0;
        try {
            value = v->to_int();
        } catch (const gguf::KeyError&) {
            throw VocabError(key_error(file, key, "expected an integer token id, found " + v->type_name()));
        }
        if (value < 0 || static_cast<uint64_t>(value) >= size())
            throw VocabError(key_error(file, key,
                                       "token id " + std::to_string(value) + " is out of range (vocabulary of " +
                                           std::to_string(size()) + " tokens)"));
        *id = static_cast<TokenId>(value);
    }

    if (auto v = optional_bool(file, "tokenizer.ggml.add_bos_token")) add_bos_ = *v;
    if (auto v = optional_bool(file, "tokenizer.ggml.add_eos_token")) add_eos_ = *v;
    if (auto v = optional_bool(file, "tokenizer.ggml.add_sep_token")) add_sep_ = *v;
    if (pre_ == "gemma4") add_bos_ = true;  // llama.cpp overrides it for Gemma 4
    if (add_bos_ && special_.bos == kNoToken)
        throw VocabError(key_error(file, "tokenizer.ggml.add_bos_token", "is true but there is no BOS token id"));
    if (add_eos_ && special_.eos == kNoToken)
        throw VocabError(key_error(file, "tokenizer.ggml.add_eos_token", "is true but there is no EOS token id"));
    if (add_sep_ && special_.sep == kNoToken)
        throw VocabError(key_error(file, "tokenizer.ggml.add_sep_token", "is true but there is no SEP token id"));

    if (auto v = optional_bool(file, "tokenizer.ggml.normalizer.lowercase")) lowercase_ = *v;
    strip_accents_ = lowercase_;
    if (auto v = optional_bool(file, "tokenizer.ggml.normalizer.strip_accents")) strip_accents_ = *v;
}

void Vocab::apply_text_patches(const gguf::GgufFile& file) {
    auto mark_control = [this](TokenId id) { attrs_[static_cast<size_t>(id)] |= kAttrControl; };
    auto detect = [&](std::string_view text, TokenId id, TokenId& slot, auto& texts) {
        if (slot == kNoToken && one_of(text, texts)) {
            slot = id;
            mark_control(id);
        }
    };
    // Iterates in the map's order, which equals llama.cpp's: when a vocabulary holds several
    // candidates (say "<|im_end|>" and "<|endoftext|>"), the same one wins.
    for (const auto& [text, id] : ids_) {
        detect(text, id, special_.eot, kEotTexts);
        detect(text, id, special_.eom, kEomTexts);
        detect(text, id, special_.fim_pre, kFimPreTexts);
        detect(text, id, special_.fim_suf, kFimSufTexts);
        detect(text, id, special_.fim_mid, kFimMidTexts);
        detect(text, id, special_.fim_pad, kFimPadTexts);
        detect(text, id, special_.fim_rep, kFimRepTexts);
        detect(text, id, special_.fim_sep, kFimSepTexts);
    }
    // Control tokens named "...unused..." are unused (matters to samplers, not to splitting).
    for (size_t i = 0; i < attrs_.size(); ++i) {
        if ((attrs_[i] & kAttrControl) && texts_[i].find("unused") != std::string::npos) attrs_[i] |= kAttrUnused;
    }

    std::vector<TokenId> eog;
    for (TokenId id : {special_.fim_pad, special_.fim_rep, special_.fim_sep})
        if (id != kNoToken) eog.push_back(id);
    for (const auto& [text, id] : ids_) {
        if (one_of(text, kEogTexts)) {
            eog.push_back(id);
            mark_control(id);
        }
    }
    // gpt-oss: these structure tokens are always rendered.
    for (std::string_view text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
        const TokenId id = find(text);
        if (id != kNoToken) attrs_[static_cast<size_t>(id)] = kAttrUserDefined;
    }
    for (TokenId id : {special_.eos, special_.eot, special_.eom})
        if (id != kNoToken) eog.push_back(id);
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
    auto eog_has = [&](std::string_view text) {
        return std::any_of(eog.begin(), eog.end(), [&](TokenId id) { return texts_[static_cast<size_t>(id)] == text; });
    };
    auto eog_drop = [&](std::string_view text, uint32_t new_attr) {
        const TokenId id = find(text);
        eog.erase(std::remove(eog.begin(), eog.end(), id), eog.end());
        attrs_[static_cast<size_t>(id)] = new_attr;
    };
    // o200k_harmony and solar-open: "<|end|>" ends a message, not the generation.
    const bool has_call = eog_has("<|call|>") || eog_has("<|calls|>");
    if (eog_has("<|end|>") && has_call && (eog_has("<|return|>") || eog_has("<|flush|>")))
        eog_drop("<|end|>", kAttrUserDefined);
    // Gemma 4 and PaddleOCR: "</s>" is ordinary text there.
    if (eog_has("<|tool_response>") && eog_has("</s>")) eog_drop("</s>", kAttrNormal);
    eog_ = std::move(eog);

    build_partition_tokens();

    // Per-model strip flags llama.cpp sets by name (they are missing from GGUF files).
    auto string_key = [&](std::string_view key) -> std::string {
        const gguf::Value* v = file.find(key);
        return v && v->type() == gguf::ValueType::STRING ? std::string(v->get<std::string_view>()) : std::string();
    };
    const std::string name = to_lower_ascii(string_key("general.name"));
    const std::string arch = string_key("general.architecture");
    auto contains_any = [](const std::string& s, std::initializer_list<std::string_view> parts) {
        return std::any_of(parts.begin(), parts.end(),
                           [&](std::string_view p) { return s.find(p) != std::string::npos; });
    };
    auto set_attr = [&](std::string_view text, TokenAttr attr, bool on) {
        const TokenId id = find(text);
        if (id == kNoToken) return;
        if (on) {
            attrs_[static_cast<size_t>(id)] |= attr;
        } else {
            attrs_[static_cast<size_t>(id)] &= ~static_cast<uint32_t>(attr);
        }
    };
    if (contains_any(pre_, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
        contains_any(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
        set_attr("<mask>", kAttrLstrip, true);
    } else if (contains_any(name, {"phi-3", "phi3"})) {
        for (TokenId id : partition_tokens_) attrs_[static_cast<size_t>(id)] |= kAttrRstrip;
        set_attr("</s>", kAttrRstrip, true);
        for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) set_attr(text, kAttrRstrip, false);
    } else if (contains_any(name, {"modern-bert"})) {
        set_attr("[MASK]", kAttrLstrip, true);
    }
}

void Vocab::build_partition_tokens() {
    partition_tokens_.clear();
    for (size_t i = 0; i < attrs_.size(); ++i) {
        if (attrs_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown))
            partition_tokens_.push_back(static_cast<TokenId>(i));
    }
    // std::sort (not stable_sort) on ids in ascending order, exactly as llama.cpp sorts them:
    // with the same standard library, tokens of equal length end up in the same order.
    std::sort(partition_tokens_.begin(), partition_tokens_.end(), [this](TokenId a, TokenId b) {
        return texts_[static_cast<size_t>(a)].size() > texts_[static_cast<size_t>(b)].size();
    });
}

TokenType Vocab::token_type(TokenId id) const {
    if (types_.empty()) return TokenType::normal;
    return types_.at(static_cast<size_t>(id));
}

TokenId Vocab::find(std::string_view text) const {
    const auto it = ids_.find(text);
    return it == ids_.end() ? kNoToken : it->second;
}

bool Vocab::is_eog(TokenId id) const {
    return std::binary_search(eog_.begin(), eog_.end(), id);
}

TokenId Vocab::byte_token(uint8_t byte) const {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const char spm_name[6] = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
    const TokenId id = find(std::string_view(spm_name, 6));
    if (id != kNoToken) return id;
    const char raw = static_cast<char>(byte);
    return find(std::string_view(&raw, 1));
}

uint8_t Vocab::byte_of(TokenId id) const {
    const std::string& t = text(id);
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') {
        if (t.size() == 1) return static_cast<uint8_t>(t[0]);
        throw VocabError("token " + std::to_string(id) + " '" + t + "' is marked as a byte but is not <0xNN>");
    }
    auto hex = [&](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        throw VocabError("token " + std::to_string(id) + " '" + t + "' is marked as a byte but is not <0xNN>");
    };
    return static_cast<uint8_t>(hex(t[3]) * 16 + hex(t[4]));
}

int Vocab::merge_rank(std::string_view left, std::string_view right) const {
    std::string key;
    key.reserve(left.size() + right.size() + 1);
    key.append(left).push_back(' ');
    key.append(right);
    const auto it = merge_ranks_.find(key);
    return it == merge_ranks_.end() ? -1 : it->second;
}

}  // namespace fitllm::tokenizer
