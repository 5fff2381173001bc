#include "chat/jinja_filters.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "chat/jinja_access.h"
#include "chat/jinja_args.h"
#include "chat/jinja_operators.h"
#include "chat/py_text.h"
#include "chat/render_budget.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {
namespace {

// jinja2's built-in filters and tests that fitllm leaves out: accepted by jinja2, rejected here.
const std::set<std::string_view> kUnsupportedFilters = {"filesizeformat", "groupby",   "pprint", "random",   "slice",
                                                        "striptags",      "urlencode", "urlize", "wordwrap", "xmlattr"};

// soft_str: markup stays markup, everything else goes through str().
Value soft_str(const Value& v) {
    return v.is_string() ? v : Value::string(to_str(v));
}

// jinja2's ignore_case, applied to sort keys unless case_sensitive.
Value ignore_case(const Value& v) {
    return v.is_string() ? Value::string(py::lower(v.as_string())) : v;
}

// make_attrgetter: "a.b.0" looks up item by item (obj[part], falling back to attributes).
Value lookup_path(const Value& item, const Value& attribute) {
    if (attribute.is_none() || attribute.is_undefined()) return item;
    if (attribute.is_int()) return get_item(item, attribute);
    Value out = item;
    for (const std::string& part : py::split(to_str(attribute), std::string("."), -1)) {
        const bool numeric =
            !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
        int64_t index = 0;
        const auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), index);
        // An index past int64 finds nothing either way; as a string it fails the same.
        out = get_item(out, numeric && error == std::errc() ? Value::integer(index) : Value::string(part));
    }
    return out;
}

// make_multi_attrgetter: "a,b" sorts by several attributes; the key is a list either way.
Value sort_key(const Value& item, const Value& attribute, bool case_sensitive) {
    ValueList key;
    if (attribute.is_string()) {
        for (const std::string& part : py::split(attribute.as_string(), std::string(","), -1)) {
            const Value v = lookup_path(item, Value::string(part));
            key.push_back(case_sensitive ? v : ignore_case(v));
        }
    } else {
        const Value v = lookup_path(item, attribute);
        key.push_back(case_sensitive ? v : ignore_case(v));
    }
    return Value::list(std::move(key));
}

ValueList sorted(ValueList items, const std::function<Value(const Value&)>& key, bool reverse) {
    std::vector<std::pair<Value, Value>> keyed;
    for (auto& item : items) keyed.emplace_back(key(item), std::move(item));
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        return reverse ? compare(b.first, a.first) < 0 : compare(a.first, b.first) < 0;
    });
    ValueList out;
    for (auto& [k, v] : keyed) out.push_back(std::move(v));
    return out;
}

// Python's int(str, base): whitespace, sign, underscores between digits, optional base prefix.
std::optional<int64_t> parse_int(const std::string& text, int base) {
    std::string s = py::strip(text, std::nullopt, true, true);
    bool negative = false;
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
        negative = s[0] == '-';
        s.erase(0, 1);
    }
    if (s.size() > 2 && s[0] == '0') {
        const char p = static_cast<char>(s[1] | 0x20);
        if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2)) s.erase(0, 2);
    }
    std::string digits;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '_' && i > 0 && i + 1 < s.size() && s[i - 1] != '_') continue;
        digits += s[i];
    }
    if (digits.empty()) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(digits.c_str(), &end, base);
    if (*end != '\0' || errno == ERANGE) return std::nullopt;
    return negative ? -v : v;
}

// Python's float(str).
std::optional<double> parse_float(const std::string& text) {
    std::string s;
    for (char c : py::strip(text, std::nullopt, true, true))
        if (c != '_') s += c;
    if (s.empty()) return std::nullopt;
    const std::string lowered = py::lower(s);
    const std::string unsigned_part = (lowered[0] == '+' || lowered[0] == '-') ? lowered.substr(1) : lowered;
    if (unsigned_part == "inf" || unsigned_part == "infinity" || unsigned_part == "nan") {
        const double v =
            unsigned_part == "nan" ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
        return lowered[0] == '-' ? -v : v;
    }
    if (lowered.find_first_not_of("0123456789+-.e") != std::string::npos) return std::nullopt;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (*end != '\0') return std::nullopt;
    return v;
}

