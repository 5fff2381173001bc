#include "chat/jinja_access.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <set>

#include "chat/jinja_args.h"
#include "chat/py_text.h"
#include "chat/render_budget.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {
namespace {

const std::set<std::string_view> kStrMethods = {
    "capitalize",   "casefold",   "center",    "count",       "encode",    "endswith",     "expandtabs",   "find",
    "format",       "format_map", "index",     "isalnum",     "isalpha",   "isascii",      "isdecimal",    "isdigit",
    "isidentifier", "islower",    "isnumeric", "isprintable", "isspace",   "istitle",      "isupper",      "join",
    "ljust",        "lower",      "lstrip",    "maketrans",   "partition", "removeprefix", "removesuffix", "replace",
    "rfind",        "rindex",     "rjust",     "rpartition",  "rsplit",    "rstrip",       "split",        "splitlines",
    "startswith",   "strip",      "swapcase",  "title",       "translate", "upper",        "zfill"};
const std::set<std::string_view> kDictMethods = {"copy", "fromkeys", "get", "items", "keys", "values"};
const std::set<std::string_view> kListMethods = {"copy", "count", "index"};
const std::set<std::string_view> kTupleMethods = {"count", "index"};
// What HF's ImmutableSandboxedEnvironment refuses: methods that modify a dict or list in place.
const std::set<std::string_view> kUnsafeDictMethods = {"clear", "pop", "popitem", "setdefault", "update"};
const std::set<std::string_view> kUnsafeListMethods = {"append", "clear",  "extend",  "insert",
                                                       "pop",    "remove", "reverse", "sort"};

Value no_attribute(const Value& object, std::string_view name) {
    return Value::undefined(py::repr(object_type_repr(object)) + " has no attribute " + py::repr(name));
}
Value unsafe_attribute(const Value& object, std::string_view name) {
    return Value::undefined("access to attribute " + py::repr(name) + " of " + py::repr(type_name(object)) +
                            " object is unsafe.");
}

std::optional<std::string> optional_str(const Value& v, std::string_view what) {
    if (v.is_none()) return std::nullopt;
    if (!v.is_string()) throw EvalError(std::string(what) + " arg must be None or str");
    return v.as_string();
}

const std::string& require_str(const Value& v, std::string_view what) {
    if (!v.is_string()) throw EvalError(std::string(what) + "() argument must be str, not " + type_name(v));
    return v.as_string();
}

int64_t require_int(const Value& v, std::string_view what) {
    if (v.is_bool() || v.is_int()) return v.as_int();
    throw EvalError("'" + type_name(v) + "' object cannot be interpreted as an integer (in " + std::string(what) + ")");
}

// Python's slice.indices(): clamps start/stop for a sequence of `length` items.
struct SliceRange {
    int64_t start, stop, step;
};
SliceRange adjust_slice(int64_t length, const Value& start, const Value& stop, const Value& step) {
    auto index_of = [](const Value& v) -> std::optional<int64_t> {
        if (v.is_none() || v.is_undefined()) return std::nullopt;
        if (v.is_bool() || v.is_int()) return v.as_int();
        throw EvalError("slice indices must be integers or None or have an __index__ method");
    };
    SliceRange r{0, 0, index_of(step).value_or(1)};
    if (r.step == 0) throw EvalError("slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
        if (!v) return fallback;
        int64_t x = *v;
        if (x < 0) {
            x += length;
            if (x < 0) x = r.step < 0 ? -1 : 0;
        } else if (x >= length) {
            x = r.step < 0 ? length - 1 : length;
        }
        return x;
    };
    r.start = clamp(index_of(start), r.step < 0 ? length - 1 : 0);
    r.stop = clamp(index_of(stop), r.step < 0 ? -1 : length);
    return r;
}

template <class Seq>
Seq take_slice(const Seq& items, const SliceRange& r) {
    Seq out;
    for (int64_t i = r.start; r.step > 0 ? i < r.stop : i > r.stop;) {
        out.push_back(items[static_cast<size_t>(i)]);
        if (__builtin_add_overflow(i, r.step, &i)) break;  // s[1::2**63 - 1]: past the end either way
    }
    return out;
}

// s[start:end] in code points, for startswith/find/count's optional bounds.
std::string substring(const std::string& s, const Value& start, const Value& end) {
    if ((start.is_none() || start.is_undefined()) && (end.is_none() || end.is_undefined())) return s;
    const std::u32string text = py::decode(s);
    const SliceRange r = adjust_slice(static_cast<int64_t>(text.size()), start, end, Value::none());
    return r.start < r.stop ? py::encode(std::u32string_view(text).substr(static_cast<size_t>(r.start),
                                                                          static_cast<size_t>(r.stop - r.start)))
                            : std::string();
}

bool affix_matches(const std::string& s, const Value& affix, bool at_end, std::string_view method) {
    auto one = [&](const Value& a) {
        const std::string& x = require_str(a, method);
        if (x.size() > s.size()) return false;
        return at_end ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
    };
    if (affix.is_tuple()) return std::any_of(affix.items().begin(), affix.items().end(), one);
    if (!affix.is_string())
        throw EvalError(std::string(method) + " first arg must be str or a tuple of str, not " + type_name(affix));
    return one(affix);
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, char align) {
    const int64_t len = static_cast<int64_t>(py::length(s));
    if (width <= len) return s;
    check_value_size(width, fill.size(), "width");
    const int64_t total = width - len;
    int64_t left = align == '>' ? total : align == '^' ? total / 2 : 0;
    if (align == '^' && (total % 2) && (width % 2)) left = total / 2 + 1;  // str.center puts the odd space left
    std::string out;
    for (int64_t i = 0; i < left; ++i) out += fill;
    out += s;
    for (int64_t i = 0; i < total - left; ++i) out += fill;
    return out;
}

Value string_method(const Value& self, const std::string& name, const CallArgs& args) {
    const std::string& s = self.as_string();
    const bool markup = self.is_markup();
    auto str = [&](std::string r) { return Value::string(std::move(r), markup); };
    auto plain = [](std::string r) { return Value::string(std::move(r)); };
    // A list of strings is at most max_value_bytes / sizeof(Value) items long: the splits stop
    // one past that, and list_of refuses them.
    const size_t max_pieces = active_limits().max_value_bytes / sizeof(Value);
    auto list_of = [](const std::vector<std::string>& parts) {
        check_value_size(static_cast<uint64_t>(parts.size()) * sizeof(Value), "list");
        ValueList out;
        out.reserve(parts.size());
        for (const auto& p : parts) out.push_back(Value::string(p));
        return Value::list(std::move(out));
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        BoundArgs a(name, args, {{"chars", Value::none()}});
        return str(py::strip(s, optional_str(a[0], name), name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
        BoundArgs a(name, args, {{"sep", Value::none()}, {"maxsplit", Value::integer(-1)}});
        const auto sep = optional_str(a[0], "sep");
        if (sep && sep->empty()) throw EvalError("empty separator");
        const int64_t maxsplit = require_int(a[1], name);
        return list_of(name == "split" ? py::split(s, sep, maxsplit, max_pieces)
                                       : py::rsplit(s, sep, maxsplit, max_pieces));
    }
    if (name == "splitlines") {
        BoundArgs a(name, args, {{"keepends", Value::boolean(false)}});
        return list_of(py::splitlines(s, truthy(a[0]), max_pieces));
    }
    if (name == "startswith" || name == "endswith") {
        BoundArgs a(name, args, {{"prefix", std::nullopt}, {"start", Value::none()}, {"end", Value::none()}});
        return Value::boolean(affix_matches(substring(s, a[1], a[2]), a[0], name == "endswith", name));
    }
    if (name == "upper") return str(py::upper(s));
    if (name == "lower" || name == "casefold") return str(py::lower(s));
    if (name == "title") return str(py::title(s));
    if (name == "capitalize") return str(py::capitalize(s));
    if (name == "swapcase") return str(py::swapcase(s));
    if (name == "replace") {
        BoundArgs a(name, args, {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value::integer(-1)}});
        const std::string &old_text = require_str(a[0], name), &new_text = require_str(a[1], name);
        const int64_t count = require_int(a[2], name);
        check_value_size(py::replaced_size(s, old_text, new_text, count), "string");
        return str(py::replace(s, old_text, new_text, count));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
        BoundArgs a(name, args, {{"sub", std::nullopt}, {"start", Value::none()}, {"end", Value::none()}});
        const std::string& sub = require_str(a[0], name);
        const std::u32string text = py::decode(s);
        const SliceRange r = adjust_slice(static_cast<int64_t>(text.size()), a[1], a[2], Value::none());
        const std::string hay = r.start < r.stop
                                    ? py::encode(std::u32string_view(text).substr(
                                          static_cast<size_t>(r.start), static_cast<size_t>(r.stop - r.start)))
                                    : std::string();
        if (name == "count") return Value::integer(py::count(hay, sub));
        const int64_t at = py::find(hay, sub, name[0] == 'r');
        if (at < 0 && (name == "index" || name == "rindex")) throw EvalError("substring not found");
        return Value::integer(at < 0 ? -1 : at + r.start);
    }
    if (name == "join") {
        BoundArgs a(name, args, {{"iterable", std::nullopt}});
        std::string out;
        const Items items = iterate(a[0]);
        for (size_t i = 0; i < items.size(); ++i) {
            if (!items[i].is_string())
                throw EvalError("sequence item " + std::to_string(i) + ": expected str instance, " +
                                type_name(items[i]) + " found");
            if (i) append_within_limit(out, s);
            append_within_limit(out, items[i].as_string());
        }
        return str(std::move(out));
    }
    if (name == "format") return str(brace_format(s, args));
    if (name == "isdigit") return Value::boolean(py::is_all(s, py::CharClass::digit));
    if (name == "isdecimal") return Value::boolean(py::is_all(s, py::CharClass::decimal));
    if (name == "isnumeric") return Value::boolean(py::is_all(s, py::CharClass::numeric));
    if (name == "isalpha") return Value::boolean(py::is_all(s, py::CharClass::alpha));
    if (name == "isalnum") return Value::boolean(py::is_all(s, py::CharClass::alnum));
    if (name == "isspace") return Value::boolean(py::is_all(s, py::CharClass::space));
    if (name == "isupper") return Value::boolean(py::is_upper(s));
    if (name == "islower") return Value::boolean(py::is_lower(s));
    if (name == "isascii")
        return Value::boolean(std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; }));
    if (name == "center" || name == "ljust" || name == "rjust") {
        BoundArgs a(name, args, {{"width", std::nullopt}, {"fillchar", Value::string(" ")}});
        const std::string& fill = require_str(a[1], name);
        if (py::length(fill) != 1) throw EvalError("The fill character must be exactly one character long");
        return str(pad(s, require_int(a[0], name), fill, name == "center" ? '^' : name == "ljust" ? '<' : '>'));
    }
    if (name == "zfill") {
        BoundArgs a(name, args, {{"width", std::nullopt}});
        const int64_t width = require_int(a[0], name);
        const int64_t len = static_cast<int64_t>(py::length(s));
        if (width <= len) return str(s);
        check_value_size(width, 1, "width");
        const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
        return str((sign ? s.substr(0, 1) : "") + std::string(static_cast<size_t>(width - len), '0') +
                   s.substr(sign ? 1 : 0));
    }
    if (name == "partition" || name == "rpartition") {
        BoundArgs a(name, args, {{"sep", std::nullopt}});
        const std::string& sep = require_str(a[0], name);
        if (sep.empty()) throw EvalError("empty separator");
        const size_t at = name == "partition" ? py::find_bytes(s, sep) : py::rfind_bytes(s, sep);
        if (at == std::string::npos)
            return name == "partition" ? Value::tuple({plain(s), plain(""), plain("")})
                                       : Value::tuple({plain(""), plain(""), plain(s)});
        return Value::tuple({plain(s.substr(0, at)), plain(sep), plain(s.substr(at + sep.size()))});
    }
    if (name == "removeprefix" || name == "removesuffix") {
        BoundArgs a(name, args, {{"affix", std::nullopt}});
        const std::string& x = require_str(a[0], name);
        if (name == "removeprefix") return str(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
        const bool ends = x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
        return str(ends ? s.substr(0, s.size() - x.size()) : s);
    }
    throw EvalError("str." + name + "() is not supported by fitllm's template engine", EvalError::Kind::unsupported);
}

Value dict_method(const Value& self, const std::string& name, const CallArgs& args) {
    const Dict& d = self.as_dict();
    if (name == "items" || name == "keys" || name == "values") {
        BoundArgs a(name, args, {});
        ValueList out;
        for (const auto& [k, v] : d.entries())
            out.push_back(name == "items" ? Value::tuple({k, v}) : name == "keys" ? k : v);
        const auto kind = name == "items"  ? Value::IteratorKind::dict_items
                          : name == "keys" ? Value::IteratorKind::dict_keys
                                           : Value::IteratorKind::dict_values;
        return Value::iterator(kind, std::move(out));
    }
    if (name == "get") {
        BoundArgs a(name, args, {{"key", std::nullopt}, {"default", Value::none()}});
        const Value* v = d.find(a[0]);
        return v ? *v : a[1];
    }
    if (name == "copy") {
        BoundArgs a(name, args, {});
        return Value::dict(d);
    }
    throw EvalError("dict." + name + "() is not supported by fitllm's template engine", EvalError::Kind::unsupported);
}

Value sequence_method(const Value& self, const std::string& name, const CallArgs& args) {
    const ValueList& items = self.items();
    if (name == "count") {
        BoundArgs a(name, args, {{"value", std::nullopt}});
        return Value::integer(
            std::count_if(items.begin(), items.end(), [&](const Value& v) { return equals(v, a[0]); }));
    }
    if (name == "index") {
        BoundArgs a(name, args, {{"value", std::nullopt}});
        for (size_t i = 0; i < items.size(); ++i)
            if (equals(items[i], a[0])) return Value::integer(static_cast<int64_t>(i));
        throw EvalError(self.is_tuple() ? "tuple.index(x): x not in tuple" : to_repr(a[0]) + " is not in list");
    }
    if (name == "copy") return Value::list(items);
    throw EvalError("list." + name + "() is not supported by fitllm's template engine", EvalError::Kind::unsupported);
}

// A method looked up on a value, e.g. `message.content.strip`, waiting to be called.
class BoundMethod : public Callable {
public:
    BoundMethod(Value receiver, std::string name) : receiver_(std::move(receiver)), name_(std::move(name)) {}
    ~BoundMethod() override { dispose(receiver_); }
    std::string describe() const override {
        return "built-in method " + name_ + " of " + type_name(receiver_) + " object";
    }
    Value call(CallArgs args, CallContext&) const override {
        if (receiver_.is_string()) return string_method(receiver_, name_, args);
        if (receiver_.is_dict()) return dict_method(receiver_, name_, args);
        return sequence_method(receiver_, name_, args);
    }

private:
    Value receiver_;
    std::string name_;
};

Value method(const Value& receiver, std::string_view name) {
    return Value::callable(std::make_shared<BoundMethod>(receiver, std::string(name)));
}

// The Python attribute of a value if it has one (methods of built-in types, object attributes).
std::optional<Value> python_attribute(const Value& object, std::string_view name) {
    switch (object.kind()) {
        case Value::Kind::string:
            if (kStrMethods.count(name)) return method(object, name);
            break;
        case Value::Kind::dict:
            if (kUnsafeDictMethods.count(name)) return unsafe_attribute(object, name);
            if (kDictMethods.count(name)) return method(object, name);
            break;
        case Value::Kind::list:
            if (kUnsafeListMethods.count(name)) return unsafe_attribute(object, name);
            if (kListMethods.count(name)) return method(object, name);
            break;
        case Value::Kind::tuple:
            if (kTupleMethods.count(name)) return method(object, name);
            break;
        case Value::Kind::object:
            return object.as_object().attribute(name);
        default:
            break;
    }
    if (name.size() > 1 && name.substr(0, 2) == "__") return unsafe_attribute(object, name);
    return std::nullopt;
}

// obj[key] without the attribute fallback; nullopt when Python would raise KeyError/IndexError/TypeError.
std::optional<Value> python_item(const Value& object, const Value& key) {
    switch (object.kind()) {
        case Value::Kind::dict:
            if (const Value* v = object.as_dict().find(key)) return *v;
            return std::nullopt;
        case Value::Kind::list:
        case Value::Kind::tuple:
        case Value::Kind::string: {
            if (!key.is_int() && !key.is_bool()) return std::nullopt;
            int64_t i = key.as_int();
            if (object.is_string()) {
                const std::u32string text = py::decode(object.as_string());
                if (i < 0) i += static_cast<int64_t>(text.size());
                if (i < 0 || i >= static_cast<int64_t>(text.size())) return std::nullopt;
                std::string one;
                py::append_utf8(one, text[static_cast<size_t>(i)]);
                return Value::string(std::move(one), object.is_markup());
            }
            const ValueList& items = object.items();
            if (i < 0) i += static_cast<int64_t>(items.size());
            if (i < 0 || i >= static_cast<int64_t>(items.size())) return std::nullopt;
            return items[static_cast<size_t>(i)];
        }
        default:
            return std::nullopt;
    }
}

}  // namespace

