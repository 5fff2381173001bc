#include "chat/jinja_lexer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include "chat/py_text.h"

namespace fitllm::chat::jinja {
namespace {

bool is_digit(char c) {
    return c >= '0' && c <= '9';
}
bool is_hex(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
uint32_t hex_value(char c) {
    if (is_digit(c)) return static_cast<uint32_t>(c - '0');
    return static_cast<uint32_t>((c | 0x20) - 'a' + 10);
}
bool is_ascii_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

// jinja2 drops a single trailing newline and turns \r\n and \r into \n before lexing.
std::string normalize_newlines(std::string_view source) {
    std::string out;
    out.reserve(source.size());
    for (size_t i = 0; i < source.size();) {
        const size_t cr = source.find('\r', i);
        out.append(source.substr(i, cr == std::string_view::npos ? source.npos : cr - i));
        if (cr == std::string_view::npos) break;
        out += '\n';
        i = cr + (cr + 1 < source.size() && source[cr + 1] == '\n' ? 2 : 1);
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
}

class Lexer {
public:
    Lexer(std::string_view source, const std::string& name, LexerOptions options)
        : src_(normalize_newlines(source)), name_(name), options_(options) {
        line_starts_.push_back(0);
        for (size_t i = 0; i < src_.size(); ++i)
            if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }

    std::vector<Token> run() {
        size_t pos = 0;
        bool line_starting = true;
        while (pos < src_.size()) {
            const size_t tag = find_tag_start(pos);
            if (tag == std::string::npos) {
                emit_data(src_.substr(pos), pos);
                break;
            }
            const char kind = src_[tag + 1];  // '%', '{' or '#'
            const char sign =
                (tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')) ? src_[tag + 2] : 0;
            const size_t raw_end = kind == '%' ? match_raw_begin(tag) : std::string::npos;
            std::string text = src_.substr(pos, tag - pos);
            strip_before_tag(text, sign, kind != '{', line_starting);
            emit_data(std::move(text), pos);
            const size_t after_begin = tag + 2 + (sign ? 1 : 0);
            if (raw_end != std::string::npos) {
                pos = lex_raw(raw_end, line_starting);
            } else if (kind == '#') {
                pos = skip_comment(tag, after_begin, line_starting);
            } else {
                pos = lex_tag(tag, after_begin, kind == '%', line_starting);
                if (pos == std::string::npos) break;  // ran out of source inside a tag
            }
        }
        tokens_.push_back(Token{TokenType::eof, {}, 0, 0, pos_at(src_.size())});
        return std::move(tokens_);
    }

private:
    // Tokens are made in source order, so the column is counted on from the position asked for
    // last; counting from the start of the line each time made a long line quadratic.
    SourcePos pos_at(size_t offset) const {
        const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
        const size_t line = static_cast<size_t>(it - line_starts_.begin());
        if (line != cursor_line_ || offset < cursor_offset_) {
            cursor_line_ = line;
            cursor_offset_ = *(it - 1);
            cursor_column_ = 1;
        }
        cursor_column_ += py::length(std::string_view(src_).substr(cursor_offset_, offset - cursor_offset_));
        cursor_offset_ = offset;
        return SourcePos{static_cast<uint32_t>(line), static_cast<uint32_t>(cursor_column_)};
    }

    [[noreturn]] void fail(size_t offset, const std::string& message) const {
        throw TemplateError(TemplateError::Kind::syntax, name_, pos_at(offset), message);
    }

    bool starts_with(size_t pos, std::string_view s) const { return src_.compare(pos, s.size(), s) == 0; }

    // Length of the Python-whitespace code point at pos, 0 if none.
    size_t space_at(size_t pos) const {
        if (pos >= src_.size()) return 0;
        utf8proc_int32_t cp = 0;
        const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(src_.data() + pos),
                                        static_cast<utf8proc_ssize_t>(src_.size() - pos), &cp);
        return (n > 0 && py::is_space(static_cast<char32_t>(cp))) ? static_cast<size_t>(n) : 0;
    }
    size_t skip_spaces(size_t pos) const {
        while (size_t n = space_at(pos)) pos += n;
        return pos;
    }

    size_t find_tag_start(size_t from) const {
        for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
            if (i + 1 < src_.size() && (src_[i + 1] == '%' || src_[i + 1] == '{' || src_[i + 1] == '#')) return i;
        }
        return std::string::npos;
    }

    // `{% raw %}` (with optional - or + and spaces): the offset after it, npos if this is another tag.
    size_t match_raw_begin(size_t tag) const {
        size_t p = tag + 2;
        if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
        p = skip_spaces(p);
        if (!starts_with(p, "raw")) return std::string::npos;
        p = skip_spaces(p + 3);
        if (starts_with(p, "-%}")) return skip_spaces(p + 3);
        if (starts_with(p, "%}")) return p + 2;
        return std::string::npos;
    }

    // The text before a tag loses trailing whitespace for `-`, and for block and comment tags
    // (lstrip_blocks) the indentation of the line the tag starts, unless the tag has `+`.
    void strip_before_tag(std::string& text, char sign, bool lstrip_applies, bool line_starting) const {
        if (sign == '-') {
            text = py::strip(text, std::nullopt, false, true);
            return;
        }
        if (sign == '+' || !options_.lstrip_blocks || !lstrip_applies) return;
        const size_t nl = text.rfind('\n');
        const size_t line_pos = nl == std::string::npos ? 0 : nl + 1;
        if (line_pos == 0 && !line_starting) return;
        if (line_pos == text.size()) return;
        for (size_t p = line_pos; p < text.size();) {
            const size_t n = space_at_in(text, p);
            if (n == 0) return;
            p += n;
        }
        text.resize(line_pos);
    }

    static size_t space_at_in(const std::string& s, size_t pos) {
        utf8proc_int32_t cp = 0;
        const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + pos),
                                        static_cast<utf8proc_ssize_t>(s.size() - pos), &cp);
        return (n > 0 && py::is_space(static_cast<char32_t>(cp))) ? static_cast<size_t>(n) : 0;
    }

