#pragma once
// The checks jinja2's compiler makes after parsing: every filter and test must exist. Like
// jinja2 (3.0 and later), a name used inside an {% if %} block or an inline if is only
// checked when that code runs, so a template whose untaken branch uses something unknown
// still renders; anywhere else it is an error at parse time. Names jinja2 knows but fitllm
// does not implement follow the same rule, as Kind::unsupported.
#include "chat/jinja_ast.h"

namespace fitllm::chat::jinja {

// It also folds constants as jinja2's optimizer does (Node.as_const), which is visible in one
// place: a failing slice of a literal is undefined at compile time, an error at run time.
//
// Throws TemplateError; marks the deferred cases on their FilterExpr nodes.
void check_template(Template& tmpl);

}  // namespace fitllm::chat::jinja