// Python ints are unbounded; fitllm's are 64-bit, and says so rather than wrap around.
int64_t truncate_to_int(double d) {
    const double t = std::trunc(d);
    if (!(t >= -9223372036854775808.0 && t < 9223372036854775808.0))
        throw EvalError("integer " + py::float_repr(t) + " does not fit: fitllm's template integers are 64-bit");
    return static_cast<int64_t>(t);
}

Value to_int(const Value& v, const Value& fallback, int base) {
    if (v.is_undefined()) fail_undefined(v);
    if (v.is_bool() || v.is_int()) return Value::integer(v.as_int());
    if (v.is_float()) {
        if (std::isnan(v.as_double())) return fallback;
        if (std::isinf(v.as_double())) throw EvalError("cannot convert float infinity to integer");
        return Value::integer(truncate_to_int(v.as_double()));
    }
    if (v.is_string()) {
        if (auto i = parse_int(v.as_string(), base)) return Value::integer(*i);
        if (auto f = parse_float(v.as_string())) {
            if (std::isinf(*f)) throw EvalError("cannot convert float infinity to integer");
            if (!std::isnan(*f)) return Value::integer(truncate_to_int(*f));
        }
    }
    return fallback;
}

Value python_round(const Value& v, int64_t precision, const std::string& method) {
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_number()) throw EvalError("type " + type_name(v) + " doesn't define __round__ method");
    if (method != "common" && method != "ceil" && method != "floor")
        throw EvalError("method must be common, ceil or floor");
    const double scale = std::pow(10.0, static_cast<double>(precision));
    if (method != "common") {
        const double x = v.as_double() * scale;
        return Value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
    }
    if (!v.is_float()) {  // round(int, n) stays an int
        if (precision >= 0) return Value::integer(v.as_int());
        if (precision < -18) return Value::integer(0);  // 10**19 is past every int64
        const double p = std::pow(10.0, static_cast<double>(-precision));
        return Value::integer(truncate_to_int(std::nearbyint(static_cast<double>(v.as_int()) / p) * p));
    }
    const double x = v.as_double();
    if (!std::isfinite(x)) return v;
    if (precision < 0) {
        const double p = std::pow(10.0, static_cast<double>(-precision));
        return Value::floating(std::nearbyint(x / p) * p);
    }
    // glibc's printf rounds the exact binary value half-to-even, as CPython's round() does.
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)), x);
    return Value::floating(std::strtod(buf, nullptr));
}

Value indent(const Value& input, const Value& width, bool first, bool blank) {
    if (!width.is_string()) check_value_size(width.as_int(), 1, "width");
    const std::string indention = width.is_string()
                                      ? width.as_string()
                                      : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
    // jinja2 appends "\n" to the value first: only strings survive that.
    if (input.is_undefined()) fail_undefined(input);
    if (input.is_list()) throw EvalError("'list' object has no attribute 'splitlines'");
    if (!input.is_string()) throw EvalError("unsupported operand type(s) for +=: '" + type_name(input) + "' and 'str'");
    const std::string s = to_str(input) + "\n";  // jinja2's quirk, so that splitlines sees the last line
    // Every line gets the indention: the lines count is checked first, then the text as it grows.
    const std::vector<std::string> lines = py::splitlines(s, false, active_limits().max_value_bytes / sizeof(Value));
    check_value_size(static_cast<uint64_t>(lines.size()) * sizeof(Value), "list of lines");
    std::string out;
    if (first) append_within_limit(out, indention);
    for (size_t i = 0; i < lines.size(); ++i) {
        if (i) append_within_limit(out, "\n");
        if (i && (blank || !lines[i].empty())) append_within_limit(out, indention);
        append_within_limit(out, lines[i]);
    }
    return Value::string(std::move(out), input.is_markup());
}

