#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

namespace fitllm::tokenizer {
namespace {

TEST(UnicodeUtf8, LengthFromLeadByteFollowsTheHighNibble) {
    EXPECT_EQ(utf8_length_from_lead_byte('a'), 1u);
    EXPECT_EQ(utf8_length_from_lead_byte(0x80), 1u);  // a continuation byte stands alone
    EXPECT_EQ(utf8_length_from_lead_byte(0xC3), 2u);
    EXPECT_EQ(utf8_length_from_lead_byte(0xE4), 3u);
    EXPECT_EQ(utf8_length_from_lead_byte(0xF0), 4u);
    EXPECT_EQ(utf8_length_from_lead_byte(0xFF), 4u);  // as llama.cpp: callers clamp to the text
}

TEST(UnicodeUtf8, SequenceLengthChecksTheFollowingBytes) {
    EXPECT_EQ(utf8_sequence_length("a", 0), 1u);
    EXPECT_EQ(utf8_sequence_length("\xC3\xA9", 0), 2u);          // é
    EXPECT_EQ(utf8_sequence_length("\xE4\xBD\xA0", 0), 3u);      // 你
    EXPECT_EQ(utf8_sequence_length("\xF0\x9F\xA6\x99", 0), 4u);  // 🦙
    EXPECT_EQ(utf8_sequence_length("\xE4\xBD", 0), 1u);          // truncated
    EXPECT_EQ(utf8_sequence_length("\xC3"
                                   "a",
                                   0),
              1u);                                               // no continuation byte
    EXPECT_EQ(utf8_sequence_length("\xC0\x80", 0), 1u);          // overlong NUL
    EXPECT_EQ(utf8_sequence_length("\xE0\x80\xAF", 0), 1u);      // overlong '/'
    EXPECT_EQ(utf8_sequence_length("\xED\xA0\x80", 0), 1u);      // surrogate U+D800
    EXPECT_EQ(utf8_sequence_length("\xF4\x90\x80\x80", 0), 1u);  // U+110000
    EXPECT_EQ(utf8_sequence_length("\x80", 0), 1u);
    EXPECT_EQ(utf8_sequence_length("x\xC3\xA9", 1), 2u);
}

TEST(UnicodeUtf8, DecodeAndEncodeRoundTrip) {
    for (const char32_t cp : {U'\0', U'a', U'\x7F', U'\x80', U'é', U'\x7FF', U'\x800', U'你', U'\xFFFD', U'\xFFFF',
                              U'\x10000', U'🦙', U'\x10FFFF'}) {
        const std::string encoded = utf8_encode(cp);
        size_t pos = 0;
        EXPECT_EQ(utf8_decode(encoded, pos), cp);
        EXPECT_EQ(pos, encoded.size());
    }
    EXPECT_EQ(utf8_encode(0xD800), "\xEF\xBF\xBD");
    EXPECT_EQ(utf8_encode(0x110000), "\xEF\xBF\xBD");
}

TEST(UnicodeUtf8, DecodeTurnsEachMalformedByteIntoReplacementChar) {
    const std::string text =
        "a\x80\xE4\xBD"
        "b";
    size_t pos = 0;
    EXPECT_EQ(utf8_decode(text, pos), U'a');
    EXPECT_EQ(utf8_decode(text, pos), kReplacementChar);
    EXPECT_EQ(pos, 2u);
    EXPECT_EQ(utf8_decode(text, pos), kReplacementChar);
    EXPECT_EQ(utf8_decode(text, pos), kReplacementChar);
    EXPECT_EQ(utf8_decode(text, pos), U'b');
    EXPECT_EQ(pos, text.size());
}

TEST(UnicodeUtf8, Validity) {
    EXPECT_TRUE(is_valid_utf8(""));
    EXPECT_TRUE(is_valid_utf8("plain ascii"));
    EXPECT_TRUE(is_valid_utf8("h\xC3\xA9llo \xF0\x9F\xA6\x99"));
    EXPECT_FALSE(is_valid_utf8("\xFF"));
    EXPECT_FALSE(is_valid_utf8("abc\xE4\xBD"));
    EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));
}

