// libFuzzer target: the grammar engine (sampling/grammar.h). The first byte picks the input's
// kind: GBNF text, or a JSON schema converted to GBNF (sampling/json_schema.h); after a 0 byte
// comes text walked through the grammar, byte by byte and as tokens of a small vocabulary with
// shared prefixes. Checks: no crash, hang or sanitizer report (deep nesting, left recursion, huge
// repetition counts, ambiguity, invalid UTF-8), only GrammarError / JsonSchemaError for bad
// input, and the mask of allowed tokens equal to the tokens checked one by one.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/grammar.h"
#include "sampling/json_schema.h"

using namespace fitllm::sampling;

namespace {

[[noreturn]] void broken(const char* what) {
    std::fprintf(stderr, "grammar_fuzz: %s\n", what);
    std::abort();
}

std::shared_ptr<const GrammarVocab> vocab() {
    static const auto v = [] {
        std::vector<std::string> texts = {"",   "{",  "}",    "\"", "\":",  " ",    "\n", "a",        "ab", "abc",
                                          "0",  "1",  "12",   "-",  ".",    "e",    ",",  "[",        "]",  "true",
                                          "tr", "nu", "null", "\\", "\xC3", "\xA9", "é",  "\xE2\x82", "x",  "(("};
        return std::make_shared<GrammarVocab>(texts, std::vector<int32_t>{0});
    }();
    return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
    const size_t cut = all.find('\0');
    const std::string_view source = all.substr(0, cut);
    const std::string_view text = cut == std::string_view::npos ? std::string_view() : all.substr(cut + 1);
    std::shared_ptr<const Grammar> grammar;
    try {
        std::string gbnf(source);
        if (data[0] & 1) {
            const auto schema = nlohmann::ordered_json::parse(source, nullptr, /*allow_exceptions=*/false);
            if (schema.is_discarded()) return 0;
            gbnf = json_schema_to_gbnf(schema);
        }
        grammar = Grammar::parse(gbnf);
    } catch (const GrammarError&) {
        return 0;
    } catch (const JsonSchemaError&) {
        return 0;
    }
    try {
        GrammarMatcher bytes(grammar, vocab());
        for (const char c : text) {
            if (!bytes.allows_text(std::string_view(&c, 1))) break;
            bytes.accept_text(std::string_view(&c, 1));
        }
        GrammarMatcher tokens(grammar, vocab());
        for (const char c : text) {
            const std::vector<uint64_t> mask = tokens.allowed_tokens();
            std::vector<int32_t> allowed;
            for (int32_t id = 0; id < vocab()->size(); ++id) {
                const bool bit = (mask[size_t(id) >> 6] >> (id & 63)) & 1;
                if (bit != tokens.allows_token(id)) broken("the mask and allows_token disagree");
                if (bit) allowed.push_back(id);
            }
            if (allowed.empty()) broken("an empty mask without an error");
            const int32_t pick = allowed[static_cast<uint8_t>(c) % allowed.size()];
            if (pick == 0) break;
            tokens.accept_token(pick);
        }
    } catch (const GrammarError&) {
    }
    return 0;
}