Value truncate(const Value& input, int64_t length, bool killwords, const std::string& end, int64_t leeway) {
    const int64_t end_len = static_cast<int64_t>(py::length(end));
    if (length < end_len)
        throw EvalError("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
    if (leeway < 0) throw EvalError("expected leeway >= 0, got " + std::to_string(leeway));
    int64_t longest = 0;  // length + leeway, which a template can make overflow
    if (__builtin_add_overflow(length, leeway, &longest)) longest = std::numeric_limits<int64_t>::max();
    if (length_of(input) <= longest) return input;  // anything with a length, as in jinja2
    if (!input.is_string()) {
        if (killwords)
            throw EvalError("can only concatenate " + type_name(input) + " (not \"str\") to " + type_name(input));
        throw EvalError("'" + type_name(input) + "' object has no attribute 'rsplit'");
    }
    const std::u32string s = py::decode(input.as_string());
    const std::string head = py::encode(s.substr(0, static_cast<size_t>(length - end_len)));
    if (killwords) return Value::string(head + end);
    return Value::string(py::rsplit(head, std::string(" "), 1)[0] + end);
}

int64_t wordcount(const std::string& s) {
    int64_t n = 0;
    bool in_word = false;
    for (char32_t cp : py::decode(s)) {
        std::string one;
        py::append_utf8(one, cp);
        const bool word = cp == U'_' || py::is_all(one, py::CharClass::alnum);
        if (word && !in_word) ++n;
        in_word = word;
    }
    return n;
}

CallArgs shift(const CallArgs& args, size_t n) {
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(std::min(n, args.positional.size())),
                           args.positional.end());
    rest.keyword = args.keyword;
    return rest;
}

// select/reject/selectattr/rejectattr: keep items whose test result equals `keep`.
Value select_items(const Value& input, const CallArgs& args, bool keep, bool by_attribute) {
    ValueList out;
    if (!truthy(input)) return Value::iterator(Value::IteratorKind::generator, std::move(out));
    Value attribute;
    size_t off = 0;
    if (by_attribute) {
        if (args.positional.empty()) throw EvalError("Missing parameter for attribute name");
        attribute = args.positional[0];
        off = 1;
    }
    const bool has_test = args.positional.size() > off;
    const std::string test = has_test ? to_str(args.positional[off]) : std::string();
    if (has_test && test_support(test) != Support::supported) throw EvalError("No test named '" + test + "'.");
    const CallArgs test_args = shift(args, off + 1);
    for (const Value& item : iterate(input)) {
        const Value subject = by_attribute ? lookup_path(item, attribute) : item;
        const bool result = has_test ? apply_test(test, subject, test_args) : truthy(subject);
        if (result == keep) out.push_back(item);
    }
    return Value::iterator(Value::IteratorKind::generator, std::move(out));
}

Value map_items(const Value& input, const CallArgs& args) {
    ValueList out;
    if (!truthy(input)) return Value::iterator(Value::IteratorKind::generator, std::move(out));
    if (args.positional.empty()) {
        Value attribute, fallback = Value::none();
        bool have_attribute = false;
        for (const auto& [k, v] : args.keyword) {
            if (k == "attribute") {
                attribute = v;
                have_attribute = true;
            } else if (k == "default") {
                fallback = v;
            } else {
                throw EvalError("Unexpected keyword argument '" + k + "'");
            }
        }
        if (!have_attribute) throw EvalError("map requires a filter argument");
        for (const Value& item : iterate(input)) {
            Value v = lookup_path(item, attribute);
            if (v.is_undefined() && !fallback.is_none()) v = fallback;
            out.push_back(std::move(v));
        }
        return Value::iterator(Value::IteratorKind::generator, std::move(out));
    }
    const std::string filter = to_str(args.positional[0]);
    if (filter_support(filter) != Support::supported) throw EvalError("No filter named '" + filter + "'.");
    const CallArgs rest = shift(args, 1);
    for (const Value& item : iterate(input)) out.push_back(apply_filter(filter, item, rest));
    check_value_size(static_cast<uint64_t>(out.size()) * sizeof(Value), "list");
    return Value::iterator(Value::IteratorKind::generator, std::move(out));
}

