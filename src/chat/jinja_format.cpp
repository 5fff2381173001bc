// Python's two string-formatting mini-languages, for `"%s" % x` and "{}".format(x) in
// templates: the common conversions, flags, widths and precisions; the rest fails clearly.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

#include "chat/jinja_access.h"
#include "chat/py_text.h"
#include "chat/render_budget.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {
namespace {

bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

// printf of one number; the width and precision in spec are within the render limit, so the
// text is sized first and then written whole ('%.500f' is longer than any fixed buffer).
template <class T>
std::string c_format(const std::string& spec, T v) {
    char buf[128];
    const int n = std::snprintf(buf, sizeof buf, spec.c_str(), v);
    if (n < 0) throw EvalError("cannot format " + spec);
    if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
    check_value_size(static_cast<uint64_t>(n), "formatted number");
    std::string out(static_cast<size_t>(n) + 1, '\0');
    std::snprintf(out.data(), out.size(), spec.c_str(), v);
    out.resize(static_cast<size_t>(n));
    return out;
}

std::string justify(std::string s, int64_t width, bool left) {
    const int64_t len = static_cast<int64_t>(py::length(s));
    if (width <= len) return s;
    check_value_size(width, 1, "width");
    const std::string fill(static_cast<size_t>(width - len), ' ');
    return left ? s + fill : fill + s;
}

// Digits of a width or precision in a format: read without overflow, and at most the render
// limit (printf takes an int; Python would try to allocate it).
int64_t parse_count(const std::string& format, size_t& i, std::string_view what) {
    const size_t start = i;
    int64_t n = 0;
    const int64_t limit = static_cast<int64_t>(active_limits().max_value_bytes);
    while (i < format.size() && is_digit(format[i])) {
        n = n * 10 + (format[i++] - '0');
        if (n > limit) {
            while (i < format.size() && is_digit(format[i])) ++i;
            fail_value_size(what, std::string_view(format).substr(start, i - start));
        }
    }
    return n;
}

// A width or precision given as an argument ('%*d'): an int within the render limit.
int64_t count_argument(const Value& v, std::string_view what) {
    if (!v.is_int() && !v.is_bool()) throw EvalError("* wants int");
    check_value_size(v.as_int() < 0 ? -(v.as_int() + 1) : v.as_int(), 1, what);
    return v.as_int();
}

// One %-conversion of value (already looked up) per Python's rules.
std::string percent_convert(const Value& v, const std::string& flags, int64_t width, int64_t precision, char type) {
    if (v.is_undefined() && type != 's' && type != 'r' && type != 'a') fail_undefined(v);
    const bool left = flags.find('-') != std::string::npos;
    switch (type) {
        case 's':
        case 'r':
        case 'a': {
            std::string s = type == 's' ? to_str(v) : to_repr(v);
            if (precision >= 0) s = py::encode(py::decode(s).substr(0, static_cast<size_t>(precision)));
            return justify(std::move(s), width, left);
        }
        case 'c': {
            std::string s;
            if (v.is_string() && py::length(v.as_string()) == 1)
                s = v.as_string();
            else if (v.is_int() && (v.as_int() < 0 || v.as_int() > 0x10FFFF))
                throw EvalError("%c arg not in range(0x110000)");
            else if (v.is_int())
                py::append_utf8(s, static_cast<char32_t>(v.as_int()));
            else
                throw EvalError("%c requires int or char");
            return justify(std::move(s), width, left);
        }
        default:
            break;
    }
    if (!v.is_number())
        throw EvalError(std::string("%") + type + " format: a real number is required, not " + type_name(v));
    std::string spec = "%" + flags;
    if (width >= 0) spec += std::to_string(width);
    if (precision >= 0) spec += "." + std::to_string(precision);
    switch (type) {
        case 'd':
        case 'i':
        case 'u': {
            if (v.is_float() && !(std::fabs(v.as_double()) < 9.2e18))
                throw EvalError("%d of " + py::float_repr(v.as_double()) + ": fitllm's template integers are 64-bit");
            return c_format(spec + "lld",
                            static_cast<long long>(v.is_float() ? std::trunc(v.as_double()) : v.as_int()));
        }
        case 'x':
        case 'X':
        case 'o':
            if (v.is_float()) throw EvalError(std::string("%") + type + " format: an integer is required, not float");
            return c_format(spec + "ll" + type, static_cast<long long>(v.as_int()));
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G':
            return c_format(spec + type, v.as_double());
        default:
            throw EvalError(std::string("unsupported format character '") + type + "'");
    }
}

}  // namespace

