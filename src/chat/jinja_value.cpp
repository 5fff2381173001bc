#include "chat/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "chat/py_text.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {

Value Value::undefined(std::string reason) {
    Value v;
    v.ptr_ = std::make_shared<std::string>(std::move(reason));
    return v;
}
Value Value::none() {
    Value v;
    v.kind_ = Kind::none;
    return v;
}
Value Value::boolean(bool b) {
    Value v;
    v.kind_ = Kind::boolean;
    v.bool_ = b;
    return v;
}
Value Value::integer(int64_t i) {
    Value v;
    v.kind_ = Kind::integer;
    v.int_ = i;
    return v;
}
Value Value::floating(double f) {
    Value v;
    v.kind_ = Kind::floating;
    v.float_ = f;
    return v;
}
Value Value::string(std::string s, bool markup) {
    Value v;
    v.kind_ = Kind::string;
    v.markup_ = markup;
    v.ptr_ = std::make_shared<std::string>(std::move(s));
    return v;
}
Value Value::list(ValueList items) {
    Value v;
    v.kind_ = Kind::list;
    v.ptr_ = std::make_shared<ValueList>(std::move(items));
    return v;
}
Value Value::tuple(ValueList items) {
    Value v;
    v.kind_ = Kind::tuple;
    v.ptr_ = std::make_shared<ValueList>(std::move(items));
    return v;
}
Value Value::dict(Dict d) {
    Value v;
    v.kind_ = Kind::dict;
    v.ptr_ = std::make_shared<Dict>(std::move(d));
    return v;
}
Value Value::object(std::shared_ptr<Object> o) {
    Value v;
    v.kind_ = Kind::object;
    v.ptr_ = std::move(o);
    return v;
}
Value Value::callable(std::shared_ptr<const Callable> c) {
    Value v;
    v.kind_ = Kind::callable;
    v.ptr_ = std::const_pointer_cast<Callable>(std::move(c));
    return v;
}

namespace {
struct IteratorPayload {
    ValueList items;
    std::string error;  // a failed generator's error, raised when it is iterated
};
}  // namespace

Value Value::iterator(IteratorKind kind, ValueList items) {
    Value v;
    v.kind_ = Kind::iterator;
    v.int_ = static_cast<int64_t>(kind);
    v.ptr_ = std::make_shared<IteratorPayload>(IteratorPayload{std::move(items), {}});
    return v;
}

Value Value::failed_generator(std::string error) {
    Value v;
    v.kind_ = Kind::iterator;
    v.int_ = static_cast<int64_t>(IteratorKind::generator);
    v.ptr_ = std::make_shared<IteratorPayload>(IteratorPayload{{}, std::move(error)});
    return v;
}

const std::string& Value::pending_error() const {
    static const std::string kNone;
    return kind_ == Kind::iterator ? static_cast<const IteratorPayload*>(ptr_.get())->error : kNone;
}

double Value::as_double() const {
    switch (kind_) {
        case Kind::boolean:
            return bool_ ? 1.0 : 0.0;
        case Kind::integer:
            return static_cast<double>(int_);
        default:
            return float_;
    }
}
const std::string& Value::as_string() const {
    return *static_cast<const std::string*>(ptr_.get());
}
const ValueList& Value::items() const {
    if (kind_ == Kind::iterator) return static_cast<const IteratorPayload*>(ptr_.get())->items;
    return *static_cast<const ValueList*>(ptr_.get());
}
const Dict& Value::as_dict() const {
    return *static_cast<const Dict*>(ptr_.get());
}
Object& Value::as_object() const {
    return *static_cast<Object*>(ptr_.get());
}
const Callable& Value::as_callable() const {
    return *static_cast<const Callable*>(ptr_.get());
}
const std::string& Value::undefined_reason() const {
    static const std::string kNoReason;
    return ptr_ ? *static_cast<const std::string*>(ptr_.get()) : kNoReason;
}

bool Value::is_same(const Value& other) const {
    if (kind_ != other.kind_) return false;
    switch (kind_) {
        case Kind::undefined:
        case Kind::none:
            return true;
        case Kind::boolean:
            return bool_ == other.bool_;
        case Kind::integer:
            return int_ == other.int_;
        case Kind::floating:
            return float_ == other.float_;
        case Kind::string:
            return as_string() == other.as_string();
        default:
            return ptr_ == other.ptr_;
    }
}