Value min_or_max(const Value& input, const CallArgs& args, bool want_max, std::string_view name) {
    BoundArgs a(name, args, {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}});
    const Items items = iterate(input);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    const bool cs = truthy(a[0]);
    auto key = [&](const Value& v) {
        const Value k = lookup_path(v, a[1]);
        return cs ? k : ignore_case(k);
    };
    size_t best = 0;
    Value best_key = key(items[0]);
    for (size_t i = 1; i < items.size(); ++i) {
        Value k = key(items[i]);
        const int c = compare(k, best_key, want_max ? ">" : "<");
        if (want_max ? c > 0 : c < 0) {
            best = i;
            best_key = std::move(k);
        }
    }
    return items[best];
}

// jinja2 writes map, select, unique, batch and items as generator functions: a bad input (or
// a bad argument) only raises once the result is iterated, so `{% if x|select %}` never fails.
template <class F>
Value lazily(F&& compute) {
    try {
        return compute();
    } catch (const EvalError& e) {
        if (e.is_fatal()) throw;  // a render limit ends the render now
        return Value::failed_generator(e.what());
    }
}

using FilterFn = Value (*)(const Value&, const CallArgs&);

const std::map<std::string_view, FilterFn>& filters() {
    static const std::map<std::string_view, FilterFn> table = {
        {"abs",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("abs", args, {});
             if (v.is_undefined()) fail_undefined(v);
             if (v.is_float()) return Value::floating(std::fabs(v.as_double()));
             if (v.is_number()) {
                 if (v.as_int() == std::numeric_limits<int64_t>::min())
                     throw EvalError("integer overflow: fitllm's template integers are 64-bit");
                 return Value::integer(std::llabs(v.as_int()));
             }
             throw EvalError("bad operand type for abs(): '" + type_name(v) + "'");
         }},
        {"attr",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("attr", args, {{"name", std::nullopt}});
             return get_python_attribute(v, to_str(a[0]));  // no fallback to items, unlike obj.name
         }},
        {"batch",
         [](const Value& v, const CallArgs& args) {
             return lazily([&] {
                 BoundArgs a("batch", args, {{"linecount", std::nullopt}, {"fill_with", Value::none()}});
                 const int64_t n = a[0].as_int();
                 if (!a[1].is_none()) check_value_size(n, sizeof(Value), "batch size");
                 ValueList out, row;
                 for (const Value& item : iterate(v)) {
                     if (static_cast<int64_t>(row.size()) == n) out.push_back(Value::list(std::exchange(row, {})));
                     row.push_back(item);
                 }
                 if (!row.empty()) {
                     if (!a[1].is_none())
                         while (static_cast<int64_t>(row.size()) < n) row.push_back(a[1]);
                     out.push_back(Value::list(std::move(row)));
                 }
                 return Value::iterator(Value::IteratorKind::generator, std::move(out));
             });
         }},
        {"capitalize",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("capitalize", args, {});
             return Value::string(py::capitalize(to_str(v)), v.is_markup());
         }},
        {"center",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("center", args, {{"width", Value::integer(80)}});
             const std::string s = to_str(v);
             const int64_t width = a[0].as_int();
             const int64_t margin = width - static_cast<int64_t>(py::length(s));
             if (margin <= 0) return soft_str(v);
             check_value_size(width, 1, "width");
             const int64_t left = margin / 2 + (margin & width & 1);  // CPython's str.center
             return Value::string(
                 std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(margin - left), ' '),
                 v.is_markup());
         }},
        {"count",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("count", args, {});
             return Value::integer(length_of(v));
         }},
        {"default",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("default", args, {{"default_value", Value::string("")}, {"boolean", Value::boolean(false)}});
             return (v.is_undefined() || (truthy(a[1]) && !truthy(v))) ? a[0] : v;
         }},
        {"dictsort",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("dictsort", args,
                         {{"case_sensitive", Value::boolean(false)},
                          {"by", Value::string("key")},
                          {"reverse", Value::boolean(false)}});
             if (v.is_undefined()) fail_undefined(v);
             if (!v.is_dict()) throw EvalError("'" + type_name(v) + "' object has no attribute 'items'");
             const std::string by = to_str(a[1]);
             if (by != "key" && by != "value") throw EvalError("You can only sort by either \"key\" or \"value\"");
             ValueList pairs;
             for (const auto& [k, val] : v.as_dict().entries()) pairs.push_back(Value::tuple({k, val}));
             const bool cs = truthy(a[0]);
             const size_t pos = by == "key" ? 0 : 1;
             return Value::list(sorted(
                 std::move(pairs), [&](const Value& p) { return cs ? p.items()[pos] : ignore_case(p.items()[pos]); },
                 truthy(a[2])));
         }},
        {"escape",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("escape", args, {});
             return v.is_markup() ? v : Value::string(html_escape(to_str(v)), true);
         }},
        {"first",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("first", args, {});
             const Items items = iterate(v);
             return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
         }},
        {"float",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("float", args, {{"default", Value::floating(0.0)}});
             if (v.is_undefined()) fail_undefined(v);
             if (v.is_number()) return Value::floating(v.as_double());
             if (v.is_string())
                 if (auto f = parse_float(v.as_string())) return Value::floating(*f);
             return a[0];
         }},
        {"forceescape",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("forceescape", args, {});
             return Value::string(html_escape(to_str(v)), true);
         }},
        {"format",
         [](const Value& v, const CallArgs& args) {
             if (!args.positional.empty() && !args.keyword.empty())
                 throw EvalError("can't handle positional and keyword arguments at the same time");
             if (!args.keyword.empty()) {
                 Dict d;
                 for (const auto& [k, val] : args.keyword) d.set(Value::string(k), val);
                 return Value::string(percent_format(to_str(v), Value::dict(std::move(d))));
             }
             return Value::string(percent_format(to_str(v), Value::tuple(args.positional)));
         }},
        {"indent",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a(
                 "indent", args,
                 {{"width", Value::integer(4)}, {"first", Value::boolean(false)}, {"blank", Value::boolean(false)}});
             return indent(v, a[0], truthy(a[1]), truthy(a[2]));
         }},
        {"int",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("int", args, {{"default", Value::integer(0)}, {"base", Value::integer(10)}});
             return to_int(v, a[0], static_cast<int>(a[1].as_int()));
         }},
        {"items",
         [](const Value& v, const CallArgs& args) {
             return lazily([&] {
                 BoundArgs a("items", args, {});
                 ValueList out;
                 if (v.is_undefined()) return Value::iterator(Value::IteratorKind::generator, std::move(out));
                 if (!v.is_dict()) throw EvalError("Can only get item pairs from a mapping.");
                 for (const auto& [k, val] : v.as_dict().entries()) out.push_back(Value::tuple({k, val}));
                 return Value::iterator(Value::IteratorKind::generator, std::move(out));
             });
         }},
        {"join",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("join", args, {{"d", Value::string("")}, {"attribute", Value::none()}});
             const std::string sep = to_str(a[0]);
             std::string out;
             bool first = true;
             for (const Value& item : iterate(v)) {
                 if (!first) append_within_limit(out, sep);
                 first = false;
                 const Value part = lookup_path(item, a[1]);
                 append_within_limit(out, part.is_string() ? part.as_string() : to_str(part));
             }
             return Value::string(std::move(out));
         }},
        {"last",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("last", args, {});
             if (v.is_iterator() && !v.is_dict_view())
                 throw EvalError("'" + type_name(v) + "' object is not reversible");
             const Items items = iterate(v);
             return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
         }},
        {"length",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("length", args, {});
             return Value::integer(length_of(v));
         }},
        {"list",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("list", args, {});
             return iterate(v).as_list();
         }},
        {"lower",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("lower", args, {});
             return Value::string(py::lower(to_str(v)), v.is_markup());
         }},
        {"map", [](const Value& v, const CallArgs& args) { return lazily([&] { return map_items(v, args); }); }},
        {"max", [](const Value& v, const CallArgs& args) { return min_or_max(v, args, true, "max"); }},
        {"min", [](const Value& v, const CallArgs& args) { return min_or_max(v, args, false, "min"); }},
        {"reject", [](const Value& v,
                      const CallArgs& args) { return lazily([&] { return select_items(v, args, false, false); }); }},
        {"rejectattr", [](const Value& v,
                          const CallArgs& args) { return lazily([&] { return select_items(v, args, false, true); }); }},
        {"replace",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("replace", args, {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value::none()}});
             const int64_t count = a[2].is_none() ? -1 : a[2].as_int();
             const std::string text = to_str(v), old_text = to_str(a[0]), new_text = to_str(a[1]);
             check_value_size(py::replaced_size(text, old_text, new_text, count), "string");
             return Value::string(py::replace(text, old_text, new_text, count));
         }},
        {"reverse",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("reverse", args, {});
             if (v.is_string()) return get_slice(v, Value::none(), Value::none(), Value::integer(-1));
             const bool reversible = !v.is_iterator() || v.is_dict_view();
             ValueList items = iterate(v).copy();
             std::reverse(items.begin(), items.end());
             // reversed() where Python can, else jinja2 falls back to a reversed list
             return reversible ? Value::iterator(Value::IteratorKind::reversed, std::move(items))
                               : Value::list(std::move(items));
         }},
        {"round",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("round", args, {{"precision", Value::integer(0)}, {"method", Value::string("common")}});
             return python_round(v, a[0].as_int(), to_str(a[1]));
         }},
        {"safe",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("safe", args, {});
             return Value::string(to_str(v), true);
         }},
        {"select", [](const Value& v,
                      const CallArgs& args) { return lazily([&] { return select_items(v, args, true, false); }); }},
        {"selectattr", [](const Value& v,
                          const CallArgs& args) { return lazily([&] { return select_items(v, args, true, true); }); }},
        {"sort",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("sort", args,
                         {{"reverse", Value::boolean(false)},
                          {"case_sensitive", Value::boolean(false)},
                          {"attribute", Value::none()}});
             const bool cs = truthy(a[1]);
             const Value attribute = a[2];
             return Value::list(sorted(
                 iterate(v).copy(), [&](const Value& item) { return sort_key(item, attribute, cs); }, truthy(a[0])));
         }},
        {"string",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("string", args, {});
             return soft_str(v);
         }},
        {"sum",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("sum", args, {{"attribute", Value::none()}, {"start", Value::integer(0)}});
             Value total = a[1];
             for (const Value& item : iterate(v)) {
                 const Value x = lookup_path(item, a[0]);
                 if (x.is_string())
                     throw EvalError("unsupported operand type(s) for +: '" + type_name(total) + "' and 'str'");
                 total = binary_op(BinaryExpr::Op::add, total, x);
             }
             return total;
         }},
        {"title",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("title", args, {});
             // jinja2's own title: words start after -, whitespace, (, {, [ or <.
             const std::u32string s = py::decode(to_str(v));
             std::u32string out;
             bool word_start = true;
             for (char32_t cp : s) {
                 const bool sep =
                     cp == U'-' || cp == U'(' || cp == U'{' || cp == U'[' || cp == U'<' || py::is_space(cp);
                 std::string one;
                 py::append_utf8(one, cp);
                 out += py::decode(sep ? one : word_start ? py::upper(one) : py::lower(one));
                 word_start = sep;
             }
             return Value::string(py::encode(out), v.is_markup());
         }},
        {"tojson",
         [](const Value& v, const CallArgs& args) {
             // HF's override: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
             BoundArgs a("tojson", args,
                         {{"ensure_ascii", Value::boolean(false)},
                          {"indent", Value::none()},
                          {"separators", Value::none()},
                          {"sort_keys", Value::boolean(false)}});
             JsonFormat format;
             format.ensure_ascii = truthy(a[0]);
             if (a[1].is_string())
                 format.indent = a[1].as_string();
             else if (a[1].is_number()) {
                 check_value_size(a[1].as_int(), 1, "indent");
                 format.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, a[1].as_int())), ' ');
             } else if (!a[1].is_none())
                 throw EvalError("indent must be an int, a str or None");
             if (!a[2].is_none()) {
                 const Items seps = iterate(a[2]);
                 if (seps.size() != 2) throw EvalError("separators must be an (item_separator, key_separator) pair");
                 format.separators = std::make_pair(to_str(seps[0]), to_str(seps[1]));
             }
             format.sort_keys = truthy(a[3]);
             return Value::string(to_json(v, format));
         }},
        {"trim",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("trim", args, {{"chars", Value::none()}});
             std::optional<std::string> chars;
             if (!a[0].is_none()) chars = to_str(a[0]);
             return Value::string(py::strip(to_str(v), chars, true, true), v.is_markup());
         }},
        {"truncate",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("truncate", args,
                         {{"length", Value::integer(255)},
                          {"killwords", Value::boolean(false)},
                          {"end", Value::string("...")},
                          {"leeway", Value::none()}});
             return truncate(v, a[0].as_int(), truthy(a[1]), to_str(a[2]), a[3].is_none() ? 5 : a[3].as_int());
         }},
        {"unique",
         [](const Value& v, const CallArgs& args) {
             return lazily([&] {
                 BoundArgs a("unique", args, {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}});
                 ValueList out;
                 Dict seen;  // hashed, as Python's set is: unique over 100,000 items is no n * n
                 for (const Value& item : iterate(v)) {
                     const Value k = lookup_path(item, a[1]);
                     Value key = truthy(a[0]) ? k : ignore_case(k);
                     if (key.is_list() || key.is_dict()) throw EvalError("unhashable type: '" + type_name(key) + "'");
                     if (!seen.find(key)) {
                         seen.set(std::move(key), Value::none());
                         out.push_back(item);
                     }
                 }
                 return Value::iterator(Value::IteratorKind::generator, std::move(out));
             });
         }},
        {"upper",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("upper", args, {});
             return Value::string(py::upper(to_str(v)), v.is_markup());
         }},
        {"wordcount",
         [](const Value& v, const CallArgs& args) {
             BoundArgs a("wordcount", args, {});
             return Value::integer(wordcount(to_str(v)));
         }},
    };
    return table;
}

std::string_view filter_alias(std::string_view name) {
    if (name == "d") return "default";
    if (name == "e") return "escape";
    return name;
}

}  // namespace

Support filter_support(std::string_view name) {
    if (filters().count(filter_alias(name))) return Support::supported;
    if (kUnsupportedFilters.count(name)) return Support::unsupported;
    return Support::unknown;
}

Value apply_filter(std::string_view name, const Value& input, const CallArgs& args) {
    const auto it = filters().find(filter_alias(name));
    if (it == filters().end()) throw EvalError("No filter named '" + std::string(name) + "'.");
    return it->second(input, args);
}

}  // namespace fitllm::chat::jinja