Value get_attribute(const Value& object, std::string_view name) {
    if (object.is_undefined()) fail_undefined(object);
    if (auto attr = python_attribute(object, name)) return *attr;
    if (auto item = python_item(object, Value::string(std::string(name)))) return *item;
    return no_attribute(object, name);
}

Value get_python_attribute(const Value& object, std::string_view name) {
    if (object.is_undefined()) fail_undefined(object);
    if (auto attr = python_attribute(object, name)) return *attr;
    return no_attribute(object, name);
}

Value get_item(const Value& object, const Value& key) {
    if (object.is_undefined()) fail_undefined(object);
    if (auto item = python_item(object, key)) return *item;
    if (key.is_string()) {
        if (auto attr = python_attribute(object, key.as_string())) return *attr;
        return no_attribute(object, key.as_string());
    }
    return Value::undefined(object_type_repr(object) + " has no element " + to_repr(key));
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
    if (object.is_undefined()) fail_undefined(object);
    if (object.is_string()) {
        const std::u32string text = py::decode(object.as_string());
        const SliceRange r = adjust_slice(static_cast<int64_t>(text.size()), start, stop, step);
        return Value::string(py::encode(take_slice(text, r)), object.is_markup());
    }
    if (object.is_sequence()) {
        const ValueList& items = object.items();
        ValueList out = take_slice(items, adjust_slice(static_cast<int64_t>(items.size()), start, stop, step));
        return object.is_list() ? Value::list(std::move(out)) : Value::tuple(std::move(out));
    }
    // jinja2 slices with Python's obj[a:b] directly, not through its getitem, so failures raise.
    if (object.is_dict()) throw EvalError("unhashable type: 'slice'");
    throw EvalError("'" + type_name(object) + "' object is not subscriptable");
}

}  // namespace fitllm::chat::jinja