std::string percent_format(const std::string& format, const Value& args) {
    // Python treats any argument with __getitem__ (dict, list, jinja2's Undefined) as a possible
    // mapping, and then does not complain about arguments left unused.
    const bool mapping = args.is_dict() || args.is_undefined() || args.is_list();
    const ValueList positional = args.is_tuple() ? args.items() : ValueList{args};
    size_t next_arg = 0;
    std::string out;
    for (size_t i = 0; i < format.size(); ++i) {
        if (format[i] != '%') {
            out += format[i];
            continue;
        }
        if (++i >= format.size()) throw EvalError("incomplete format");
        Value value;
        bool have_value = false;
        if (format[i] == '(') {
            const size_t close = format.find(')', i);
            if (close == std::string::npos) throw EvalError("incomplete format key");
            if (args.is_undefined()) fail_undefined(args);
            if (!args.is_dict()) throw EvalError("format requires a mapping");
            const Value* v = args.as_dict().find(std::string_view(format).substr(i + 1, close - i - 1));
            if (!v) throw EvalError(py::repr(format.substr(i + 1, close - i - 1)));
            value = *v;
            have_value = true;
            i = close + 1;
        }
        std::string flags;
        while (i < format.size() && std::string_view("-+ #0").find(format[i]) != std::string_view::npos)
            flags += format[i++];
        auto take_number = [&](std::string_view what) -> int64_t {
            if (i < format.size() && format[i] == '*') {
                ++i;
                if (next_arg >= positional.size()) throw EvalError("not enough arguments for format string");
                return count_argument(positional[next_arg++], what);
            }
            if (i >= format.size() || !is_digit(format[i])) return -1;
            return parse_count(format, i, what);
        };
        int64_t width = take_number("width");
        if (width < -1) {  // '%*d' % (-5, x): a negative width left-justifies
            flags += '-';
            width = -width;
        }
        int64_t precision = -1;
        if (i < format.size() && format[i] == '.') {
            ++i;
            precision = std::max<int64_t>(0, take_number("precision"));
        }
        while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
        if (i >= format.size()) throw EvalError("incomplete format");
        const char type = format[i];
        if (type == '%') {
            out += '%';
            continue;
        }
        if (!have_value) {
            if (next_arg >= positional.size() || (mapping && !args.is_tuple() && next_arg > 0))
                throw EvalError("not enough arguments for format string");
            value = positional[next_arg++];
        }
        append_within_limit(out, percent_convert(value, flags, width, precision, type));
    }
    if (!mapping && next_arg < positional.size())
        throw EvalError("not all arguments converted during string formatting");
    return out;
}

