#pragma once
// Attribute and item lookup as jinja2's ImmutableSandboxedEnvironment does it (obj.name tries
// the Python attribute, then obj["name"]; obj[key] the other way round), slicing, and the
// methods of str, dict and list that templates call. Methods that would change a dict or a
// list in place are "unsafe" in HF's sandbox: looking them up yields an undefined value that
// fails with jinja2's SecurityError message when called.
#include <string>
#include <string_view>

#include "chat/jinja_value.h"

namespace fitllm::chat::jinja {

Value get_attribute(const Value& object, std::string_view name);
Value get_item(const Value& object, const Value& key);
// Only the Python attribute (a method, an object's attribute), as the |attr filter looks.
Value get_python_attribute(const Value& object, std::string_view name);
// object[start:stop:step]; each bound may be none (absent).
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// Python's str % args (printf-style) and str.format(*args, **kwargs).
std::string percent_format(const std::string& format, const Value& args);
std::string brace_format(const std::string& format, const CallArgs& args);

}  // namespace fitllm::chat::jinja
