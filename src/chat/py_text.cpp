#include "chat/py_text.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "util/utf8.h"

namespace fitllm::chat::py {
namespace {

utf8proc_category_t category(char32_t cp) {
    return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(cp)));
}

bool is_cased(char32_t cp) {
    const auto c = category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}
bool is_lower_char(char32_t cp) {
    return category(cp) == UTF8PROC_CATEGORY_LL;
}
bool is_upper_char(char32_t cp) {
    return category(cp) == UTF8PROC_CATEGORY_LU;
}
bool is_title_char(char32_t cp) {
    return category(cp) == UTF8PROC_CATEGORY_LT;
}

// Characters that the Final_Sigma rule looks through (Unicode's Case_Ignorable, approximated
// by its categories plus the common apostrophes and dots).
bool is_case_ignorable(char32_t cp) {
    switch (category(cp)) {
        case UTF8PROC_CATEGORY_MN:
        case UTF8PROC_CATEGORY_ME:
        case UTF8PROC_CATEGORY_CF:
        case UTF8PROC_CATEGORY_LM:
        case UTF8PROC_CATEGORY_SK:
            return true;
        default:
            return cp == U'\'' || cp == U'.' || cp == U':' || cp == U'^' || cp == U'`' || cp == 0xB7 || cp == 0x2019;
    }
}

// Python's full case mappings where they differ from the simple one-to-one mappings that
// utf8proc offers (SpecialCasing.txt, unconditional part, the characters text is likely to hold).
struct FullMapping {
    char32_t cp;
    const char32_t* upper;
    const char32_t* title;
    const char32_t* lower;
};
constexpr FullMapping kFullMappings[] = {
    {0x00DF, U"SS", U"Ss", nullptr},                      // ß
    {0x0130, nullptr, nullptr, U"i\u0307"},               // İ
    {0x0149, U"\u02BCN", U"\u02BCN", nullptr},            // ŉ
    {0x01F0, U"J\u030C", U"J\u030C", nullptr},            // ǰ
    {0x0587, U"\u0535\u0552", U"\u0535\u0582", nullptr},  // և
    {0xFB00, U"FF", U"Ff", nullptr},
    {0xFB01, U"FI", U"Fi", nullptr},
    {0xFB02, U"FL", U"Fl", nullptr},
    {0xFB03, U"FFI", U"Ffi", nullptr},
    {0xFB04, U"FFL", U"Ffl", nullptr},
    {0xFB05, U"ST", U"St", nullptr},
    {0xFB06, U"ST", U"St", nullptr},
};

const FullMapping* full_mapping(char32_t cp) {
    for (const auto& m : kFullMappings)
        if (m.cp == cp) return &m;
    return nullptr;
}

void append_upper(std::u32string& out, char32_t cp) {
    if (const auto* m = full_mapping(cp); m && m->upper)
        out += m->upper;
    else
        out += static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)));
}
void append_title(std::u32string& out, char32_t cp) {
    if (const auto* m = full_mapping(cp); m && m->title)
        out += m->title;
    else
        out += static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp)));
}
// Lowercases text[i], applying Final_Sigma: a capital sigma that ends a word becomes ς.
void append_lower(std::u32string& out, const std::u32string& text, size_t i) {
    const char32_t cp = text[i];
    if (cp == 0x03A3) {
        size_t j = i;
        bool cased_before = false;
        while (j > 0) {
            --j;
            if (is_case_ignorable(text[j])) continue;
            cased_before = is_cased(text[j]);
            break;
        }
        bool cased_after = false;
        for (size_t k = i + 1; k < text.size(); ++k) {
            if (is_case_ignorable(text[k])) continue;
            cased_after = is_cased(text[k]);
            break;
        }
        out += (cased_before && !cased_after) ? char32_t{0x03C2} : char32_t{0x03C3};
        return;
    }
    if (const auto* m = full_mapping(cp); m && m->lower)
        out += m->lower;
    else
        out += static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}

// chars sorted, so that a long set of characters to strip costs log n a character.
bool in_chars(char32_t cp, const std::u32string& sorted_chars) {
    return std::binary_search(sorted_chars.begin(), sorted_chars.end(), cp);
}

