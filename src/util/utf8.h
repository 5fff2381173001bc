#pragma once
// UTF-8 encoding shared by the tokenizer and the chat templates; header-only.
#include <string>

namespace fitllm::util {

// Appends cp in the 1..4 byte form its value needs. Surrogates are written as they are (the
// lenient re-encoding of llama.cpp and Python's surrogateescape both need that); callers that
// want strict UTF-8 check the code point first.
inline void append_utf8_unchecked(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

}  // namespace fitllm::util
