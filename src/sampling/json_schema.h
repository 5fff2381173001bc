#pragma once
// JSON Schema -> GBNF (sampling/grammar.h), so that constrained sampling gives text that parses as
// JSON and validates against the schema.
//
//   const std::string gbnf = json_schema_to_gbnf(nlohmann::json::parse(R"({"type": "object", ...})"));
//   auto grammar = Grammar::parse(gbnf);
//
// What is supported: type (one or a list), properties, required, additionalProperties (false,
// true, or a schema for an object without properties: a map, with propertyNames, minProperties
// and maxProperties), items, minItems, maxItems, enum,
// const, minLength, maxLength, format (date, time, date-time, uuid), minimum, maximum,
// exclusiveMinimum, exclusiveMaximum (integers exactly; numbers: generated within the integer
// bounds inside them, [ceil(minimum), floor(maximum)], as integers or with a fraction), anyOf,
// oneOf (as anyOf), allOf of one schema, $ref to #, #/$defs/... and #/definitions/..., and the
// annotations (title, description, default, examples, $schema, $id, $comment, ...).
// Properties are generated in their order, each required one always, each optional one or not;
// properties not listed are not generated (additionalProperties true or absent still validates).
// Anything else (pattern, multipleOf, uniqueItems, not, if/then/else, prefixItems, ...) is refused
// with a JsonSchemaError naming the keyword and where it is, never ignored: the output would not
// validate.
#include <nlohmann/json.hpp>
#include <string>

#include "fitllm/error.h"

namespace fitllm::sampling {

class JsonSchemaError : public Error {
public:
    JsonSchemaError(std::string path, const std::string& what)
        : Error("json_schema: " + path + ": " + what), path_(std::move(path)) {}
    // Where in the schema, as a JSON pointer-like path ("$.properties.age.pattern").
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

// The grammar of the JSON texts the schema accepts (see above). Throws JsonSchemaError.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

// The grammar of any JSON object (OpenAI's response_format json_object, Ollama's format "json").
std::string json_object_gbnf();

// GBNF literal for text: quoted, with \ " and control characters escaped.
std::string gbnf_literal(const std::string& text);

}  // namespace fitllm::sampling