    void emit_data(std::string text, size_t offset) {
        if (text.empty()) return;
        tokens_.push_back(Token{TokenType::data, std::move(text), 0, 0, pos_at(offset)});
    }

    void emit(TokenType type, std::string text, size_t offset) {
        tokens_.push_back(Token{type, std::move(text), 0, 0, pos_at(offset)});
    }

    // After a closing tag: what follows starts a line only if the tag ate a newline.
    bool ends_with_newline(size_t end) const { return end > 0 && src_[end - 1] == '\n'; }

    size_t skip_comment(size_t tag, size_t from, bool& line_starting) {
        for (size_t k = from; k + 1 < src_.size(); ++k) {
            size_t end = std::string::npos;
            if (starts_with(k, "+#}"))
                end = k + 3;
            else if (starts_with(k, "-#}"))
                end = skip_spaces(k + 3);
            else if (starts_with(k, "#}"))
                end = k + 2 + (options_.trim_blocks && starts_with(k + 2, "\n") ? 1 : 0);
            if (end == std::string::npos) continue;
            line_starting = ends_with_newline(end);
            return end;
        }
        fail(tag, "Missing end of comment tag");
    }

    size_t lex_raw(size_t content_start, bool& line_starting) {
        line_starting = ends_with_newline(content_start);
        for (size_t k = src_.find("{%", content_start); k != std::string::npos; k = src_.find("{%", k + 1)) {
            size_t p = k + 2;
            const char sign = (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ? src_[p] : 0;
            if (sign) ++p;
            p = skip_spaces(p);
            if (!starts_with(p, "endraw")) continue;
            p = skip_spaces(p + 6);
            size_t end = std::string::npos;
            if (starts_with(p, "+%}"))
                end = p + 3;
            else if (starts_with(p, "-%}"))
                end = skip_spaces(p + 3);
            else if (starts_with(p, "%}"))
                end = p + 2 + (options_.trim_blocks && starts_with(p + 2, "\n") ? 1 : 0);
            if (end == std::string::npos) continue;
            std::string text = src_.substr(content_start, k - content_start);
            strip_before_tag(text, sign, true, line_starting);
            emit_data(std::move(text), content_start);
            line_starting = ends_with_newline(end);
            return end;
        }
        fail(content_start, "Missing end of raw directive");
    }

    // Tokens between {% and %} or {{ and }}; npos when the source ends first (the parser then
    // reports the missing end).
    size_t lex_tag(size_t tag, size_t p, bool is_block, bool& line_starting) {
        emit(is_block ? TokenType::block_begin : TokenType::variable_begin, src_.substr(tag, p - tag), tag);
        std::vector<char> balancing;
        while (true) {
            if (balancing.empty()) {
                size_t end = std::string::npos;
                if (is_block) {
                    if (starts_with(p, "+%}"))
                        end = p + 3;
                    else if (starts_with(p, "-%}"))
                        end = skip_spaces(p + 3);
                    else if (starts_with(p, "%}"))
                        end = p + 2 + (options_.trim_blocks && starts_with(p + 2, "\n") ? 1 : 0);
                } else {
                    if (starts_with(p, "-}}"))
                        end = skip_spaces(p + 3);
                    else if (starts_with(p, "}}"))
                        end = p + 2;
                }
                if (end != std::string::npos) {
                    emit(is_block ? TokenType::block_end : TokenType::variable_end, src_.substr(p, end - p), p);
                    line_starting = ends_with_newline(end);
                    return end;
                }
            }
            if (p >= src_.size()) return std::string::npos;
            if (size_t n = space_at(p)) {
                p = skip_spaces(p + n);
                continue;
            }
            if (size_t end = match_float(p)) {
                lex_float(p, end);
                p = end;
            } else if (size_t iend = match_integer(p)) {
                lex_integer(p, iend);
                p = iend;
            } else if (size_t nend = match_name(p)) {
                emit(TokenType::name, src_.substr(p, nend - p), p);
                p = nend;
            } else if (src_[p] == '\'' || src_[p] == '"') {
                p = lex_string(p);
            } else {
                p = lex_operator(p, balancing);
            }
        }
    }

    // (\d+_)*\d+ : digits with single underscores between them; returns the end or 0.
    size_t match_digits(size_t p) const {
        if (p >= src_.size() || !is_digit(src_[p])) return 0;
        size_t end = p;
        while (end < src_.size() && is_digit(src_[end])) ++end;
        while (end + 1 < src_.size() && src_[end] == '_' && is_digit(src_[end + 1])) {
            ++end;
            while (end < src_.size() && is_digit(src_[end])) ++end;
        }
        return end;
    }

    size_t match_float(size_t p) const {
        if (p > 0 && src_[p - 1] == '.') return 0;
        size_t end = match_digits(p);
        if (!end) return 0;
        bool fraction = false;
        if (end < src_.size() && src_[end] == '.') {
            if (size_t f = match_digits(end + 1)) {
                end = f;
                fraction = true;
            }
        }
        if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
            size_t q = end + 1;
            if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
            if (size_t e = match_digits(q)) return e;
        }
        return fraction ? end : 0;
    }

