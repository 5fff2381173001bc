#include "sampling/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "sampling/grammar.h"

namespace fitllm::sampling {
namespace {

using json = nlohmann::ordered_json;

// JSON's building blocks. Whitespace and digits are bounded, so that a generation cannot go on
// forever inside a number or between tokens.
constexpr const char* kPrimitives = R"(ws ::= [ \t\n]{0,16}
char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\""
number ::= "-"? ("0" | [1-9] [0-9]{0,17}) ("." [0-9]{1,15})? ([eE] [-+]? [0-9]{1,2})?
integer ::= "-"? ("0" | [1-9] [0-9]{0,17})
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}"
array ::= "[" ws (value ws ("," ws value ws)*)? "]"
)";

constexpr int kMaxSchemaDepth = 64;
constexpr uint64_t kMaxMagnitude = 999999999999999999ULL;  // 18 digits

const std::set<std::string>& annotations() {
    static const std::set<std::string> a = {"title", "description", "default",    "examples", "$schema",
                                            "$id",   "$comment",    "deprecated", "readOnly", "writeOnly",
                                            "$defs", "definitions", "$anchor"};
    return a;
}

// ---- integer ranges as digit patterns

std::string digit_class(char lo, char hi) {
    if (lo == hi) return std::string("\"") + lo + "\"";
    if (lo == '0' && hi == '9') return "[0-9]";
    return std::string("[") + lo + "-" + hi + "]";
}

std::string any_digits(size_t n) {
    if (n == 0) return "";
    if (n == 1) return " [0-9]";
    return " [0-9]{" + std::to_string(n) + "}";
}

// Every digit string of a's length from a to b (equal lengths, leading zeros allowed), as
// alternatives each a sequence of GBNF items.
void fixed_range(const std::string& a, const std::string& b, const std::string& prefix, std::vector<std::string>& out) {
    const size_t n = a.size();
    if (n == 0) {
        out.push_back(prefix.empty() ? "\"\"" : prefix);
        return;
    }
    const auto sep = [&prefix] { return prefix.empty() ? std::string() : prefix + " "; };
    if (a == b) {
        out.push_back(sep() + "\"" + a + "\"");
        return;
    }
    const bool low_zeros = std::all_of(a.begin() + 1, a.end(), [](char c) { return c == '0'; });
    const bool high_nines = std::all_of(b.begin() + 1, b.end(), [](char c) { return c == '9'; });
    if (low_zeros && high_nines) {
        out.push_back(sep() + digit_class(a[0], b[0]) + any_digits(n - 1));
        return;
    }
    if (a[0] == b[0]) {
        fixed_range(a.substr(1), b.substr(1), sep() + "\"" + a[0] + "\"", out);
        return;
    }
    fixed_range(a.substr(1), std::string(n - 1, '9'), sep() + "\"" + a[0] + "\"", out);
    if (a[0] + 1 <= b[0] - 1) out.push_back(sep() + digit_class(char(a[0] + 1), char(b[0] - 1)) + any_digits(n - 1));
    fixed_range(std::string(n - 1, '0'), b.substr(1), sep() + "\"" + b[0] + "\"", out);
}

// Decimal integers (no sign, no leading zeros) in [lo, hi].
void nonneg_range(uint64_t lo, uint64_t hi, std::vector<std::string>& out) {
    const std::string slo = std::to_string(lo), shi = std::to_string(hi);
    for (size_t len = slo.size(); len <= shi.size(); ++len) {
        uint64_t first = 1;
        for (size_t i = 1; i < len; ++i) first *= 10;
        const uint64_t a = std::max(lo, len == 1 ? 0 : first);
        const uint64_t b = std::min(hi, first * 10 - 1);
        if (a <= b) fixed_range(std::to_string(a), std::to_string(b), "", out);
    }
}

std::string join_alts(const std::vector<std::string>& alts) {
    std::string s;
    for (const auto& a : alts) s += (s.empty() ? "" : " | ") + std::string("(") + a + ")";
    return s;
}

// Integers in [lo, hi] (each within +-kMaxMagnitude).
std::string integer_range(int64_t lo, int64_t hi) {
    std::vector<std::string> alts;
    if (lo < 0) {
        std::vector<std::string> neg;
        const int64_t top = std::min<int64_t>(hi, -1);
        nonneg_range(static_cast<uint64_t>(-top), static_cast<uint64_t>(-lo), neg);
        alts.push_back("\"-\" (" + join_alts(neg) + ")");
    }
    if (hi >= 0) nonneg_range(static_cast<uint64_t>(std::max<int64_t>(lo, 0)), static_cast<uint64_t>(hi), alts);
    return join_alts(alts);
}

