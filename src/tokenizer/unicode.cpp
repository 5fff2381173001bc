#include "tokenizer/unicode.h"

#include <array>

#include "util/utf8.h"

namespace fitllm::tokenizer {
namespace {

bool is_continuation(uint8_t b) {
    return (b & 0xC0) == 0x80;
}

uint8_t byte_at(std::string_view text, size_t pos) {
    return static_cast<uint8_t>(text[pos]);
}

// GPT-2 keeps the printable Latin-1 bytes as their own code points and moves the other 68
// (controls, space, DEL, the C1 range, NBSP, soft hyphen) to U+0100.. in byte order, so that
// no token text contains whitespace or control characters.
constexpr bool gpt2_keeps_byte(int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

constexpr std::array<char32_t, 256> make_byte_to_code_point() {
    std::array<char32_t, 256> table{};
    char32_t next_moved = 0x100;
    for (int b = 0; b < 256; ++b) table[b] = gpt2_keeps_byte(b) ? static_cast<char32_t>(b) : next_moved++;
    return table;
}
constexpr std::array<char32_t, 256> kByteToCodePoint = make_byte_to_code_point();

// Every mapped code point is below U+0144 (0x100 + 68), so the inverse is a small array;
// -1 marks code points the mapping never produces.
constexpr size_t kMappedCodePointLimit = 0x100 + 68;
constexpr std::array<int16_t, kMappedCodePointLimit> make_code_point_to_byte() {
    std::array<int16_t, kMappedCodePointLimit> table{};
    for (auto& entry : table) entry = -1;
    for (int b = 0; b < 256; ++b) table[kByteToCodePoint[b]] = static_cast<int16_t>(b);
    return table;
}
constexpr std::array<int16_t, kMappedCodePointLimit> kCodePointToByte = make_code_point_to_byte();

static_assert(kByteToCodePoint[' '] == 0x120, "space maps to U+0120 'Ġ'");
static_assert(kByteToCodePoint['\n'] == 0x10A, "newline maps to U+010A 'Ċ'");
static_assert(kByteToCodePoint[0xAD] == 0x143, "soft hyphen is the last moved byte");

// Writes cp in the 1..4 byte form its value needs, without rejecting surrogates.
void append_raw_encoding(std::string& out, char32_t cp) {
    util::append_utf8_unchecked(out, cp);
}

}  // namespace

size_t utf8_length_from_lead_byte(uint8_t lead) {
    static constexpr uint8_t kLengthByHighNibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return kLengthByHighNibble[lead >> 4];
}

size_t utf8_sequence_length(std::string_view text, size_t pos) {
    const uint8_t lead = byte_at(text, pos);
    if (lead < 0x80) return 1;
    size_t length = 0;
    // The second byte's range also rules out overlong forms, surrogates and values past U+10FFFF.
    uint8_t second_min = 0x80, second_max = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
        length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        length = 3;
        if (lead == 0xE0) second_min = 0xA0;
        if (lead == 0xED) second_max = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        length = 4;
        if (lead == 0xF0) second_min = 0x90;
        if (lead == 0xF4) second_max = 0x8F;
    } else {
        return 1;
    }
    if (pos + length > text.size()) return 1;
    const uint8_t second = byte_at(text, pos + 1);
    if (second < second_min || second > second_max) return 1;
    for (size_t i = 2; i < length; ++i) {
        if (!is_continuation(byte_at(text, pos + i))) return 1;
    }
    return length;
}

bool is_valid_utf8(std::string_view text) {
    size_t pos = 0;
    while (pos < text.size()) {
        if (byte_at(text, pos) < 0x80) {
            ++pos;
            continue;
        }
        const size_t length = utf8_sequence_length(text, pos);
        if (length == 1) return false;
        pos += length;
    }
    return true;
}

char32_t utf8_decode(std::string_view text, size_t& pos) {
    const uint8_t lead = byte_at(text, pos);
    const size_t length = utf8_sequence_length(text, pos);
    if (length == 1) {
        ++pos;
        return lead < 0x80 ? static_cast<char32_t>(lead) : kReplacementChar;
    }
    static constexpr uint8_t kLeadMask[5] = {0, 0, 0x1F, 0x0F, 0x07};
    char32_t cp = lead & kLeadMask[length];
    for (size_t i = 1; i < length; ++i) cp = (cp << 6) | (byte_at(text, pos + i) & 0x3F);
    pos += length;
    return cp;
}

void utf8_append(std::string& out, char32_t cp) {
    if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) cp = kReplacementChar;
    append_raw_encoding(out, cp);
}

std::string utf8_encode(char32_t cp) {
    std::string out;
    utf8_append(out, cp);
    return out;
}

std::string reencode_utf8_leniently(std::string_view text) {
    if (is_valid_utf8(text)) return std::string(text);
    std::string out;
    out.reserve(text.size() + 8);
    size_t pos = 0;
    while (pos < text.size()) {
        const uint8_t lead = byte_at(text, pos);
        if (lead < 0x80) {
            out += static_cast<char>(lead);
            ++pos;
            continue;
        }
        // llama.cpp only checks the lead byte's pattern and that continuation bytes follow.
        size_t length = 0;
        if ((lead & 0xE0) == 0xC0)
            length = 2;
        else if ((lead & 0xF0) == 0xE0)
            length = 3;
        else if ((lead & 0xF8) == 0xF0)
            length = 4;
        bool complete = length != 0 && pos + length <= text.size();
        for (size_t i = 1; complete && i < length; ++i) complete = is_continuation(byte_at(text, pos + i));
        if (!complete) {
            utf8_append(out, kReplacementChar);
            ++pos;
            continue;
        }
        static constexpr uint8_t kLeadMask[5] = {0, 0, 0x1F, 0x0F, 0x07};
        char32_t cp = lead & kLeadMask[length];
        for (size_t i = 1; i < length; ++i) cp = (cp << 6) | (byte_at(text, pos + i) & 0x3F);
        append_raw_encoding(out, cp > kMaxCodePoint ? kReplacementChar : cp);
        pos += length;
    }
    return out;
}

char32_t gpt2_code_point_of_byte(uint8_t b) {
    return kByteToCodePoint[b];
}

std::string bytes_to_gpt2_unicode(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (const char c : bytes) append_raw_encoding(out, kByteToCodePoint[static_cast<uint8_t>(c)]);
    return out;
}

std::string gpt2_unicode_to_bytes(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
        const size_t start = pos;
        const size_t length = utf8_sequence_length(text, pos);
        const char32_t cp = utf8_decode(text, pos);
        const bool well_formed = length > 1 || byte_at(text, start) < 0x80;
        if (well_formed && cp < kMappedCodePointLimit && kCodePointToByte[cp] >= 0) {
            out += static_cast<char>(kCodePointToByte[cp]);
        } else {
            out.append(text.substr(start, pos - start));
        }
    }
    return out;
}

}  // namespace fitllm::tokenizer