namespace {

// format(value, spec) for the spec language: [[fill]align][sign][0][width][,|_][.precision][type].
std::string apply_format_spec(const Value& v, const std::string& spec) {
    if (spec.empty()) return to_str(v);
    size_t i = 0;
    std::string fill = " ";
    char align = 0;
    auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
    const std::u32string cps = py::decode(spec);
    if (cps.size() >= 2 && is_align(static_cast<char>(cps[1])) && cps[1] < 0x80) {
        fill = py::encode(cps.substr(0, 1));
        align = static_cast<char>(cps[1]);
        i = fill.size() + 1;
    } else if (is_align(spec[0])) {
        align = spec[0];
        i = 1;
    }
    char sign = '-';
    if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
    if (i < spec.size() && spec[i] == '0') {
        if (!align) {
            fill = "0";
            align = '=';
        }
        ++i;
    }
    const int64_t width = parse_count(spec, i, "width");
    char grouping = 0;
    if (i < spec.size() && (spec[i] == ',' || spec[i] == '_')) grouping = spec[i++];
    int64_t precision = -1;
    if (i < spec.size() && spec[i] == '.') {
        ++i;
        precision = parse_count(spec, i, "precision");
    }
    const char type = i < spec.size() ? spec[i++] : 0;
    if (i != spec.size()) throw EvalError("Invalid format specifier '" + spec + "'");

    std::string body;
    std::string sign_text;
    if (v.is_string() || (!v.is_number() && (type == 0 || type == 's'))) {
        if (type != 0 && type != 's')
            throw EvalError("Unknown format code '" + std::string(1, type) + "' for object of type 'str'");
        body = to_str(v);
        if (precision >= 0) body = py::encode(py::decode(body).substr(0, static_cast<size_t>(precision)));
        if (!align) align = '<';
    } else if (v.is_number()) {
        const bool integral = !v.is_float() && (type == 0 || type == 'd' || type == 'n' || type == 'x' || type == 'X' ||
                                                type == 'o' || type == 'b' || type == 'c');
        double d = v.as_double();
        if (integral && type == 'c') {  // the character of that code point
            if (v.as_int() < 0 || v.as_int() > 0x10FFFF) throw EvalError("%c arg not in range(0x110000)");
            py::append_utf8(body, static_cast<char32_t>(v.as_int()));
        } else if (integral) {
            long long n = v.as_int();
            if (n < 0)
                sign_text = "-";
            else if (sign == '+')
                sign_text = "+";
            else if (sign == ' ')
                sign_text = " ";
            const unsigned long long mag =
                n < 0 ? 0ULL - static_cast<unsigned long long>(n) : static_cast<unsigned long long>(n);
            if (type == 'b') {
                for (unsigned long long m = mag; m; m >>= 1)
                    body.insert(body.begin(), static_cast<char>('0' + (m & 1)));
                if (body.empty()) body = "0";
            } else {
                char buf[64];
                std::snprintf(buf, sizeof buf,
                              type == 'x'   ? "%llx"
                              : type == 'X' ? "%llX"
                              : type == 'o' ? "%llo"
                                            : "%llu",
                              mag);
                body = buf;
            }
            if (grouping && (type == 0 || type == 'd')) {
                std::string grouped;
                for (size_t k = 0; k < body.size(); ++k) {
                    if (k && (body.size() - k) % 3 == 0) grouped += grouping;
                    grouped += body[k];
                }
                body = grouped;
            }
        } else {
            if (std::signbit(d))
                sign_text = "-";
            else if (sign == '+')
                sign_text = "+";
            else if (sign == ' ')
                sign_text = " ";
            d = std::fabs(d);
            if (type == '%') d *= 100;
            const char t = type == 0 ? 'r' : type == '%' ? 'f' : type == 'n' ? 'g' : type;  // n: g in the C locale
            // t goes into a printf format: only the float conversions (never %n, %s or %p).
            if (std::string_view("reEfFgG").find(t) == std::string_view::npos)
                throw EvalError("Unknown format code '" + std::string(1, type) + "' for object of type '" +
                                type_name(v) + "'");
            if (t == 'r') {
                body = precision < 0 ? py::float_repr(d) : c_format("%." + std::to_string(precision) + "g", d);
            } else {
                body = c_format("%." + std::to_string(precision < 0 ? 6 : precision) + t, d);
            }
            if (type == '%') body += '%';
        }
        if (!align) align = '>';
    } else {
        throw EvalError("unsupported format string passed to " + type_name(v) + ".__format__");
    }
    const int64_t len = static_cast<int64_t>(py::length(sign_text + body));
    if (width <= len) return sign_text + body;
    check_value_size(width, fill.size(), "width");
    std::string padding;
    for (int64_t k = 0; k < width - len; ++k) padding += fill;
    switch (align) {
        case '<':
            return sign_text + body + padding;
        case '=':
            return sign_text + padding + body;
        case '^': {
            const size_t left = static_cast<size_t>((width - len) / 2) * fill.size();
            return padding.substr(0, left) + sign_text + body + padding.substr(left);
        }
        default:
            return padding + sign_text + body;
    }
}

}  // namespace

