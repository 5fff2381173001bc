// libFuzzer target for the tokenizers: every vocabulary of the tests (tests/data/vocab/*.gguf,
// llama.cpp's test vocabularies, and the tiny generated models' two, tests/model/data/), loaded
// once. An input picks a vocabulary by its first byte and the flags by its second; the rest is
// the text. Tokenizing it must give ids of the vocabulary, each of which renders
// (token_to_piece); detokenizing must not throw; the streaming Detokenizer must give exactly
// what detokenize() gives (its header promises it); and where llama.cpp's detokenizer gives
// the text back (SPM and BPE vocabularies, valid UTF-8, no special tokens added or parsed, see
// tests/tokenizer/vocab_vectors_test.cpp), so must fitllm's. Anything else, or a sanitizer
// report, is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "gguf/gguf_reader.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

namespace fs = std::filesystem;
using fitllm::tokenizer::Detokenizer;
using fitllm::tokenizer::TokenId;
using fitllm::tokenizer::Tokenizer;
using fitllm::tokenizer::VocabType;

struct Loaded {
    std::string name;
    std::unique_ptr<Tokenizer> tokenizer;
    // Bytes the vocabulary can spell on their own: a byte-level BPE vocabulary's token for the
    // byte's GPT-2 code point, an SPM vocabulary's byte token ("<0x16>"). llama.cpp drops what a
    // vocabulary cannot spell (falcon has no token for the control characters), so the text
    // comes back only when every byte of it can be spelled.
    bool spellable[256] = {};
};

void find_spellable_bytes(Loaded& loaded) {
    const fitllm::tokenizer::Vocab& vocab = loaded.tokenizer->vocab();
    for (int b = 0; b < 256; ++b) {
        const auto byte = static_cast<uint8_t>(b);
        if (vocab.type() == VocabType::bpe)
            loaded.spellable[b] =
                vocab.find(fitllm::tokenizer::utf8_encode(fitllm::tokenizer::gpt2_code_point_of_byte(byte))) !=
                fitllm::tokenizer::kNoToken;
        else if (vocab.type() == VocabType::spm)
            loaded.spellable[b] = vocab.byte_token(byte) != fitllm::tokenizer::kNoToken;
    }
}

std::vector<Loaded>& vocabularies() {
    static std::vector<Loaded> loaded;
    return loaded;
}

[[noreturn]] void broken(const Loaded& vocab, const char* what, const std::string& detail) {
    std::fprintf(stderr, "tokenizer_fuzz: %s: %s: %s\n", vocab.name.c_str(), what, detail.c_str());
    std::abort();
}

std::string show(std::string_view s) {
    std::string out;
    for (unsigned char c : s) {
        char buf[8];
        if (c >= 0x20 && c < 0x7F && c != '\\') {
            out += static_cast<char>(c);
        } else {
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        }
    }
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const fs::path root = FITLLM_SOURCE_DIR;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(root / "tests" / "data" / "vocab"))
        if (entry.path().extension() == ".gguf") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    // The tiny models come in seven quantizations of two vocabularies.
    files.push_back(root / "tests" / "model" / "data" / "tiny-llama-f16.gguf");
    files.push_back(root / "tests" / "model" / "data" / "tiny-qwen2-f16.gguf");
    for (const fs::path& path : files) {
        try {
            const auto file = fitllm::gguf::GgufFile::open(path.string());
            Loaded loaded{path.filename().string(), std::make_unique<Tokenizer>(Tokenizer::from_gguf(file))};
            find_spellable_bytes(loaded);
            vocabularies().push_back(std::move(loaded));
        } catch (const fitllm::Error& e) {
            std::fprintf(stderr, "tokenizer_fuzz: skipping %s: %s\n", path.c_str(), e.what());
        }
    }
    std::fprintf(stderr, "tokenizer_fuzz: %zu vocabularies\n", vocabularies().size());
    if (vocabularies().empty()) std::abort();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    const Loaded& vocab = vocabularies()[data[0] % vocabularies().size()];
    const Tokenizer& tok = *vocab.tokenizer;
    const bool add_special = data[1] & 1, parse_special = data[1] & 2;
    const bool remove_special = data[1] & 4, unparse_special = data[1] & 8;
    const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
    try {
        const std::vector<TokenId> ids = tok.tokenize(text, add_special, parse_special);
        for (const TokenId id : ids) {
            if (!tok.vocab().valid(id)) broken(vocab, "tokenize gave an id outside the vocabulary", std::to_string(id));
            (void)tok.token_to_piece(id, unparse_special);
        }
        const std::string whole = tok.detokenize(ids, remove_special, unparse_special);
        Detokenizer stream(tok, remove_special, unparse_special);
        std::string streamed;
        for (const TokenId id : ids) streamed += stream.feed(id);
        streamed += stream.flush();
        if (streamed != whole)
            broken(vocab, "the streaming detokenizer differs from detokenize()",
                   "'" + show(streamed) + "' != '" + show(whole) + "' for '" + show(text) + "'");
        const bool spellable =
            std::all_of(text.begin(), text.end(), [&](char c) { return vocab.spellable[static_cast<uint8_t>(c)]; });
        if (!add_special && !parse_special && spellable && fitllm::tokenizer::is_valid_utf8(text)) {
            const std::string back = tok.detokenize(ids, false, false);
            const std::string want = tok.vocab().clean_spaces()
                                         ? fitllm::tokenizer::clean_up_tokenization_spaces(std::string(text))
                                         : std::string(text);
            if (back != want)
                broken(vocab, "detokenize(tokenize(text)) is not the text",
                       "'" + show(back) + "' != '" + show(want) + "'");
        }
    } catch (const fitllm::Error& e) {
        // A vocabulary that cannot add what add_special asks for (no BOS token): said, not done.
        const std::string what = e.what();
        if (!add_special || what.find("tokenize:") == std::string::npos)
            broken(vocab, "unexpected error", what + " for '" + show(text) + "'");
    } catch (const std::exception& e) {
        broken(vocab, "unexpected exception", std::string(typeid(e).name()) + ": " + e.what());
    }
    return 0;
}