    size_t match_integer(size_t p) const {
        if (p >= src_.size() || !is_digit(src_[p])) return 0;
        if (src_[p] == '0' && p + 1 < src_.size()) {
            const char base = static_cast<char>(src_[p + 1] | 0x20);
            auto digit_ok = [&](char c) {
                if (base == 'b') return c == '0' || c == '1';
                if (base == 'o') return c >= '0' && c <= '7';
                return is_hex(c);
            };
            if (base == 'b' || base == 'o' || base == 'x') {
                size_t q = p + 2, end = 0;
                while (true) {
                    size_t r = q;
                    if (r < src_.size() && src_[r] == '_') ++r;
                    if (r < src_.size() && digit_ok(src_[r])) {
                        q = end = r + 1;
                    } else {
                        break;
                    }
                }
                if (end) return end;
            }
        }
        if (src_[p] == '0') {
            size_t end = p + 1;
            while (true) {
                size_t r = end;
                if (r < src_.size() && src_[r] == '_') ++r;
                if (r < src_.size() && src_[r] == '0')
                    end = r + 1;
                else
                    break;
            }
            return end;
        }
        size_t end = p + 1;
        while (true) {
            size_t r = end;
            if (r < src_.size() && src_[r] == '_') ++r;
            if (r < src_.size() && is_digit(src_[r]))
                end = r + 1;
            else
                break;
        }
        return end;
    }

