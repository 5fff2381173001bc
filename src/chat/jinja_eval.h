#pragma once
// Renders a parsed template. Scoping follows jinja2: a for loop's body and a macro's body
// get their own scope (a `set` inside a loop is forgotten when the iteration ends, which is
// why templates use namespace()), while if blocks share the enclosing one. Names resolve from
// the innermost scope outwards, then the render variables, then the globals HF provides
// (range, dict, namespace, raise_exception, strftime_now).
#include <ctime>
#include <optional>
#include <string>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace fitllm::chat::jinja {

struct RenderEnvironment {
    Dict variables;              // messages, add_generation_prompt, bos_token, ...
    std::optional<std::tm> now;  // what strftime_now reads; unset: the current local time
};

// Throws TemplateError with the position of the construct that failed.
std::string render(const Template& tmpl, const RenderEnvironment& environment);

// What jinja2's compiler computes ahead of rendering (Node.as_const): the value of an
// expression built only from literals, or nullopt when it needs names, calls, the render
// context, or fails (jinja2 then leaves it to run time). One difference from rendering: a
// slice that fails gives an undefined value here, as jinja2's getitem does.
// needs_context, when given, is set when the answer is nullopt because the expression needs
// the render (rather than because it fails).
std::optional<Value> evaluate_constant(const Expr& expr, bool* needs_context = nullptr);

}  // namespace fitllm::chat::jinja
