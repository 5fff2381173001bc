#pragma once
// Python's str semantics over UTF-8 text, as chat templates see them through jinja2: lengths
// and indices count code points, strip() strips Unicode whitespace, upper() follows Unicode
// case mappings, repr() quotes and escapes like CPython. Case mappings and categories come
// from utf8proc; the few full (one-to-many) mappings Python applies are listed in py_text.cpp.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fitllm::chat::py {

// Malformed UTF-8 decodes to U+FFFD per bad byte (templates and JSON input are UTF-8, so this
// only matters for broken GGUF metadata).
std::u32string decode(std::string_view utf8);
std::string encode(std::u32string_view text);
void append_utf8(std::string& out, char32_t cp);
size_t length(std::string_view utf8);

// str.isspace() for one code point: the characters str.split() and str.strip() treat as space.
bool is_space(char32_t cp);
// str.isprintable() for one code point.
bool is_printable(char32_t cp);

// str.strip/lstrip/rstrip; chars unset means whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep, maxsplit) and str.rsplit; sep unset means runs of whitespace. They stop after
// max_pieces + 1 pieces, so a caller with a limit sees that it was passed without the cost of
// a million small strings.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                               size_t max_pieces = SIZE_MAX);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                                size_t max_pieces = SIZE_MAX);
// str.splitlines(keepends): \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029; stops as split does.
std::vector<std::string> splitlines(std::string_view s, bool keepends, size_t max_pieces = SIZE_MAX);
// str.replace(old, new, count); count < 0 replaces all. replaced_size() is the size of the
// result, for a caller that must know it before building it.
std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count);
uint64_t replaced_size(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count);
// Byte offset of the first (last) occurrence of needle in s, npos if none, in time linear in
// the sizes (std::string_view::find may take |s| * |needle|, which a template can make huge).
size_t find_bytes(std::string_view s, std::string_view needle, size_t from = 0);
size_t rfind_bytes(std::string_view s, std::string_view needle);
// str.count(sub) and str.find/rfind(sub) (code point index, -1 if absent) over s[start:end].
int64_t count(std::string_view s, std::string_view sub);
int64_t find(std::string_view s, std::string_view sub, bool from_right);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string swapcase(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
bool is_upper(std::string_view s);           // str.isupper()
bool is_lower(std::string_view s);           // str.islower()
// str.isdigit / isalpha / isalnum / isspace / isdecimal / isnumeric.
enum class CharClass { digit, alpha, alnum, space, decimal, numeric };
bool is_all(std::string_view s, CharClass cls);

// repr() of a str: 'text' or "text" with CPython's escapes.
std::string repr(std::string_view s);
// repr() of a float: shortest round-trip digits, exponent form outside 1e-4 <= |x| < 1e16.
std::string float_repr(double value);

}  // namespace fitllm::chat::py
