#include "chat/jinja_operators.h"

#include <cmath>
#include <limits>

#include "chat/jinja_access.h"
#include "chat/py_text.h"
#include "chat/render_budget.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {
namespace {

const char* symbol(BinaryExpr::Op op) {
    switch (op) {
        case BinaryExpr::Op::add:
            return "+";
        case BinaryExpr::Op::sub:
            return "-";
        case BinaryExpr::Op::mul:
            return "*";
        case BinaryExpr::Op::div:
            return "/";
        case BinaryExpr::Op::floordiv:
            return "//";
        case BinaryExpr::Op::mod:
            return "%";
        case BinaryExpr::Op::pow:
            return "**";
    }
    return "?";
}

[[noreturn]] void unsupported_operands(BinaryExpr::Op op, const Value& a, const Value& b) {
    if (op == BinaryExpr::Op::add && (a.is_string() || a.is_list() || a.is_tuple()))
        throw EvalError("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
    throw EvalError(std::string("unsupported operand type(s) for ") + symbol(op) + ": '" + type_name(a) + "' and '" +
                    type_name(b) + "'");
}

void check_overflow(bool overflowed) {
    if (overflowed) throw EvalError("integer overflow: fitllm's template integers are 64-bit");
}

Value repeat(const Value& seq, int64_t times) {
    // A template must not be able to exhaust memory with 'x' * 10**12: the size is checked first.
    const size_t unit = seq.is_string() ? seq.as_string().size() : seq.items().size() * sizeof(Value);
    check_value_size(times, unit, "repeat count");
    if (seq.is_string()) {
        std::string out;
        out.reserve(unit * static_cast<size_t>(std::max<int64_t>(0, times)));
        for (int64_t i = 0; i < times; ++i) out += seq.as_string();
        return Value::string(std::move(out), seq.is_markup());
    }
    ValueList out;
    out.reserve(seq.items().size() * static_cast<size_t>(std::max<int64_t>(0, times)));
    for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
    return seq.is_list() ? Value::list(std::move(out)) : Value::tuple(std::move(out));
}

Value numeric(BinaryExpr::Op op, const Value& a, const Value& b) {
    const bool floating = a.is_float() || b.is_float();
    if (floating) {
        const double x = a.as_double(), y = b.as_double();
        switch (op) {
            case BinaryExpr::Op::add:
                return Value::floating(x + y);
            case BinaryExpr::Op::sub:
                return Value::floating(x - y);
            case BinaryExpr::Op::mul:
                return Value::floating(x * y);
            case BinaryExpr::Op::div:
                if (y == 0) throw EvalError("float division by zero");
                return Value::floating(x / y);
            case BinaryExpr::Op::floordiv:
                if (y == 0) throw EvalError("float floor division by zero");
                return Value::floating(std::floor(x / y));
            case BinaryExpr::Op::mod: {
                if (y == 0) throw EvalError("float modulo");
                double r = std::fmod(x, y);
                if (r != 0 && ((r < 0) != (y < 0))) r += y;
                return Value::floating(r == 0 ? std::copysign(0.0, y) : r);
            }
            case BinaryExpr::Op::pow: {
                if (x == 0 && y < 0) throw EvalError("0.0 cannot be raised to a negative power");
                if (x < 0 && std::isfinite(y) && y != std::floor(y))  // Python gives a complex number
                    throw EvalError("a negative number to a fractional power is complex, which fitllm does not support",
                                    EvalError::Kind::unsupported);
                const double r = std::pow(x, y);
                // Python's float ** raises where + and * give inf.
                if (std::isinf(r) && std::isfinite(x) && std::isfinite(y))
                    throw EvalError("(34, 'Numerical result out of range')");
                return Value::floating(r);
            }
        }
    }
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    switch (op) {
        case BinaryExpr::Op::add:
            check_overflow(__builtin_add_overflow(x, y, &r));
            return Value::integer(r);
        case BinaryExpr::Op::sub:
            check_overflow(__builtin_sub_overflow(x, y, &r));
            return Value::integer(r);
        case BinaryExpr::Op::mul:
            check_overflow(__builtin_mul_overflow(x, y, &r));
            return Value::integer(r);
        case BinaryExpr::Op::div:
            if (y == 0) throw EvalError("division by zero");
            return Value::floating(static_cast<double>(x) / static_cast<double>(y));
        case BinaryExpr::Op::floordiv: {
            if (y == 0) throw EvalError("integer division or modulo by zero");
            check_overflow(x == std::numeric_limits<int64_t>::min() && y == -1);  // -2**63 // -1 traps
            int64_t q = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
            return Value::integer(q);
        }
        case BinaryExpr::Op::mod: {
            if (y == 0) throw EvalError("integer modulo by zero");
            if (y == -1) return Value::integer(0);  // and -2**63 % -1 would trap
            int64_t m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return Value::integer(m);
        }
        case BinaryExpr::Op::pow: {
            if (y < 0) {
                if (x == 0) throw EvalError("0.0 cannot be raised to a negative power");
                return Value::floating(std::pow(static_cast<double>(x), static_cast<double>(y)));
            }
            int64_t result = 1, base = x, e = y;
            while (e > 0) {
                if (e & 1) check_overflow(__builtin_mul_overflow(result, base, &result));
                e >>= 1;
                if (e) check_overflow(__builtin_mul_overflow(base, base, &base));
            }
            return Value::integer(result);
        }
    }
    return Value();
}

}  // namespace

Value binary_op(BinaryExpr::Op op, const Value& a, const Value& b) {
    if (a.is_undefined()) fail_undefined(a);
    if (a.is_number() && b.is_number()) return numeric(op, a, b);
    if (op == BinaryExpr::Op::mod && a.is_string()) {
        // An undefined right operand is fine until a conversion needs its value ("%s" prints "").
        return Value::string(percent_format(a.as_string(), b), a.is_markup());
    }
    if (b.is_undefined()) fail_undefined(b);
    switch (op) {
        case BinaryExpr::Op::add:
            if (a.is_string() && b.is_string()) {
                // Markup escapes the plain string it is added to (markupsafe.Markup.__add__/__radd__).
                check_value_size(a.as_string().size() + b.as_string().size(), "string");
                if (a.is_markup() || b.is_markup()) {
                    const std::string x = a.is_markup() ? a.as_string() : html_escape(a.as_string());
                    const std::string y = b.is_markup() ? b.as_string() : html_escape(b.as_string());
                    return Value::string(x + y, true);
                }
                return Value::string(a.as_string() + b.as_string());
            }
            if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
                check_value_size((a.items().size() + b.items().size()) * sizeof(Value), "list");
                ValueList out;
                out.reserve(a.items().size() + b.items().size());
                out.insert(out.end(), a.items().begin(), a.items().end());
                out.insert(out.end(), b.items().begin(), b.items().end());
                return a.is_list() ? Value::list(std::move(out)) : Value::tuple(std::move(out));
            }
            break;
        case BinaryExpr::Op::mul:
            if ((a.is_string() || a.is_sequence()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
            if ((b.is_string() || b.is_sequence()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
            break;
        default:
            break;
    }
    unsupported_operands(op, a, b);
}

Value unary_op(UnaryExpr::Op op, const Value& v) {
    if (op == UnaryExpr::Op::logical_not) return Value::boolean(!truthy(v));
    if (v.is_undefined()) fail_undefined(v);
    const bool negate = op == UnaryExpr::Op::negate;
    if (v.is_float()) return Value::floating(negate ? -v.as_double() : v.as_double());
    if (v.is_number()) {
        if (negate && v.as_int() == std::numeric_limits<int64_t>::min()) throw EvalError("integer overflow");
        return Value::integer(negate ? -v.as_int() : v.as_int());
    }
    throw EvalError(std::string("bad operand type for unary ") + (negate ? "-" : "+") + ": '" + type_name(v) + "'");
}

bool contains(const Value& container, const Value& item) {
    if (container.is_string()) {
        if (item.is_undefined()) fail_undefined(item);
        if (!item.is_string()) throw EvalError("'in <string>' requires string as left operand, not " + type_name(item));
        return py::find_bytes(container.as_string(), item.as_string()) != std::string::npos;
    }
    if (container.is_dict()) {
        if (item.is_list() || item.is_dict()) throw EvalError("unhashable type: '" + type_name(item) + "'");
        return container.as_dict().find(item) != nullptr;
    }
    if (container.is_undefined()) return false;
    if (container.is_iterator() && container.iterator_kind() == Value::IteratorKind::dict_keys &&
        (item.is_list() || item.is_dict()))
        throw EvalError("unhashable type: '" + type_name(item) + "'");
    if (container.is_sequence() || container.is_iterator()) {
        for (const Value& v : iterate(container))
            if (equals(v, item)) return true;
        return false;
    }
    throw EvalError("argument of type '" + type_name(container) + "' is not iterable");
}

}  // namespace fitllm::chat::jinja
