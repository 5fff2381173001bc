#pragma once
// UTF-8 helpers for the tokenizers, and the byte <-> unicode mapping that GPT-2 style BPE
// vocabularies use to store arbitrary bytes as printable text (a space is stored as "Ġ",
// a newline as "Ċ"). Unicode categories are not here: the pre-tokenizer asks PCRE2.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fitllm::tokenizer {

// U+FFFD, what a malformed sequence decodes to.
inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Length a lead byte announces (1 for ASCII and for bytes that cannot start a sequence),
// without looking at the bytes after it; what llama.cpp uses to cut text into characters.
size_t utf8_length_from_lead_byte(uint8_t lead);

// Length of the well-formed UTF-8 sequence that starts at text[pos] (1..4), checked against
// the bytes that follow; 1 for a stray continuation byte, an invalid lead byte, or a truncated,
// overlong or surrogate sequence, so that a malformed byte always stands alone.
size_t utf8_sequence_length(std::string_view text, size_t pos);

bool is_valid_utf8(std::string_view text);

// Decodes the well-formed code point at text[pos] and advances pos past it; a malformed
// sequence yields kReplacementChar and advances by one byte.
char32_t utf8_decode(std::string_view text, size_t& pos);

// Appends the UTF-8 encoding of cp; code points past U+10FFFF and surrogates, which have no
// well-formed encoding, append kReplacementChar's.
void utf8_append(std::string& out, char32_t cp);
std::string utf8_encode(char32_t cp);

// The text as llama.cpp reads it before pre-tokenizing: every sequence with a valid lead byte
// and enough continuation bytes is decoded as is (overlong forms and surrogates included) and
// written back in shortest form, every other byte becomes U+FFFD. Well-formed UTF-8 comes back
// unchanged. Surrogates stay encoded as their three bytes, so the result is not always
// well-formed; code points past U+10FFFF (llama.cpp throws on those) become U+FFFD.
std::string reencode_utf8_leniently(std::string_view text);

// GPT-2's mapping: every byte becomes one code point; printable Latin-1 bytes map to
// themselves, the others to U+0100 and up, so that "hello world" -> "helloĠworld".
std::string bytes_to_gpt2_unicode(std::string_view bytes);
// The code point byte b maps to.
char32_t gpt2_code_point_of_byte(uint8_t b);

// The inverse, for detokenization: each code point of `text` that the mapping produces turns
// back into its byte. Anything else (a code point outside the mapping, as in tokens added in
// plain UTF-8, or a malformed byte) is copied through unchanged; llama.cpp writes
// "[UNK_BYTE_0x..]" for such code points instead.
std::string gpt2_unicode_to_bytes(std::string_view text);

}  // namespace fitllm::tokenizer