// Numbers in [lo, hi] (integer bounds): an integer part then an optional fraction, so that the
// value stays inside; the bound itself only with zeros after the point.
std::string number_range(int64_t lo, int64_t hi) {
    const std::string frac = "(\".\" [0-9]{1,15})?", zeros = "(\".\" \"0\"{1,15})?";
    std::vector<std::string> alts;
    // Magnitudes [a, b] (a <= b): I in [a, b - 1] with a fraction, or b with zeros.
    const auto magnitudes = [&](uint64_t a, uint64_t b, const std::string& sign) {
        std::vector<std::string> part;
        if (a < b) {
            std::vector<std::string> ints;
            nonneg_range(a, b - 1, ints);
            part.push_back("(" + join_alts(ints) + ") " + frac);
        }
        part.push_back("\"" + std::to_string(b) + "\" " + zeros);
        alts.push_back(sign + "(" + join_alts(part) + ")");
    };
    if (lo < 0) {
        const int64_t top = std::min<int64_t>(hi, -1);
        // -w with w in [-top, -lo]: w's fraction makes it more negative, so the magnitude bound is -lo.
        magnitudes(static_cast<uint64_t>(-top), static_cast<uint64_t>(-lo), "\"-\" ");
    }
    if (hi >= 0) magnitudes(static_cast<uint64_t>(std::max<int64_t>(lo, 0)), static_cast<uint64_t>(hi), "");
    return join_alts(alts);
}

class Converter {
public:
    explicit Converter(const json& root) : root_(root) {}

    std::string run() {
        const std::string root = visit(root_, "$", 0);
        std::string out = "root ::= " + root + "\n";
        for (const auto& r : rules_) out += r.first + " ::= " + r.second + "\n";
        out += kPrimitives;
        out += "date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1])\n";
        out +=
            "time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? (\"Z\" | [+-] "
            "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n";
        out += "date-time ::= date \"T\" time\n";
        out += "uuid ::= [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}\n";
        return out;
    }

private:
    std::string new_rule(const std::string& hint, const std::string& body) {
        std::string name = "s";
        for (const char c : hint) {
            if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
                name += c;
            else if (name.back() != '-')
                name += '-';
            if (name.size() > 40) break;
        }
        name += "-" + std::to_string(rules_.size());
        rules_.emplace_back(name, body);
        return name;
    }

    [[noreturn]] static void unsupported(const std::string& path, const std::string& why) {
        throw JsonSchemaError(path, why);
    }

    static std::optional<double> number_field(const json& s, const char* key, const std::string& path) {
        const auto it = s.find(key);
        if (it == s.end()) return std::nullopt;
        if (!it->is_number()) unsupported(path + "." + key, "expected a number");
        return it->get<double>();
    }