std::string reversed(std::string_view s) {
    return std::string(s.rbegin(), s.rend());
}

}  // namespace

std::u32string decode(std::string_view s) {
    std::u32string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        utf8proc_int32_t cp = 0;
        const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                        static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
        if (n <= 0) {
            out += char32_t{0xFFFD};
            ++i;
        } else {
            out += static_cast<char32_t>(cp);
            i += static_cast<size_t>(n);
        }
    }
    return out;
}

void append_utf8(std::string& out, char32_t cp) {
    util::append_utf8_unchecked(out, cp);
}

std::string encode(std::u32string_view text) {
    std::string out;
    out.reserve(text.size());
    for (char32_t cp : text) append_utf8(out, cp);
    return out;
}

size_t length(std::string_view s) {
    size_t n = 0;
    for (char c : s)
        if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
    return n;
}

bool is_space(char32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

bool is_printable(char32_t cp) {
    if (cp == U' ') return true;
    switch (category(cp)) {
        case UTF8PROC_CATEGORY_CN:
        case UTF8PROC_CATEGORY_CC:
        case UTF8PROC_CATEGORY_CF:
        case UTF8PROC_CATEGORY_CS:
        case UTF8PROC_CATEGORY_CO:
        case UTF8PROC_CATEGORY_ZS:
        case UTF8PROC_CATEGORY_ZL:
        case UTF8PROC_CATEGORY_ZP:
            return false;
        default:
            return true;
    }
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
    const std::u32string text = decode(s);
    std::u32string set = chars ? decode(*chars) : std::u32string{};
    std::sort(set.begin(), set.end());
    auto strippable = [&](char32_t cp) { return chars ? in_chars(cp, set) : is_space(cp); };
    size_t begin = 0, end = text.size();
    if (left)
        while (begin < end && strippable(text[begin])) ++begin;
    if (right)
        while (end > begin && strippable(text[end - 1])) --end;
    return encode(std::u32string_view(text).substr(begin, end - begin));
}

size_t find_bytes(std::string_view s, std::string_view needle, size_t from) {
    if (from > s.size()) return std::string_view::npos;
    if (needle.empty()) return from;
    // glibc's memmem is the two-way algorithm: linear time whatever the input.
    const void* hit = memmem(s.data() + from, s.size() - from, needle.data(), needle.size());
    return hit ? static_cast<size_t>(static_cast<const char*>(hit) - s.data()) : std::string_view::npos;
}

size_t rfind_bytes(std::string_view s, std::string_view needle) {
    if (needle.size() > s.size()) return std::string_view::npos;
    if (needle.empty()) return s.size();
    // The last occurrence is the first of the reversed needle in the reversed text.
    const size_t hit = find_bytes(reversed(s), reversed(needle));
    return hit == std::string_view::npos ? hit : s.size() - hit - needle.size();
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                               size_t max_pieces) {
    std::vector<std::string> out;
    if (sep) {
        size_t pos = 0;
        while ((maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) && out.size() <= max_pieces) {
            const size_t hit = find_bytes(s, *sep, pos);
            if (hit == std::string_view::npos) break;
            out.emplace_back(s.substr(pos, hit - pos));
            pos = hit + sep->size();
        }
        out.emplace_back(s.substr(pos));
        return out;
    }
    const std::u32string text = decode(s);
    size_t i = 0;
    while (out.size() <= max_pieces) {
        while (i < text.size() && is_space(text[i])) ++i;
        if (i == text.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
            size_t end = text.size();
            while (end > i && is_space(text[end - 1])) --end;
            out.push_back(encode(std::u32string_view(text).substr(i, end - i)));
            break;
        }
        size_t j = i;
        while (j < text.size() && !is_space(text[j])) ++j;
        out.push_back(encode(std::u32string_view(text).substr(i, j - i)));
        i = j;
    }
    return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                                size_t max_pieces) {
    std::vector<std::string> out;
    if (sep) {
        // Splitting from the right is splitting the reversed text by the reversed separator.
        out = split(reversed(s), reversed(*sep), maxsplit, max_pieces);
        for (std::string& piece : out) std::reverse(piece.begin(), piece.end());
        std::reverse(out.begin(), out.end());
        return out;
    }
    const std::u32string text = decode(s);
    size_t j = text.size();
    while (out.size() <= max_pieces) {
        while (j > 0 && is_space(text[j - 1])) --j;
        if (j == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
            size_t begin = 0;
            while (begin < j && is_space(text[begin])) ++begin;
            out.push_back(encode(std::u32string_view(text).substr(begin, j - begin)));
            break;
        }
        size_t i = j;
        while (i > 0 && !is_space(text[i - 1])) --i;
        out.push_back(encode(std::u32string_view(text).substr(i, j - i)));
        j = i;
    }
    std::reverse(out.begin(), out.end());
    return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends, size_t max_pieces) {
    const std::u32string text = decode(s);
    std::vector<std::string> out;
    size_t start = 0, i = 0;
    while (i < text.size() && out.size() <= max_pieces) {
        const char32_t c = text[i];
        const bool is_break = c == U'\n' || c == U'\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
                              c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!is_break) {
            ++i;
            continue;
        }
        size_t eol = i + 1;
        if (c == U'\r' && eol < text.size() && text[eol] == U'\n') ++eol;
        out.push_back(encode(std::u32string_view(text).substr(start, (keepends ? eol : i) - start)));
        start = i = eol;
    }
    if (start < text.size() && out.size() <= max_pieces) out.push_back(encode(std::u32string_view(text).substr(start)));
    return out;
}