const Value* Dict::find(const Value& key) const {
    for (const auto& [k, v] : entries_)
        if (equals(k, key)) return &v;
    return nullptr;
}
const Value* Dict::find(std::string_view key) const {
    for (const auto& [k, v] : entries_)
        if (k.is_string() && k.as_string() == key) return &v;
    return nullptr;
}
void Dict::set(Value key, Value value) {
    for (auto& [k, v] : entries_) {
        if (equals(k, key)) {
            v = std::move(value);
            return;
        }
    }
    entries_.emplace_back(std::move(key), std::move(value));
}

bool truthy(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
        case Value::Kind::none:
            return false;
        case Value::Kind::boolean:
            return v.as_bool();
        case Value::Kind::integer:
            return v.as_int() != 0;
        case Value::Kind::floating:
            return v.as_double() != 0.0;
        case Value::Kind::string:
            return !v.as_string().empty();
        case Value::Kind::list:
        case Value::Kind::tuple:
            return !v.items().empty();
        case Value::Kind::dict:
            return !v.as_dict().empty();
        case Value::Kind::iterator:
            return !v.is_dict_view() || !v.items().empty();
        default:
            return true;
    }
}

namespace {

std::string join_repr(const ValueList& items) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += to_repr(items[i]);
    }
    return out;
}

}  // namespace

std::string to_str(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return "";
        case Value::Kind::string:
            return v.as_string();
        default:
            return to_repr(v);
    }
}

std::string to_repr(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return "Undefined";
        case Value::Kind::none:
            return "None";
        case Value::Kind::boolean:
            return v.as_bool() ? "True" : "False";
        case Value::Kind::integer:
            return std::to_string(v.as_int());
        case Value::Kind::floating:
            return py::float_repr(v.as_double());
        case Value::Kind::string:
            return v.is_markup() ? "Markup(" + py::repr(v.as_string()) + ")" : py::repr(v.as_string());
        case Value::Kind::list:
            return "[" + join_repr(v.items()) + "]";
        case Value::Kind::tuple:
            return "(" + join_repr(v.items()) + (v.items().size() == 1 ? ",)" : ")");
        case Value::Kind::dict: {
            std::string out = "{";
            bool first = true;
            for (const auto& [k, val] : v.as_dict().entries()) {
                if (!first) out += ", ";
                first = false;
                out += to_repr(k) + ": " + to_repr(val);
            }
            return out + "}";
        }
        case Value::Kind::object:
            return v.as_object().repr();
        case Value::Kind::callable:
            return "<" + v.as_callable().describe() + ">";
        case Value::Kind::iterator:
            return v.is_dict_view() ? type_name(v) + "([" + join_repr(v.items()) + "])"
                                    : "<" + type_name(v) + " object>";
    }
    return "";
}

std::string type_name(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return "Undefined";
        case Value::Kind::none:
            return "NoneType";
        case Value::Kind::boolean:
            return "bool";
        case Value::Kind::integer:
            return "int";
        case Value::Kind::floating:
            return "float";
        case Value::Kind::string:
            return v.is_markup() ? "Markup" : "str";
        case Value::Kind::list:
            return "list";
        case Value::Kind::tuple:
            return "tuple";
        case Value::Kind::dict:
            return "dict";
        case Value::Kind::object: {
            const std::string full = v.as_object().type_name();
            return full.substr(full.rfind('.') + 1);
        }
        case Value::Kind::callable:
            return "function";
        case Value::Kind::iterator:
            switch (v.iterator_kind()) {
                case Value::IteratorKind::generator:
                    return "generator";
                case Value::IteratorKind::reversed:
                    return "list_reverseiterator";
                case Value::IteratorKind::dict_keys:
                    return "dict_keys";
                case Value::IteratorKind::dict_values:
                    return "dict_values";
                case Value::IteratorKind::dict_items:
                    return "dict_items";
            }
            return "iterator";
    }
    return "object";
}

std::string object_type_repr(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::none:
            return "None";
        case Value::Kind::undefined:
            return "jinja2.runtime.Undefined object";
        case Value::Kind::object:
            return v.as_object().type_name() + " object";
        case Value::Kind::string:
            return v.is_markup() ? "markupsafe.Markup object" : "str object";
        default:
            return type_name(v) + " object";
    }
}