    const json& resolve(const std::string& ref, const std::string& path) {
        if (ref == "#") return root_;
        for (const char* base : {"#/$defs/", "#/definitions/"}) {
            const std::string b = base;
            if (ref.rfind(b, 0) == 0) {
                const std::string defs = b.substr(2, b.size() - 3);
                const std::string name = ref.substr(b.size());
                const auto d = root_.find(defs);
                if (d == root_.end() || !d->is_object() || !d->contains(name))
                    unsupported(path, "$ref \"" + ref + "\" names no definition");
                return (*d)[name];
            }
        }
        unsupported(path,
                    "$ref \"" + ref + "\": only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" are supported");
    }

    std::string visit(const json& s, const std::string& path, int depth) {
        if (depth > kMaxSchemaDepth) unsupported(path, "nested deeper than " + std::to_string(kMaxSchemaDepth));
        if (s.is_boolean()) {
            if (s.get<bool>()) return "value";
            unsupported(path, "the schema false accepts nothing");
        }
        if (!s.is_object()) unsupported(path, "a schema must be an object or a boolean");

        if (const auto it = s.find("$ref"); it != s.end()) {
            if (!it->is_string()) unsupported(path + ".$ref", "expected a string");
            for (const auto& [k, v] : s.items())
                if (k != "$ref" && !annotations().count(k))
                    unsupported(path + "." + k, "keywords beside $ref are not supported");
            const std::string ref = it->get<std::string>();
            if (const auto done = refs_.find(ref); done != refs_.end()) return done->second;
            const json& target = resolve(ref, path + ".$ref");
            // Named before it is visited, so that a recursive reference finds it.
            const std::string name = "ref" + std::to_string(refs_.size());
            refs_[ref] = name;
            const std::string body = visit(target, path + ".$ref(" + ref + ")", depth + 1);
            rules_.emplace_back(name, body);
            return name;
        }
        static const std::set<std::string> known = {"type",
                                                    "properties",
                                                    "required",
                                                    "additionalProperties",
                                                    "items",
                                                    "minItems",
                                                    "maxItems",
                                                    "enum",
                                                    "const",
                                                    "minLength",
                                                    "maxLength",
                                                    "format",
                                                    "minimum",
                                                    "maximum",
                                                    "exclusiveMinimum",
                                                    "exclusiveMaximum",
                                                    "anyOf",
                                                    "oneOf",
                                                    "allOf",
                                                    "uniqueItems",
                                                    "propertyNames",
                                                    "minProperties",
                                                    "maxProperties"};
        for (const auto& [k, v] : s.items()) {
            if (annotations().count(k)) continue;
            if (!known.count(k)) unsupported(path + "." + k, "the keyword \"" + k + "\" is not supported");
        }
        if (const auto it = s.find("uniqueItems"); it != s.end() && *it != false)
            unsupported(path + ".uniqueItems", "the keyword \"uniqueItems\" is not supported");

        if (const auto it = s.find("const"); it != s.end()) return gbnf_literal(it->dump());
        if (const auto it = s.find("enum"); it != s.end()) {
            if (!it->is_array() || it->empty()) unsupported(path + ".enum", "expected a non-empty array");
            std::string alts;
            for (const auto& v : *it) alts += (alts.empty() ? "" : " | ") + gbnf_literal(v.dump());
            return new_rule(path, alts);
        }
        for (const char* key : {"anyOf", "oneOf"}) {
            if (const auto it = s.find(key); it != s.end()) {
                if (!it->is_array() || it->empty()) unsupported(path + "." + key, "expected a non-empty array");
                if (s.contains("type") || s.contains("properties") || s.contains("items"))
                    unsupported(path + "." + key,
                                std::string(key) + " beside type, properties or items is not supported");
                std::string alts;
                for (size_t i = 0; i < it->size(); ++i)
                    alts += (alts.empty() ? "" : " | ") +
                            visit((*it)[i], path + "." + key + "[" + std::to_string(i) + "]", depth + 1);
                return new_rule(path, alts);
            }
        }
        if (const auto it = s.find("allOf"); it != s.end()) {
            if (!it->is_array() || it->size() != 1)
                unsupported(path + ".allOf", "only an allOf of one schema is supported");
            return visit((*it)[0], path + ".allOf[0]", depth + 1);
        }

        std::vector<std::string> types;
        if (const auto it = s.find("type"); it != s.end()) {
            if (it->is_string()) {
                types.push_back(it->get<std::string>());
            } else if (it->is_array() && !it->empty()) {
                for (const auto& t : *it) {
                    if (!t.is_string()) unsupported(path + ".type", "expected a string or an array of strings");
                    types.push_back(t.get<std::string>());
                }
            } else {
                unsupported(path + ".type", "expected a string or an array of strings");
            }
        } else if (s.contains("properties") || s.contains("additionalProperties")) {
            types.push_back("object");
        } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
            types.push_back("array");
        } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
            types.push_back("string");
        } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
                   s.contains("exclusiveMaximum")) {
            types.push_back("number");
        } else {
            return "value";
        }
        std::string alts;
        for (const std::string& t : types) alts += (alts.empty() ? "" : " | ") + typed(s, t, path, depth);
        return types.size() == 1 ? alts : new_rule(path, alts);
    }

    std::string typed(const json& s, const std::string& type, const std::string& path, int depth) {
        if (type == "null") return "null";
        if (type == "boolean") return "boolean";
        if (type == "string") return string_rule(s, path);
        if (type == "integer" || type == "number") return number_rule(s, type == "integer", path);
        if (type == "array") return array_rule(s, path, depth);
        if (type == "object") return object_rule(s, path, depth);
        unsupported(path + ".type", "unknown type \"" + type + "\"");
    }

    std::string string_rule(const json& s, const std::string& path) {
        if (const auto it = s.find("format"); it != s.end()) {
            if (!it->is_string()) unsupported(path + ".format", "expected a string");
            const std::string f = it->get<std::string>();
            if (s.contains("minLength") || s.contains("maxLength"))
                unsupported(path + ".format", "format beside minLength or maxLength is not supported");
            if (f == "date" || f == "time" || f == "date-time" || f == "uuid")
                return new_rule(path, "\"\\\"\" " + f + " \"\\\"\"");
            unsupported(path + ".format",
                        "the format \"" + f + "\" is not supported (date, time, date-time, uuid are)");
        }
        const auto count = [&](const char* key) -> std::optional<uint64_t> {
            const auto it = s.find(key);
            if (it == s.end()) return std::nullopt;
            if (!it->is_number_unsigned()) unsupported(path + "." + key, "expected a non-negative integer");
            const uint64_t v = it->get<uint64_t>();
            if (v > kMaxRepeat) unsupported(path + "." + key, "over the limit of " + std::to_string(kMaxRepeat));
            return v;
        };
        const auto lo = count("minLength"), hi = count("maxLength");
        if (!lo && !hi) return "string";
        if (lo && hi && *lo > *hi) unsupported(path + ".minLength", "minLength is over maxLength");
        const std::string rep =
            "{" + std::to_string(lo.value_or(0)) + "," + (hi ? std::to_string(*hi) : std::string()) + "}";
        return new_rule(path, "\"\\\"\" char" + rep + " \"\\\"\"");
    }

    std::string number_rule(const json& s, bool integer, const std::string& path) {
        const auto min = number_field(s, "minimum", path), max = number_field(s, "maximum", path);
        const auto xmin = number_field(s, "exclusiveMinimum", path), xmax = number_field(s, "exclusiveMaximum", path);
        if (!min && !max && !xmin && !xmax) return integer ? "integer" : "number";
        // The integer bounds inside: generating within them keeps every value valid.
        double lo = -double(kMaxMagnitude), hi = double(kMaxMagnitude);
        if (min) lo = std::max(lo, std::ceil(*min));
        if (xmin) lo = std::max(lo, std::floor(*xmin) + 1);
        if (max) hi = std::min(hi, std::floor(*max));
        if (xmax) hi = std::min(hi, std::ceil(*xmax) - 1);
        if (!(lo <= hi))
            unsupported(path + (min || xmin ? (min ? ".minimum" : ".exclusiveMinimum") : ".maximum"),
                        "no integer lies within the bounds (or they are beyond +-10^18)");
        const auto l = static_cast<int64_t>(lo), h = static_cast<int64_t>(hi);
        return new_rule(path, integer ? integer_range(l, h) : number_range(l, h));
    }

    std::string array_rule(const json& s, const std::string& path, int depth) {
        std::string item = "value";
        if (const auto it = s.find("items"); it != s.end()) {
            if (it->is_array()) unsupported(path + ".items", "items as an array (tuples) is not supported");
            item = visit(*it, path + ".items", depth + 1);
        }
        const auto count = [&](const char* key) -> std::optional<uint64_t> {
            const auto it = s.find(key);
            if (it == s.end()) return std::nullopt;
            if (!it->is_number_unsigned()) unsupported(path + "." + key, "expected a non-negative integer");
            const uint64_t v = it->get<uint64_t>();
            if (v > kMaxRepeat) unsupported(path + "." + key, "over the limit of " + std::to_string(kMaxRepeat));
            return v;
        };
        const uint64_t lo = count("minItems").value_or(0);
        const auto hi = count("maxItems");
        if (hi && lo > *hi) unsupported(path + ".minItems", "minItems is over maxItems");
        if (hi && *hi == 0) return new_rule(path, "\"[\" ws \"]\"");
        const std::string one = item + " ws";
        const uint64_t more_lo = lo > 0 ? lo - 1 : 0;
        const std::string more = "(\",\" ws " + one + "){" + std::to_string(more_lo) + "," +
                                 (hi ? std::to_string(*hi - 1) : std::string()) + "}";
        const std::string items = one + " " + more;
        return new_rule(path, "\"[\" ws " + (lo > 0 ? items : "(" + items + ")?") + " \"]\"");
    }

    std::string object_rule(const json& s, const std::string& path, int depth) {
        const json empty = json::object();
        const auto pit = s.find("properties");
        const json& props = pit == s.end() ? empty : *pit;
        if (!props.is_object()) unsupported(path + ".properties", "expected an object");
        std::set<std::string> required;
        if (const auto it = s.find("required"); it != s.end()) {
            if (!it->is_array()) unsupported(path + ".required", "expected an array of names");
            for (const auto& r : *it) {
                if (!r.is_string()) unsupported(path + ".required", "expected an array of names");
                if (!props.contains(r.get<std::string>()))
                    unsupported(path + ".required", "\"" + r.get<std::string>() + "\" is not among the properties");
                required.insert(r.get<std::string>());
            }
        }
        const bool map = s.contains("additionalProperties") && !s["additionalProperties"].is_boolean();
        for (const char* key : {"propertyNames", "minProperties", "maxProperties"})
            if (s.contains(key) && !map)
                unsupported(
                    path + "." + key,
                    std::string(key) + " is supported only for a map (additionalProperties a schema, no properties)");
        if (map) {
            if (!props.empty())
                unsupported(path + ".additionalProperties",
                            "a schema for additional properties beside properties is not supported");
            // A map: keys of propertyNames (a string schema) or any, values of the schema; as many
            // pairs as min/maxProperties say (keys are not checked for repeats).
            const std::string v = visit(s["additionalProperties"], path + ".additionalProperties", depth + 1);
            std::string key = "string";
            if (const auto it = s.find("propertyNames"); it != s.end()) {
                if (!it->is_object() || (it->contains("type") && (*it)["type"] != "string"))
                    unsupported(path + ".propertyNames", "expected a schema of strings");
                json names = *it;
                names["type"] = "string";
                key = visit(names, path + ".propertyNames", depth + 1);
            }
            const auto count = [&](const char* k) -> std::optional<uint64_t> {
                const auto it = s.find(k);
                if (it == s.end()) return std::nullopt;
                if (!it->is_number_unsigned() || it->get<uint64_t>() > kMaxRepeat)
                    unsupported(path + "." + k, "expected a non-negative integer up to " + std::to_string(kMaxRepeat));
                return it->get<uint64_t>();
            };
            const uint64_t lo = count("minProperties").value_or(0);
            const auto hi = count("maxProperties");
            if (hi && lo > *hi) unsupported(path + ".minProperties", "minProperties is over maxProperties");
            if (hi && *hi == 0) return new_rule(path, "\"{\" ws \"}\"");
            const std::string kv = key + " ws \":\" ws " + v + " ws";
            const std::string pairs = kv + " (\",\" ws " + kv + "){" + std::to_string(lo > 0 ? lo - 1 : 0) + "," +
                                      (hi ? std::to_string(*hi - 1) : std::string()) + "}";
            return new_rule(path, "\"{\" ws " + (lo > 0 ? pairs : "(" + pairs + ")?") + " \"}\"");
        }
        if (props.empty()) return new_rule(path, "\"{\" ws \"}\"");
        struct Prop {
            std::string kv;
            bool required;
        };
        std::vector<Prop> list;
        for (const auto& [name, sub] : props.items()) {
            const std::string v = visit(sub, path + ".properties." + name, depth + 1);
            list.push_back({gbnf_literal(json(name).dump()) + " ws \":\" ws " + v + " ws", required.count(name) > 0});
        }
        // tail(i, after): the properties from i on, after = some property came before (a comma).
        std::map<std::pair<size_t, bool>, std::string> memo;
        std::function<std::string(size_t, bool)> tail = [&](size_t i, bool after) -> std::string {
            if (i == list.size()) return "";
            if (const auto it = memo.find({i, after}); it != memo.end()) return it->second;
            const std::string with = (after ? "\",\" ws " : "") + list[i].kv + " " + tail(i + 1, true);
            std::string body;
            if (list[i].required) {
                body = with;
            } else {
                const std::string without = tail(i + 1, after);
                body = "(" + with + ")" + (without.empty() ? " | \"\"" : " | " + without);
            }
            const std::string name = new_rule(path + "-" + std::to_string(i), body);
            memo[{i, after}] = name;
            return name;
        };
        return new_rule(path, "\"{\" ws " + tail(0, false) + " \"}\"");
    }

    const json& root_;
    std::vector<std::pair<std::string, std::string>> rules_;
    std::map<std::string, std::string> refs_;
};

}  // namespace

std::string gbnf_literal(const std::string& text) {
    std::string out = "\"";
    for (const char c : text) {
        const auto b = static_cast<uint8_t>(c);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (b < 0x20) {
            static const char* hex = "0123456789abcdef";
            out += "\\x";
            out += hex[b >> 4];
            out += hex[b & 15];
        } else {
            out += c;
        }
    }
    return out + "\"";
}

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
    return Converter(schema).run();
}

std::string json_object_gbnf() {
    return std::string("root ::= object\n") + kPrimitives;
}

}  // namespace fitllm::sampling