TEST(UnicodeUtf8, LenientReencodingIsWhatLlamaCppReads) {
    EXPECT_EQ(reencode_utf8_leniently("h\xC3\xA9llo"), "h\xC3\xA9llo");  // well-formed: unchanged
    EXPECT_EQ(reencode_utf8_leniently("a\x80"
                                      "b"),
              "a\xEF\xBF\xBD"
              "b");
    EXPECT_EQ(reencode_utf8_leniently("\xE4\xBD"), "\xEF\xBF\xBD\xEF\xBF\xBD");                 // truncated: each byte
    EXPECT_EQ(reencode_utf8_leniently(std::string_view("\xC0\x80", 2)), std::string(1, '\0'));  // overlong
    EXPECT_EQ(reencode_utf8_leniently("\xC1\xBF"), "\x7F");
    EXPECT_EQ(reencode_utf8_leniently("\xE0\x80\xAF"), "/");
    EXPECT_EQ(reencode_utf8_leniently("\xED\xA0\x80"), "\xED\xA0\x80");  // surrogate kept as is
    EXPECT_EQ(reencode_utf8_leniently("\xF8\x88\x80\x80\x80"),
              "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(reencode_utf8_leniently("\xF4\x90\x80\x80"), "\xEF\xBF\xBD");  // past U+10FFFF
}

TEST(UnicodeGpt2, MapsBytesToPrintableCodePoints) {
    EXPECT_EQ(bytes_to_gpt2_unicode("hello world"), "hello\xC4\xA0world");  // Ġ
    EXPECT_EQ(bytes_to_gpt2_unicode("\n"), "\xC4\x8A");                     // Ċ
    EXPECT_EQ(bytes_to_gpt2_unicode("\t"), "\xC4\x89");                     // ĉ
    EXPECT_EQ(bytes_to_gpt2_unicode("\xC3\xA9"), "\xC3\x83\xC2\xA9");       // é -> Ã©
    EXPECT_EQ(gpt2_code_point_of_byte(0x00), 0x100u);
    EXPECT_EQ(gpt2_code_point_of_byte('!'), U'!');
    EXPECT_EQ(gpt2_code_point_of_byte(0x7F), 0x121u);
    EXPECT_EQ(gpt2_code_point_of_byte(0xA0), 0x142u);
    EXPECT_EQ(gpt2_code_point_of_byte(0xA1), 0xA1u);
    EXPECT_EQ(gpt2_code_point_of_byte(0xAD), 0x143u);
    EXPECT_EQ(gpt2_code_point_of_byte(0xFF), 0xFFu);
}

TEST(UnicodeGpt2, EveryByteRoundTrips) {
    std::string all_bytes;
    for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
    const std::string mapped = bytes_to_gpt2_unicode(all_bytes);
    EXPECT_TRUE(is_valid_utf8(mapped));
    EXPECT_EQ(gpt2_unicode_to_bytes(mapped), all_bytes);
    // The mapping is one code point per byte, all distinct.
    std::u32string seen;
    for (int b = 0; b < 256; ++b) {
        const char32_t cp = gpt2_code_point_of_byte(static_cast<uint8_t>(b));
        EXPECT_EQ(seen.find(cp), std::u32string::npos) << b;
        seen += cp;
    }
}

TEST(UnicodeGpt2, UnmappedTextPassesThroughDetokenization) {
    EXPECT_EQ(gpt2_unicode_to_bytes("<|im_start|>"), "<|im_start|>");
    EXPECT_EQ(gpt2_unicode_to_bytes("\xE2\x96\x81x"), "\xE2\x96\x81x");  // ▁ is outside the mapping
    EXPECT_EQ(gpt2_unicode_to_bytes("\xC4\xA0\xE4\xBD\xA0"), " \xE4\xBD\xA0");
    EXPECT_EQ(gpt2_unicode_to_bytes("a\xFF"
                                    "b"),
              "a\xFF"
              "b");  // malformed: copied
    EXPECT_EQ(gpt2_unicode_to_bytes(""), "");
}

}  // namespace
}  // namespace fitllm::tokenizer
