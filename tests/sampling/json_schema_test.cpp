// JSON Schema -> GBNF: the grammar takes the JSON a schema accepts and refuses what it does not;
// unsupported keywords are refused by name and path.
#include "sampling/json_schema.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "sampling/grammar.h"

namespace fitllm::sampling {
namespace {

using json = nlohmann::ordered_json;

// A vocabulary of single bytes and a generator that walks the grammar: picks random allowed
// bytes (ending when it may, with growing odds), so that many texts of the grammar are tried.
std::shared_ptr<const GrammarVocab> byte_vocab() {
    static const auto vocab = [] {
        std::vector<std::string> texts;
        for (int b = 0; b < 256; ++b) texts.emplace_back(1, static_cast<char>(b));
        texts.emplace_back();  // 256: end of generation
        return std::make_shared<GrammarVocab>(texts, std::vector<int32_t>{256});
    }();
    return vocab;
}

bool accepts(const std::string& gbnf, const std::string& text) {
    GrammarMatcher m(Grammar::parse(gbnf), byte_vocab());
    if (!m.allows_text(text)) return false;
    m.accept_text(text);
    return m.can_end();
}

std::string random_sentence(const std::string& gbnf, std::mt19937& rng) {
    GrammarMatcher m(Grammar::parse(gbnf), byte_vocab());
    std::string out;
    for (int i = 0; i < 4000; ++i) {
        const auto& mask = m.allowed_tokens();
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id <= 256; ++id)
            if ((mask[size_t(id) >> 6] >> (id & 63)) & 1) allowed.push_back(id);
        // Prefer ending, closing and short texts: JSON's structure bytes first.
        if (m.can_end() && (rng() % 4 != 0 || i > 300)) return out;
        std::vector<int32_t> preferred;
        for (const int32_t id : allowed)
            if (id < 256 && std::string("\"}],:0123456789tfn").find(char(id)) != std::string::npos)
                preferred.push_back(id);
        const auto& pool = (!preferred.empty() && (rng() % 3 != 0 || i > 200)) ? preferred : allowed;
        const int32_t pick = pool[rng() % pool.size()];
        if (pick == 256) return out;
        m.accept_token(pick);
        out += char(pick);
    }
    ADD_FAILURE() << "no end in 4000 bytes: " << out;
    return out;
}

std::string refusal(const json& schema) {
    try {
        (void)json_schema_to_gbnf(schema);
    } catch (const JsonSchemaError& e) {
        return e.what();
    }
    return "";
}

TEST(JsonSchema, ObjectWithRequiredAndOptionalProperties) {
    const std::string g = json_schema_to_gbnf(json::parse(R"({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name"], "additionalProperties": false})"));
    EXPECT_TRUE(accepts(g, R"({"name": "Ann", "age": 3, "tags": ["a", "b"]})"));
    EXPECT_TRUE(accepts(g, R"({"name":"Ann"})"));
    EXPECT_TRUE(accepts(g, R"({"name": "A\"nn\u00e9", "tags": []})"));
    EXPECT_FALSE(accepts(g, R"({"age": 3})"));                   // name is required
    EXPECT_FALSE(accepts(g, R"({"name": "Ann", "age": 3.5})"));  // integer
    EXPECT_FALSE(accepts(g, R"({"name": "Ann", "other": 1})"));  // no other keys
    EXPECT_FALSE(accepts(g, R"({"name": "Ann",})"));
}

