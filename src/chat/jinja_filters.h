#pragma once
// jinja2's built-in filters and tests, plus HF's tojson, with jinja2's semantics. Filters live
// in jinja_filters.cpp, tests in jinja_tests.cpp.
#include <string_view>

#include "chat/jinja_value.h"

namespace fitllm::chat::jinja {

// Whether a name is a filter (or test) fitllm implements, one jinja2 has but fitllm does not
// (e.g. urlize), or no filter at all (jinja2 rejects the template: "No filter named 'x'.").
enum class Support { supported, unsupported, unknown };
Support filter_support(std::string_view name);
Support test_support(std::string_view name);

// Both throw EvalError with jinja2's (Python's) message when the arguments do not fit.
Value apply_filter(std::string_view name, const Value& input, const CallArgs& args);
bool apply_test(std::string_view name, const Value& input, const CallArgs& args);

}  // namespace fitllm::chat::jinja
