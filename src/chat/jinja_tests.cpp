// jinja2's built-in tests (`x is defined`, `n is divisibleby 3`, ...), with jinja2's semantics.
#include <cmath>
#include <map>

#include "chat/jinja_args.h"
#include "chat/jinja_filters.h"
#include "chat/jinja_operators.h"
#include "chat/py_text.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {
namespace {

using TestFn = bool (*)(const Value&, const CallArgs&);

// Tests without parameters still refuse arguments, as Python does (`x is none foo` passes foo).
void no_args(std::string_view test, const CallArgs& args) {
    BoundArgs a(test, args, {});
}

Value one_arg(std::string_view test, const CallArgs& args) {
    BoundArgs a(test, args, {{"other", std::nullopt}});
    return a[0];
}

const std::map<std::string_view, TestFn>& tests() {
    static const std::map<std::string_view, TestFn> table = {
        {"boolean",
         [](const Value& v, const CallArgs& args) {
             no_args("boolean", args);
             return v.is_bool();
         }},
        {"callable",
         [](const Value& v, const CallArgs& args) {
             no_args("callable", args);
             return v.is_callable() || v.is_undefined();  // Undefined defines __call__ (to raise)
         }},
        {"defined",
         [](const Value& v, const CallArgs& args) {
             no_args("defined", args);
             return !v.is_undefined();
         }},
        {"divisibleby",
         [](const Value& v, const CallArgs& args) {
             return equals(binary_op(BinaryExpr::Op::mod, v, one_arg("divisibleby", args)), Value::integer(0));
         }},
        {"eq", [](const Value& v, const CallArgs& args) { return equals(v, one_arg("eq", args)); }},
        {"escaped",
         [](const Value& v, const CallArgs& args) {
             no_args("escaped", args);
             return v.is_markup();
         }},
        {"even",
         [](const Value& v, const CallArgs& args) {
             no_args("even", args);
             // jinja2: value % 2 == 0, so a str formats ('%s' is even is False)
             return equals(binary_op(BinaryExpr::Op::mod, v, Value::integer(2)), Value::integer(0));
         }},
        {"false",
         [](const Value& v, const CallArgs& args) {
             no_args("false", args);
             return v.is_bool() && !v.as_bool();
         }},
        {"filter",
         [](const Value& v, const CallArgs& args) {
             no_args("filter", args);
             return v.is_string() && filter_support(v.as_string()) != Support::unknown;
         }},
        {"float",
         [](const Value& v, const CallArgs& args) {
             no_args("float", args);
             return v.is_float();
         }},
        {"ge", [](const Value& v, const CallArgs& args) { return compare(v, one_arg("ge", args), ">=") >= 0; }},
        {"gt", [](const Value& v, const CallArgs& args) { return compare(v, one_arg("gt", args), ">") > 0; }},
        {"in", [](const Value& v, const CallArgs& args) { return contains(one_arg("in", args), v); }},
        {"integer",
         [](const Value& v, const CallArgs& args) {
             no_args("integer", args);
             return v.is_int();
         }},
        {"iterable",
         [](const Value& v, const CallArgs& args) {
             no_args("iterable", args);
             return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict() || v.is_iterator();
         }},
        {"le", [](const Value& v, const CallArgs& args) { return compare(v, one_arg("le", args), "<=") <= 0; }},
        {"lower",
         [](const Value& v, const CallArgs& args) {
             no_args("lower", args);
             return py::is_lower(to_str(v));
         }},
        {"lt", [](const Value& v, const CallArgs& args) { return compare(v, one_arg("lt", args), "<") < 0; }},
        {"mapping",
         [](const Value& v, const CallArgs& args) {
             no_args("mapping", args);
             return v.is_dict();
         }},
        {"ne", [](const Value& v, const CallArgs& args) { return !equals(v, one_arg("ne", args)); }},
        {"none",
         [](const Value& v, const CallArgs& args) {
             no_args("none", args);
             return v.is_none();
         }},
        {"number",
         [](const Value& v, const CallArgs& args) {
             no_args("number", args);
             return v.is_number();
         }},
        {"odd",
         [](const Value& v, const CallArgs& args) {
             no_args("odd", args);
             return equals(binary_op(BinaryExpr::Op::mod, v, Value::integer(2)), Value::integer(1));
         }},
        {"sameas", [](const Value& v, const CallArgs& args) { return v.is_same(one_arg("sameas", args)); }},
        {"sequence",
         [](const Value& v, const CallArgs& args) {
             no_args("sequence", args);
             return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
         }},
        {"string",
         [](const Value& v, const CallArgs& args) {
             no_args("string", args);
             return v.is_string();
         }},
        {"test",
         [](const Value& v, const CallArgs& args) {
             no_args("test", args);
             return v.is_string() && test_support(v.as_string()) != Support::unknown;
         }},
        {"true",
         [](const Value& v, const CallArgs& args) {
             no_args("true", args);
             return v.is_bool() && v.as_bool();
         }},
        {"undefined",
         [](const Value& v, const CallArgs& args) {
             no_args("undefined", args);
             return v.is_undefined();
         }},
        {"upper",
         [](const Value& v, const CallArgs& args) {
             no_args("upper", args);
             return py::is_upper(to_str(v));
         }},
    };
    return table;
}

std::string_view test_alias(std::string_view name) {
    if (name == "==" || name == "equalto") return "eq";
    if (name == "!=") return "ne";
    if (name == ">" || name == "greaterthan") return "gt";
    if (name == ">=") return "ge";
    if (name == "<" || name == "lessthan") return "lt";
    if (name == "<=") return "le";
    return name;
}

}  // namespace

Support test_support(std::string_view name) {
    return tests().count(test_alias(name)) ? Support::supported : Support::unknown;
}

bool apply_test(std::string_view name, const Value& input, const CallArgs& args) {
    const auto it = tests().find(test_alias(name));
    if (it == tests().end()) throw EvalError("No test named '" + std::string(name) + "'.");
    return it->second(input, args);
}

}  // namespace fitllm::chat::jinja