bool equals(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
        return a.as_int() == b.as_int();
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
        case Value::Kind::undefined:
        case Value::Kind::none:
            return true;
        case Value::Kind::string:
            return a.as_string() == b.as_string();
        case Value::Kind::list:
        case Value::Kind::tuple: {
            const auto &x = a.items(), &y = b.items();
            if (x.size() != y.size()) return false;
            for (size_t i = 0; i < x.size(); ++i)
                if (!equals(x[i], y[i])) return false;
            return true;
        }
        case Value::Kind::dict: {
            const Dict &x = a.as_dict(), &y = b.as_dict();
            if (x.size() != y.size()) return false;
            for (const auto& [k, val] : x.entries()) {
                const Value* other = y.find(k);
                if (!other || !equals(val, *other)) return false;
            }
            return true;
        }
        default:
            return a.is_same(b);
    }
}

int compare(const Value& a, const Value& b, std::string_view op) {
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) {
            const double x = a.as_double(), y = b.as_double();
            return x < y ? -1 : (x > y ? 1 : 0);
        }
        const int64_t x = a.as_int(), y = b.as_int();
        return x < y ? -1 : (x > y ? 1 : 0);
    }
    if (a.is_string() && b.is_string()) {
        // UTF-8 byte order is code point order, which is how Python orders str.
        const int c = a.as_string().compare(b.as_string());
        return c < 0 ? -1 : (c > 0 ? 1 : 0);
    }
    if (a.kind() == b.kind() && a.is_sequence()) {
        const auto &x = a.items(), &y = b.items();
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (equals(x[i], y[i])) continue;
            return compare(x[i], y[i], op);
        }
        return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
    }
    throw EvalError("'" + std::string(op) + "' not supported between instances of '" + type_name(a) + "' and '" +
                    type_name(b) + "'");
}

void fail_undefined(const Value& v) {
    const std::string& reason = v.undefined_reason();
    throw EvalError(reason.empty() ? "value is undefined" : reason);
}

ValueList iterate(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return {};
        case Value::Kind::list:
        case Value::Kind::tuple:
        case Value::Kind::iterator:
            if (!v.pending_error().empty()) throw EvalError(v.pending_error());
            return v.items();
        case Value::Kind::dict: {
            ValueList keys;
            for (const auto& entry : v.as_dict().entries()) keys.push_back(entry.first);
            return keys;
        }
        case Value::Kind::string: {
            ValueList chars;
            for (char32_t cp : py::decode(v.as_string())) {
                std::string one;
                py::append_utf8(one, cp);
                chars.push_back(Value::string(std::move(one)));  // iterating a Markup yields plain str
            }
            return chars;
        }
        default:
            throw EvalError("'" + type_name(v) + "' object is not iterable");
    }
}

int64_t length_of(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return 0;
        case Value::Kind::string:
            return static_cast<int64_t>(py::length(v.as_string()));
        case Value::Kind::list:
        case Value::Kind::tuple:
            return static_cast<int64_t>(v.items().size());
        case Value::Kind::dict:
            return static_cast<int64_t>(v.as_dict().size());
        case Value::Kind::iterator:
            if (v.is_dict_view()) return static_cast<int64_t>(v.items().size());
            [[fallthrough]];
        default:
            throw EvalError("object of type '" + type_name(v) + "' has no len()");
    }
}