std::string brace_format(const std::string& format, const CallArgs& args) {
    std::string out;
    size_t auto_index = 0;
    bool used_auto = false, used_manual = false;
    for (size_t i = 0; i < format.size(); ++i) {
        const char c = format[i];
        if (c == '}') {
            if (i + 1 < format.size() && format[i + 1] == '}')
                ++i;
            else
                throw EvalError("Single '}' encountered in format string");
            out += '}';
            continue;
        }
        if (c != '{') {
            out += c;
            continue;
        }
        if (i + 1 < format.size() && format[i + 1] == '{') {
            out += '{';
            ++i;
            continue;
        }
        const size_t close = format.find('}', i);
        if (close == std::string::npos) throw EvalError("Single '{' encountered in format string");
        std::string field = format.substr(i + 1, close - i - 1);
        if (field.find('{') != std::string::npos)
            throw EvalError("nested replacement fields are not supported", EvalError::Kind::unsupported);
        i = close;
        std::string spec, conversion;
        if (size_t colon = field.find(':'); colon != std::string::npos) {
            spec = field.substr(colon + 1);
            field.resize(colon);
        }
        if (size_t bang = field.find('!'); bang != std::string::npos) {
            conversion = field.substr(bang + 1);
            field.resize(bang);
        }
        size_t end = 0;
        while (end < field.size() && field[end] != '.' && field[end] != '[') ++end;
        const std::string arg_name = field.substr(0, end);
        Value value;
        if (arg_name.empty() || std::all_of(arg_name.begin(), arg_name.end(), is_digit)) {
            size_t index = 0;
            if (arg_name.empty()) {
                if (used_manual)
                    throw EvalError("cannot switch from manual field specification to automatic field numbering");
                used_auto = true;
                index = auto_index++;
            } else {
                if (used_auto)
                    throw EvalError("cannot switch from automatic field numbering to manual field specification");
                used_manual = true;
                const auto [end_of_digits, error] =
                    std::from_chars(arg_name.data(), arg_name.data() + arg_name.size(), index);
                if (error != std::errc()) throw EvalError("Too many decimal digits in format string");
            }
            if (index >= args.positional.size())
                throw EvalError("Replacement index " + std::to_string(index) +
                                " out of range for positional args tuple");
            value = args.positional[index];
        } else {
            bool found = false;
            for (const auto& [k, v] : args.keyword) {
                if (k == arg_name) {
                    value = v;
                    found = true;
                }
            }
            if (!found) throw EvalError(py::repr(arg_name));
        }
        while (end < field.size()) {
            if (field[end] == '.') {
                size_t stop = end + 1;
                while (stop < field.size() && field[stop] != '.' && field[stop] != '[') ++stop;
                value = get_attribute(value, field.substr(end + 1, stop - end - 1));
                end = stop;
            } else {
                const size_t stop = field.find(']', end);
                if (stop == std::string::npos) throw EvalError("Missing ']' in format string");
                const std::string key = field.substr(end + 1, stop - end - 1);
                int64_t number = 0;
                const bool numeric = !key.empty() && std::all_of(key.begin(), key.end(), is_digit) &&
                                     std::from_chars(key.data(), key.data() + key.size(), number).ec == std::errc();
                value = get_item(value, numeric ? Value::integer(number) : Value::string(key));
                end = stop + 1;
            }
        }
        if (conversion == "r" || conversion == "a")
            value = Value::string(to_repr(value));
        else if (conversion == "s")
            value = Value::string(to_str(value));
        else if (!conversion.empty())
            throw EvalError("Unknown conversion specifier " + conversion);
        append_within_limit(out, apply_format_spec(value, spec));
    }
    return out;
}

}  // namespace fitllm::chat::jinja
