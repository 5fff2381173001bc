#pragma once
// Python's arithmetic, concatenation and membership on template values, with Python's
// results (1 / 2 is 0.5, -7 // 2 is -4, "ab" * 2 is "abab") and Python's TypeError messages.
#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace fitllm::chat::jinja {

Value binary_op(BinaryExpr::Op op, const Value& left, const Value& right);
Value unary_op(UnaryExpr::Op op, const Value& operand);  // negate and plus; logical_not is truthiness
// `item in container`.
bool contains(const Value& container, const Value& item);

}  // namespace fitllm::chat::jinja