std::string html_escape(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&#34;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

namespace {

template <class Json>
Value value_from_json(const Json& j) {
    switch (j.type()) {
        case nlohmann::json::value_t::null:
            return Value::none();
        case nlohmann::json::value_t::boolean:
            return Value::boolean(j.template get<bool>());
        case nlohmann::json::value_t::number_integer:
            return Value::integer(j.template get<int64_t>());
        case nlohmann::json::value_t::number_unsigned: {
            const auto u = j.template get<uint64_t>();
            if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                return Value::integer(static_cast<int64_t>(u));
            return Value::floating(static_cast<double>(u));
        }
        case nlohmann::json::value_t::number_float:
            return Value::floating(j.template get<double>());
        case nlohmann::json::value_t::string:
            return Value::string(j.template get<std::string>());
        case nlohmann::json::value_t::array: {
            ValueList items;
            items.reserve(j.size());
            for (const auto& item : j) items.push_back(value_from_json(item));
            return Value::list(std::move(items));
        }
        case nlohmann::json::value_t::object: {
            Dict d;
            for (auto it = j.begin(); it != j.end(); ++it) d.set(Value::string(it.key()), value_from_json(it.value()));
            return Value::dict(std::move(d));
        }
        default:
            throw EvalError("JSON value of type " + std::string(j.type_name()) + " cannot be used in a template");
    }
}

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
    out += '"';
    char buf[16];
    for (char32_t cp : py::decode(s)) {
        switch (cp) {
            case U'"':
                out += "\\\"";
                continue;
            case U'\\':
                out += "\\\\";
                continue;
            case U'\n':
                out += "\\n";
                continue;
            case U'\r':
                out += "\\r";
                continue;
            case U'\t':
                out += "\\t";
                continue;
            case U'\b':
                out += "\\b";
                continue;
            case U'\f':
                out += "\\f";
                continue;
            default:
                break;
        }
        if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
            if (cp > 0xFFFF) {
                const char32_t v = cp - 0x10000;
                std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                              static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
            } else {
                std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
            }
            out += buf;
        } else {
            py::append_utf8(out, cp);
        }
    }
    out += '"';
}

std::string json_float(double f) {
    if (std::isnan(f)) return "NaN";
    if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
    return py::float_repr(f);
}

std::string json_key(const Value& key) {
    switch (key.kind()) {
        case Value::Kind::string:
            return key.as_string();
        case Value::Kind::none:
            return "null";
        case Value::Kind::boolean:
            return key.as_bool() ? "true" : "false";
        case Value::Kind::integer:
            return std::to_string(key.as_int());
        case Value::Kind::floating:
            return json_float(key.as_double());
        default:
            throw EvalError("keys must be str, int, float, bool or None, not " + type_name(key));
    }
}

struct JsonWriter {
    const JsonFormat& format;
    std::string item_separator;
    std::string key_separator;
    std::string out;
    int level = 0;

    void newline() {
        out += '\n';
        for (int i = 0; i < level; ++i) out += *format.indent;
    }

    void write(const Value& v) {
        switch (v.kind()) {
            case Value::Kind::none:
                out += "null";
                return;
            case Value::Kind::boolean:
                out += v.as_bool() ? "true" : "false";
                return;
            case Value::Kind::integer:
                out += std::to_string(v.as_int());
                return;
            case Value::Kind::floating:
                out += json_float(v.as_double());
                return;
            case Value::Kind::string:
                json_string(out, v.as_string(), format.ensure_ascii);
                return;
            case Value::Kind::list:
            case Value::Kind::tuple: {
                const ValueList& items = v.items();
                if (items.empty()) {
                    out += "[]";
                    return;
                }
                out += '[';
                ++level;
                for (size_t i = 0; i < items.size(); ++i) {
                    if (i) out += item_separator;
                    if (format.indent) newline();
                    write(items[i]);
                }
                --level;
                if (format.indent) newline();
                out += ']';
                return;
            }
            case Value::Kind::dict: {
                std::vector<std::pair<Value, Value>> entries = v.as_dict().entries();
                if (entries.empty()) {
                    out += "{}";
                    return;
                }
                if (format.sort_keys)
                    std::stable_sort(entries.begin(), entries.end(),
                                     [](const auto& a, const auto& b) { return compare(a.first, b.first) < 0; });
                out += '{';
                ++level;
                for (size_t i = 0; i < entries.size(); ++i) {
                    if (i) out += item_separator;
                    if (format.indent) newline();
                    json_string(out, json_key(entries[i].first), format.ensure_ascii);
                    out += key_separator;
                    write(entries[i].second);
                }
                --level;
                if (format.indent) newline();
                out += '}';
                return;
            }
            default:
                throw EvalError("Object of type " + type_name(v) + " is not JSON serializable");
        }
    }
};

}  // namespace

Value from_json(const nlohmann::ordered_json& j) {
    return value_from_json(j);
}
Value from_json(const nlohmann::json& j) {
    return value_from_json(j);
}

std::string to_json(const Value& v, const JsonFormat& format) {
    JsonWriter writer{format, format.indent ? "," : ", ", ": ", {}, 0};
    if (format.separators) {
        writer.item_separator = format.separators->first;
        writer.key_separator = format.separators->second;
    }
    writer.write(v);
    return std::move(writer.out);
}

}  // namespace fitllm::chat::jinja