TEST(JsonSchema, EnumsConstAnyOfRefs) {
    const std::string g = json_schema_to_gbnf(json::parse(R"({
        "$defs": {"color": {"enum": ["red", "green", 3, null]}, "node": {"type": "object", "properties": {
            "v": {"const": "x"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
        "type": "object", "properties": {"c": {"$ref": "#/$defs/color"}, "n": {"$ref": "#/$defs/node"}},
        "required": ["c", "n"]})"));
    EXPECT_TRUE(accepts(g, R"({"c": "red", "n": {"v": "x", "next": {"v": "x", "next": null}}})"));
    EXPECT_TRUE(accepts(g, R"({"c": 3, "n": {"v": "x", "next": null}})"));
    EXPECT_FALSE(accepts(g, R"({"c": "blue", "n": {"v": "x", "next": null}})"));
    EXPECT_FALSE(accepts(g, R"({"c": "red", "n": {"v": "y", "next": null}})"));
}

TEST(JsonSchema, IntegerRangesAreExact) {
    for (const auto& [lo, hi] :
         std::vector<std::pair<int, int>>{{0, 0}, {-5, 17}, {3, 250}, {-1234, -17}, {99, 1001}, {-1, 1}}) {
        const std::string g = json_schema_to_gbnf(json{{"type", "integer"}, {"minimum", lo}, {"maximum", hi}});
        for (int v = lo - 30; v <= hi + 30; ++v)
            EXPECT_EQ(accepts(g, std::to_string(v)), v >= lo && v <= hi) << lo << ".." << hi << ": " << v;
        EXPECT_FALSE(accepts(g, "01"));
        EXPECT_FALSE(accepts(g, "-0" + std::to_string(std::abs(lo) + 1)));
    }
    const std::string ex =
        json_schema_to_gbnf(json{{"type", "integer"}, {"exclusiveMinimum", 10}, {"exclusiveMaximum", 20}});
    EXPECT_FALSE(accepts(ex, "10"));
    EXPECT_TRUE(accepts(ex, "11"));
    EXPECT_TRUE(accepts(ex, "19"));
    EXPECT_FALSE(accepts(ex, "20"));
    const std::string open = json_schema_to_gbnf(json{{"type", "integer"}, {"minimum", 42}});
    EXPECT_TRUE(accepts(open, "42"));
    EXPECT_TRUE(accepts(open, "123456789012"));
    EXPECT_FALSE(accepts(open, "41"));
    EXPECT_FALSE(accepts(open, "-50"));
}

TEST(JsonSchema, NumberBoundsHold) {
    const std::string g = json_schema_to_gbnf(json{{"type", "number"}, {"minimum", -2.5}, {"maximum", 10}});
    EXPECT_TRUE(accepts(g, "9.999"));
    EXPECT_TRUE(accepts(g, "10"));
    EXPECT_TRUE(accepts(g, "10.000"));
    EXPECT_FALSE(accepts(g, "10.001"));
    EXPECT_TRUE(accepts(g, "-2"));
    EXPECT_FALSE(accepts(g, "-2.01"));  // within [-2.5, 10] but outside the integer bounds [-2, 10]
    EXPECT_FALSE(accepts(g, "11"));
    std::mt19937 rng(5);
    for (int i = 0; i < 300; ++i) {
        const std::string s = random_sentence(g, rng);
        const double v = std::stod(s);
        EXPECT_TRUE(v >= -2.5 && v <= 10) << s;
    }
}

TEST(JsonSchema, RandomSentencesParseAndKeepTheirShape) {
    const json schema = json::parse(R"({
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999},
            "kind": {"enum": ["a", "b"]},
            "score": {"type": "number"},
            "ok": {"type": "boolean"},
            "when": {"type": "string", "format": "date"},
            "name": {"type": "string", "minLength": 2, "maxLength": 5},
            "items": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
            "meta": {"type": "object", "additionalProperties": {"type": "boolean"}},
            "any": {}
        },
        "required": ["id", "kind", "items"]})");
    const std::string g = json_schema_to_gbnf(schema);
    std::mt19937 rng(11);
    for (int i = 0; i < 200; ++i) {
        const std::string s = random_sentence(g, rng);
        json v;
        ASSERT_NO_THROW(v = json::parse(s)) << s;
        ASSERT_TRUE(v.is_object()) << s;
        EXPECT_TRUE(v["id"].is_number_integer() && v["id"] >= 1 && v["id"] <= 999) << s;
        EXPECT_TRUE(v["kind"] == "a" || v["kind"] == "b") << s;
        EXPECT_TRUE(v["items"].is_array() && !v["items"].empty() && v["items"].size() <= 3) << s;
        if (v.contains("name")) {
            EXPECT_GE(v["name"].get<std::string>().size(), 2u) << s;
        }
        for (const auto& [k, x] : v.items()) EXPECT_TRUE(schema["properties"].contains(k)) << s;
    }
}

TEST(JsonSchema, MapsWithKeyAndCountBounds) {
    const std::string g =
        json_schema_to_gbnf(json::parse(R"({"type": "object", "additionalProperties": {"type": "integer"},
        "propertyNames": {"maxLength": 3}, "minProperties": 1, "maxProperties": 2})"));
    EXPECT_TRUE(accepts(g, R"({"a": 1})"));
    EXPECT_TRUE(accepts(g, R"({"abc": 1, "b": -2})"));
    EXPECT_FALSE(accepts(g, "{}"));
    EXPECT_FALSE(accepts(g, R"({"a": 1, "b": 2, "c": 3})"));
    EXPECT_FALSE(accepts(g, R"({"abcd": 1})"));
    EXPECT_EQ(refusal(json::parse(R"({"type": "object", "properties": {"a": {}}, "maxProperties": 1})")),
              "json_schema: $.maxProperties: maxProperties is supported only for a map (additionalProperties a schema, "
              "no properties)");
}

TEST(JsonSchema, JsonObjectGrammar) {
    const std::string g = json_object_gbnf();
    EXPECT_TRUE(accepts(g, R"({"a": [1, 2.5e3, true, null, {"b": "c"}], "d": {}})"));
    EXPECT_FALSE(accepts(g, "[1]"));
    EXPECT_FALSE(accepts(g, R"({"a": 01})"));
    EXPECT_FALSE(accepts(g, R"({"a": "x
"})"));  // a raw newline in a string
}

TEST(JsonSchema, UnsupportedKeywordsAreRefusedByPath) {
    EXPECT_EQ(refusal(json::parse(R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}})")),
              "json_schema: $.properties.a.pattern: the keyword \"pattern\" is not supported");
    EXPECT_EQ(refusal(json::parse(R"({"type": "array", "uniqueItems": true})")),
              "json_schema: $.uniqueItems: the keyword \"uniqueItems\" is not supported");
    EXPECT_EQ(refusal(json::parse(R"({"type": "number", "multipleOf": 3})")),
              "json_schema: $.multipleOf: the keyword \"multipleOf\" is not supported");
    EXPECT_EQ(refusal(json::parse(R"({"$ref": "#/$defs/x"})")),
              "json_schema: $.$ref: $ref \"#/$defs/x\" names no definition");
    EXPECT_EQ(refusal(json::parse(R"({"$ref": "http://x/y"})")),
              "json_schema: $.$ref: $ref \"http://x/y\": only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" are "
              "supported");
    EXPECT_EQ(refusal(json::parse(R"({"type": "string", "format": "email"})")),
              "json_schema: $.format: the format \"email\" is not supported (date, time, date-time, uuid are)");
    EXPECT_EQ(refusal(json::parse(R"({"type": "integer", "minimum": 5, "maximum": 4})")),
              "json_schema: $.minimum: no integer lies within the bounds (or they are beyond +-10^18)");
    EXPECT_EQ(refusal(json::parse(R"({"type": "objekt"})")), "json_schema: $.type: unknown type \"objekt\"");
    EXPECT_EQ(refusal(json::parse(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})")),
              "json_schema: $.required: \"b\" is not among the properties");
    EXPECT_EQ(refusal(json::parse(R"({"not": {}})")), "json_schema: $.not: the keyword \"not\" is not supported");
    EXPECT_EQ(refusal(json(false)), "json_schema: $: the schema false accepts nothing");
    // Deep nesting is refused, not a stack overflow.
    json deep = json::object();
    for (int i = 0; i < 200; ++i) deep = json{{"type", "array"}, {"items", deep}};
    EXPECT_NE(refusal(deep).find("nested deeper than 64"), std::string::npos);
    // A self-reference that never consumes text is left recursion: the grammar refuses it.
    EXPECT_THROW(Grammar::parse(json_schema_to_gbnf(json::parse(R"({"$ref": "#"})"))), GrammarError);
}

}  // namespace
}  // namespace fitllm::sampling
