#pragma once
// Tokens to a Template, following jinja2's grammar (parser.py) for the statements and
// expressions chat templates use, then jinja2's compile-time checks (jinja_check.h). Anything
// jinja2 accepts that fitllm does not implement (template inheritance and includes, call
// blocks, recursive loops, *args in calls) fails here, before rendering, with a TemplateError
// of Kind::unsupported naming the construct and its line:column; anything jinja2 rejects
// fails with Kind::syntax and jinja2's message. Unknown or unimplemented filters and tests
// inside if blocks fail only when reached, as in jinja2.
#include <memory>
#include <string>
#include <string_view>

#include "chat/jinja_ast.h"

namespace fitllm::chat::jinja {

std::shared_ptr<const Template> parse_template(std::string_view source, std::string name);

}  // namespace fitllm::chat::jinja