uint64_t replaced_size(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count) {
    const uint64_t hits =
        static_cast<uint64_t>(old_text.empty() ? static_cast<int64_t>(length(s)) + 1 : py::count(s, old_text));
    const uint64_t done = count < 0 ? hits : std::min<uint64_t>(hits, static_cast<uint64_t>(count));
    return s.size() - done * old_text.size() + done * new_text.size();
}

std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count) {
    std::string out;
    if (old_text.empty()) {
        // Python inserts `new` before every code point and at the end, up to count times.
        const std::u32string text = decode(s);
        int64_t done = 0;
        for (char32_t cp : text) {
            if (count < 0 || done < count) {
                out += new_text;
                ++done;
            }
            append_utf8(out, cp);
        }
        if (count < 0 || done < count) out += new_text;
        return out;
    }
    size_t pos = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
        const size_t hit = find_bytes(s, old_text, pos);
        if (hit == std::string_view::npos) break;
        out += s.substr(pos, hit - pos);
        out += new_text;
        pos = hit + old_text.size();
        ++done;
    }
    out += s.substr(pos);
    return out;
}

int64_t count(std::string_view s, std::string_view sub) {
    if (sub.empty()) return static_cast<int64_t>(length(s)) + 1;
    int64_t n = 0;
    for (size_t pos = find_bytes(s, sub); pos != std::string_view::npos; pos = find_bytes(s, sub, pos + sub.size()))
        ++n;
    return n;
}

int64_t find(std::string_view s, std::string_view sub, bool from_right) {
    const size_t hit = from_right ? rfind_bytes(s, sub) : find_bytes(s, sub);
    if (hit == std::string_view::npos) return -1;
    return static_cast<int64_t>(length(s.substr(0, hit)));
}

std::string upper(std::string_view s) {
    std::u32string out;
    for (char32_t cp : decode(s)) append_upper(out, cp);
    return encode(out);
}

std::string lower(std::string_view s) {
    const std::u32string text = decode(s);
    std::u32string out;
    for (size_t i = 0; i < text.size(); ++i) append_lower(out, text, i);
    return encode(out);
}

std::string swapcase(std::string_view s) {
    const std::u32string text = decode(s);
    std::u32string out;
    for (size_t i = 0; i < text.size(); ++i) {
        if (is_upper_char(text[i]))
            append_lower(out, text, i);
        else if (is_lower_char(text[i]))
            append_upper(out, text[i]);
        else
            out += text[i];
    }
    return encode(out);
}

std::string title(std::string_view s) {
    const std::u32string text = decode(s);
    std::u32string out;
    bool previous_is_cased = false;
    for (size_t i = 0; i < text.size(); ++i) {
        if (previous_is_cased)
            append_lower(out, text, i);
        else
            append_title(out, text[i]);
        previous_is_cased = is_cased(text[i]);
    }
    return encode(out);
}

