// JSON in and out of template values: chat messages and tools become values (from_json),
// and values become text as json.dumps writes it for HF's tojson filter (to_json). Both walk
// the value, so both stop at the render's max_depth, and the text stays within max_value_bytes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "chat/jinja_value.h"
#include "chat/py_text.h"
#include "chat/render_budget.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {
namespace {

template <class Json>
Value value_from_json(const Json& j) {
    const ValueWalk level;
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
            check_value_size(static_cast<uint64_t>(j.size()) * sizeof(Value), "list");
            ValueList items;
            items.reserve(j.size());
            for (const auto& item : j) items.push_back(value_from_json(item));
            return Value::list(std::move(items));
        }
        case nlohmann::json::value_t::object: {
            check_value_size(static_cast<uint64_t>(j.size()) * 2 * sizeof(Value), "dict");
            Dict d;
            for (auto it = j.begin(); it != j.end(); ++it) d.set(Value::string(it.key()), value_from_json(it.value()));
            return Value::dict(std::move(d));
        }
        default:
            throw EvalError("JSON value of type " + std::string(j.type_name()) + " cannot be used in a template");
    }
}

// Appends s as a JSON string; the text grows by up to 12 bytes a code point, so it is checked
// against max_value_bytes as it grows.
void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
    const uint64_t limit = active_limits().max_value_bytes;
    out += '"';
    char buf[16];
    for (char32_t cp : py::decode(s)) {
        if (out.size() > limit) check_value_size(out.size(), "JSON text");  // throws
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

    void put(std::string_view text) { append_within_limit(out, text); }

    // Indentation multiplies: every item of every level repeats the indent string level times.
    void newline() {
        put("\n");
        for (int i = 0; i < level; ++i) put(*format.indent);
    }

    void write(const Value& v) {
        const ValueWalk walk;
        switch (v.kind()) {
            case Value::Kind::none:
                put("null");
                return;
            case Value::Kind::boolean:
                put(v.as_bool() ? "true" : "false");
                return;
            case Value::Kind::integer:
                put(std::to_string(v.as_int()));
                return;
            case Value::Kind::floating:
                put(json_float(v.as_double()));
                return;
            case Value::Kind::string:
                json_string(out, v.as_string(), format.ensure_ascii);
                return;
            case Value::Kind::list:
            case Value::Kind::tuple: {
                const ValueList& items = v.items();
                if (items.empty()) {
                    put("[]");
                    return;
                }
                put("[");
                ++level;
                for (size_t i = 0; i < items.size(); ++i) {
                    if (i) put(item_separator);
                    if (format.indent) newline();
                    write(items[i]);
                }
                --level;
                if (format.indent) newline();
                put("]");
                return;
            }
            case Value::Kind::dict: {
                const std::vector<std::pair<Value, Value>>& own = v.as_dict().entries();
                if (own.empty()) {
                    put("{}");
                    return;
                }
                std::vector<std::pair<Value, Value>> sorted;
                if (format.sort_keys) {
                    sorted = own;
                    std::stable_sort(sorted.begin(), sorted.end(),
                                     [](const auto& a, const auto& b) { return compare(a.first, b.first) < 0; });
                }
                const auto& entries = format.sort_keys ? sorted : own;
                put("{");
                ++level;
                for (size_t i = 0; i < entries.size(); ++i) {
                    if (i) put(item_separator);
                    if (format.indent) newline();
                    json_string(out, json_key(entries[i].first), format.ensure_ascii);
                    put(key_separator);
                    write(entries[i].second);
                }
                --level;
                if (format.indent) newline();
                put("}");
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