    size_t match_name(size_t p) const {
        auto name_char = [&](size_t q, bool first) -> size_t {
            if (q >= src_.size()) return 0;
            const char c = src_[q];
            if (is_ascii_name_start(c) || (!first && is_digit(c))) return 1;
            if (static_cast<unsigned char>(c) < 0x80) return 0;
            utf8proc_int32_t cp = 0;
            const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(src_.data() + q),
                                            static_cast<utf8proc_ssize_t>(src_.size() - q), &cp);
            if (n <= 0) return 0;
            const auto cat = utf8proc_category(cp);
            const bool letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
            const bool continuing = cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
                                    cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_PC;
            return (letter || (!first && continuing)) ? static_cast<size_t>(n) : 0;
        };
        size_t n = name_char(p, true);
        if (!n) return 0;
        size_t end = p + n;
        while (size_t m = name_char(end, false)) end += m;
        return end;
    }

    void lex_float(size_t p, size_t end) {
        std::string text;
        for (size_t i = p; i < end; ++i)
            if (src_[i] != '_') text += src_[i];
        Token t{TokenType::floating, src_.substr(p, end - p), 0, std::strtod(text.c_str(), nullptr), pos_at(p)};
        tokens_.push_back(std::move(t));
    }

    void lex_integer(size_t p, size_t end) {
        std::string digits;
        for (size_t i = p; i < end; ++i)
            if (src_[i] != '_') digits += src_[i];
        int base = 10;
        if (digits.size() > 1 && digits[0] == '0') {
            const char b = static_cast<char>(digits[1] | 0x20);
            base = b == 'b' ? 2 : b == 'o' ? 8 : b == 'x' ? 16 : 10;
            if (base != 10) digits.erase(0, 2);
        }
        errno = 0;
        const unsigned long long v = std::strtoull(digits.c_str(), nullptr, base);
        if (errno == ERANGE || v > static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()))
            fail(p, "integer literal " + src_.substr(p, end - p) + " is too large (fitllm integers are 64-bit)");
        tokens_.push_back(Token{TokenType::integer, src_.substr(p, end - p), static_cast<int64_t>(v), 0, pos_at(p)});
    }

    size_t lex_string(size_t p) {
        const char quote = src_[p];
        size_t q = p + 1;
        while (q < src_.size() && src_[q] != quote) q += (src_[q] == '\\' && q + 1 < src_.size()) ? 2 : 1;
        if (q >= src_.size()) fail(p, std::string("unexpected char '") + quote + "': unterminated string");
        tokens_.push_back(Token{TokenType::string, decode_string(p + 1, q), 0, 0, pos_at(p)});
        return q + 1;
    }

    // Python's unicode-escape decoding of a literal's body (what jinja2 applies).
    std::string decode_string(size_t begin, size_t end) const {
        std::string out;
        out.reserve(end - begin);
        for (size_t i = begin; i < end; ++i) {
            const char c = src_[i];
            if (c != '\\' || i + 1 >= end) {
                // The run up to the next backslash as it is, in one piece.
                const size_t run_end = std::min(end, src_.find('\\', i + 1));
                out.append(src_, i, run_end - i);
                i = run_end - 1;
                continue;
            }
            const char e = src_[++i];
            auto hex_escape = [&](int width) {
                uint32_t cp = 0;
                for (size_t k = 1; k <= static_cast<size_t>(width); ++k) {
                    if (i + k >= end || !is_hex(src_[i + k]))
                        fail(i - 1, e == 'x'   ? "truncated \\xXX escape"
                                    : e == 'u' ? "truncated \\uXXXX escape"
                                               : "truncated \\UXXXXXXXX escape");
                    cp = cp * 16 + hex_value(src_[i + k]);
                }
                if (cp > 0x10FFFF) fail(i - 1, "illegal Unicode character");
                i += static_cast<size_t>(width);
                py::append_utf8(out, static_cast<char32_t>(cp));
            };
            switch (e) {
                case '\n':
                    break;
                case '\\':
                    out += '\\';
                    break;
                case '\'':
                    out += '\'';
                    break;
                case '"':
                    out += '"';
                    break;
                case 'a':
                    out += '\a';
                    break;
                case 'b':
                    out += '\b';
                    break;
                case 'f':
                    out += '\f';
                    break;
                case 'n':
                    out += '\n';
                    break;
                case 'r':
                    out += '\r';
                    break;
                case 't':
                    out += '\t';
                    break;
                case 'v':
                    out += '\v';
                    break;
                case 'x':
                    hex_escape(2);
                    break;
                case 'u':
                    hex_escape(4);
                    break;
                case 'U':
                    hex_escape(8);
                    break;
                case 'N':
                    throw TemplateError(TemplateError::Kind::unsupported, name_, pos_at(i - 1),
                                        "\\N{...} escapes in string literals are not supported");
                default:
                    if (e >= '0' && e <= '7') {
                        uint32_t cp = static_cast<uint32_t>(e - '0');
                        for (int k = 0; k < 2 && i + 1 < end && src_[i + 1] >= '0' && src_[i + 1] <= '7'; ++k)
                            cp = cp * 8 + static_cast<uint32_t>(src_[++i] - '0');
                        py::append_utf8(out, static_cast<char32_t>(cp));
                    } else {
                        out += '\\';  // Python keeps unknown escapes as they are
                        out += e;
                    }
            }
        }
        return out;
    }

    size_t lex_operator(size_t p, std::vector<char>& balancing) {
        static constexpr std::string_view kTwoChar[] = {"**", "//", "==", "!=", ">=", "<="};
        for (std::string_view op : kTwoChar) {
            if (starts_with(p, op)) {
                emit(TokenType::op, std::string(op), p);
                return p + 2;
            }
        }
        const char c = src_[p];
        if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
            const size_t n = std::max<size_t>(1, py::encode(py::decode(src_.substr(p, 4)).substr(0, 1)).size());
            fail(p, "unexpected char " + py::repr(src_.substr(p, n)));
        }
        if (c == '{')
            balancing.push_back('}');
        else if (c == '(')
            balancing.push_back(')');
        else if (c == '[')
            balancing.push_back(']');
        else if (c == '}' || c == ')' || c == ']') {
            if (balancing.empty()) fail(p, std::string("unexpected '") + c + "'");
            const char expected = balancing.back();
            balancing.pop_back();
            if (expected != c) fail(p, std::string("unexpected '") + c + "', expected '" + expected + "'");
        }
        emit(TokenType::op, std::string(1, c), p);
        return p + 1;
    }

    std::string src_;
    const std::string& name_;
    LexerOptions options_;
    std::vector<size_t> line_starts_;
    std::vector<Token> tokens_;
    mutable size_t cursor_line_ = 0, cursor_offset_ = 0, cursor_column_ = 1;  // pos_at's last answer
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const std::string& template_name, LexerOptions options) {
    return Lexer(source, template_name, options).run();
}

std::string describe(const Token& token) {
    switch (token.type) {
        case TokenType::data:
            return "template data / text";
        case TokenType::block_begin:
            return "begin of statement block";
        case TokenType::block_end:
            return "end of statement block";
        case TokenType::variable_begin:
            return "begin of print statement";
        case TokenType::variable_end:
            return "end of print statement";
        case TokenType::name:
            return token.text;
        case TokenType::string:
            return "string";
        case TokenType::integer:
            return "integer";
        case TokenType::floating:
            return "float";
        case TokenType::op:
            return token.text;
        case TokenType::eof:
            return "end of template";
    }
    return "token";
}

}  // namespace fitllm::chat::jinja