std::string capitalize(std::string_view s) {
    const std::u32string text = decode(s);
    std::u32string out;
    for (size_t i = 0; i < text.size(); ++i) {
        if (i == 0)
            append_title(out, text[i]);
        else
            append_lower(out, text, i);
    }
    return encode(out);
}

bool is_upper(std::string_view s) {
    bool cased = false;
    for (char32_t cp : decode(s)) {
        if (is_lower_char(cp) || is_title_char(cp)) return false;
        if (is_upper_char(cp)) cased = true;
    }
    return cased;
}

bool is_lower(std::string_view s) {
    bool cased = false;
    for (char32_t cp : decode(s)) {
        if (is_upper_char(cp) || is_title_char(cp)) return false;
        if (is_lower_char(cp)) cased = true;
    }
    return cased;
}

bool is_all(std::string_view s, CharClass cls) {
    const std::u32string text = decode(s);
    if (text.empty()) return false;
    for (char32_t cp : text) {
        const auto c = category(cp);
        const bool decimal = c == UTF8PROC_CATEGORY_ND;
        const bool numeric = decimal || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
        const bool alpha = c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
                           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
        bool ok = false;
        switch (cls) {
            case CharClass::digit:
                ok = decimal || (c == UTF8PROC_CATEGORY_NO && (cp == 0xB2 || cp == 0xB3 || cp == 0xB9));
                break;
            case CharClass::decimal:
                ok = decimal;
                break;
            case CharClass::numeric:
                ok = numeric;
                break;
            case CharClass::alpha:
                ok = alpha;
                break;
            case CharClass::alnum:
                ok = alpha || numeric;
                break;
            case CharClass::space:
                ok = is_space(cp);
                break;
        }
        if (!ok) return false;
    }
    return true;
}

std::string repr(std::string_view s) {
    const std::u32string text = decode(s);
    const bool has_single = text.find(U'\'') != std::u32string::npos;
    const bool has_double = text.find(U'"') != std::u32string::npos;
    const char quote = (has_single && !has_double) ? '"' : '\'';
    std::string out(1, quote);
    char buf[16];
    for (char32_t cp : text) {
        if (cp == static_cast<char32_t>(quote) || cp == U'\\') {
            out += '\\';
            out += static_cast<char>(cp);
        } else if (cp == U'\t') {
            out += "\\t";
        } else if (cp == U'\n') {
            out += "\\n";
        } else if (cp == U'\r') {
            out += "\\r";
        } else if (cp < 0x20 || cp == 0x7F) {
            std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
            out += buf;
        } else if (cp < 0x7F || is_printable(cp)) {
            append_utf8(out, cp);
        } else {
            if (cp <= 0xFF)
                std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
            else if (cp <= 0xFFFF)
                std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
            else
                std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
            out += buf;
        }
    }
    out += quote;
    return out;
}

std::string float_repr(double value) {
    if (std::isnan(value)) return "nan";
    if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
    // Shortest round-trip digits and decimal exponent, then CPython's 'r' layout rules.
    std::array<char, 64> buf{};
    const auto res =
        std::to_chars(buf.data(), buf.data() + buf.size(), std::fabs(value), std::chars_format::scientific);
    const std::string_view sci(buf.data(), static_cast<size_t>(res.ptr - buf.data()));
    const size_t e_pos = sci.find('e');
    std::string digits;
    for (char c : sci.substr(0, e_pos))
        if (c != '.') digits += c;
    int exponent = 0;
    std::from_chars(sci.data() + e_pos + 1 + (sci[e_pos + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exponent);
    const int decpt = exponent + 1;  // value = 0.DIGITS * 10^decpt
    std::string out = std::signbit(value) ? "-" : "";
    const int n = static_cast<int>(digits.size());
    if (decpt <= -4 || decpt > 16) {
        out += digits[0];
        if (n > 1) out += "." + digits.substr(1);
        char ebuf[16];
        std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
        out += ebuf;
    } else if (decpt <= 0) {
        out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (decpt >= n) {
        out += digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
    } else {
        out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return out;
}

}  // namespace fitllm::chat::py
