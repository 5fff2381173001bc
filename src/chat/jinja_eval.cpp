#include "chat/jinja_eval.h"

#include <memory>
#include <optional>
#include <set>

#include "chat/jinja_access.h"
#include "chat/jinja_filters.h"
#include "chat/jinja_objects.h"
#include "chat/jinja_operators.h"
#include "chat/jinja_scope.h"
#include "chat/py_text.h"
#include "chat/render_budget.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {
namespace {

TemplateError::Kind error_kind(const EvalError& e) {
    switch (e.kind()) {
        case EvalError::Kind::raised:
            return TemplateError::Kind::raised;
        case EvalError::Kind::unsupported:
            return TemplateError::Kind::unsupported;
        case EvalError::Kind::limit:
        case EvalError::Kind::budget:
            return TemplateError::Kind::limit;
        default:
            return TemplateError::Kind::runtime;
    }
}

// Thrown in constant mode when an expression needs the render context (a name, a call).
struct NotConstant {};

// How a limit error names the construct it stopped: "{% for %}", "|center(10000000000)",
// ".ljust(...)", "operator *". Arguments are shown when they are known, each cut short.
std::string statement_name(const Stmt& stmt) {
    switch (stmt.kind) {
        case Stmt::Kind::text:
            return "template text";
        case Stmt::Kind::output:
            return "{{ ... }}";
        case Stmt::Kind::if_:
            return "{% if %}";
        case Stmt::Kind::for_:
            return "{% for %}";
        case Stmt::Kind::set:
        case Stmt::Kind::set_block:
            return "{% set %}";
        case Stmt::Kind::macro:
            return "{% macro %}";
        case Stmt::Kind::filter_block:
            return "{% filter %}";
        case Stmt::Kind::with:
            return "{% with %}";
        case Stmt::Kind::loop_control:
            return "{% break %}";
        case Stmt::Kind::generation:
            return "{% generation %}";
    }
    return "statement";
}

// An argument as an error message shows it: its repr, cut after about 24 characters.
std::string short_repr(const Value& v) {
    constexpr size_t kMax = 24;
    std::string text;
    if (v.is_string()) {  // the repr of its start, not of all of a string that may be 16 MiB long
        const std::u32string start = py::decode(std::string_view(v.as_string()).substr(0, 4 * kMax));
        text = py::repr(py::encode(start.substr(0, kMax)));
        if (start.size() > kMax) text += "...";
    } else {
        try {
            const RenderBudget scratch(RenderLimits{.max_value_bytes = 4096});  // no huge repr for a message
            text = to_repr(v);
        } catch (const EvalError&) {
            return "...";
        }
    }
    return text.size() <= kMax + 3 ? text : text.substr(0, kMax) + "...";
}

std::string call_text(const CallArgs* args) {
    if (!args) return "(...)";
    std::string text = "(";
    for (const Value& a : args->positional) text += (text.size() > 1 ? ", " : "") + short_repr(a);
    for (const auto& [name, value] : args->keyword)
        text += (text.size() > 1 ? ", " : "") + name + "=" + short_repr(value);
    return text + ")";
}

std::string expression_name(const Expr& expr, const CallArgs* args) {
    switch (expr.kind) {
        case Expr::Kind::filter: {
            const bool shown = args && (!args->positional.empty() || !args->keyword.empty());
            return "|" + static_cast<const FilterExpr&>(expr).name + (shown ? call_text(args) : "");
        }
        case Expr::Kind::test:
            return "is " + static_cast<const FilterExpr&>(expr).name;
        case Expr::Kind::call: {
            const Expr& callee = *static_cast<const CallExpr&>(expr).callee;
            if (callee.kind == Expr::Kind::attribute)
                return "." + static_cast<const AttributeExpr&>(callee).attribute + call_text(args);
            if (callee.kind == Expr::Kind::name) return static_cast<const NameExpr&>(callee).name + call_text(args);
            return "a call";
        }
        case Expr::Kind::binary: {
            static const char* kSymbols[] = {"+", "-", "*", "/", "//", "%", "**"};
            return std::string("operator ") + kSymbols[static_cast<int>(static_cast<const BinaryExpr&>(expr).op)];
        }
        case Expr::Kind::concat:
            return "operator ~";
        case Expr::Kind::compare:
            return "a comparison";
        case Expr::Kind::attribute:
            return "." + static_cast<const AttributeExpr&>(expr).attribute;
        case Expr::Kind::subscript:
            return "[...]";
        case Expr::Kind::list:
            return "a list literal";
        case Expr::Kind::tuple:
            return "a tuple";
        case Expr::Kind::dict:
            return "a dict literal";
        default:
            return "an expression";
    }
}

class Evaluator;

// A {% macro %}: calling it renders its body with the arguments bound, in a scope whose
// parent is the scope the macro was defined in. The renderer keeps that scope alive until the
// render ends (Evaluator::macro_scopes_), so the macro needs no owning reference to it, and a
// scope holding its own macro is no reference cycle.
class Macro : public Callable {
public:
    Macro(Evaluator& evaluator, const MacroStmt& node, const ScopePtr& closure)
        : evaluator_(evaluator), node_(node), closure_(closure) {}
    std::string describe() const override { return "Macro '" + node_.name + "'"; }
    Value call(CallArgs args, CallContext& context) const override;

private:
    Evaluator& evaluator_;
    const MacroStmt& node_;
    std::weak_ptr<Scope> closure_;
};

class Evaluator : public CallContext {
public:
    Evaluator(const Template& tmpl, const RenderEnvironment& env, RenderBudget& budget)
        : tmpl_(tmpl), env_(env), budget_(budget), nesting_(budget.limits().max_depth) {}
    Evaluator(const Evaluator&) = delete;
    Evaluator& operator=(const Evaluator&) = delete;
    // Namespaces may hold themselves, directly or not; clearing them breaks such cycles. Then
    // the scopes kept for macros go, and the macros with them.
    ~Evaluator() override {
        for (const auto& weak : objects_)
            if (const std::shared_ptr<Object> object = weak.lock()) object->clear();
        macro_scopes_.clear();
    }

    // jinja2's Node.as_const: the value if the expression needs nothing from the render.
    std::optional<Value> constant(const Expr& expr, bool* needs_context) {
        constant_mode_ = true;
        try {
            return eval(expr, std::make_shared<Scope>(nullptr));
        } catch (const NotConstant&) {
            if (needs_context) *needs_context = true;
        } catch (const TemplateError&) {  // jinja2 leaves failing expressions to run time
        } catch (const EvalError&) {      // the folding budget is spent: leave the rest to run time too
        }
        return std::nullopt;
    }

    std::string run() {
        Output out;
        ScopePtr top;
        try {
            top = std::make_shared<Scope>(nullptr);
        } catch (const EvalError& e) {  // not even a scope fits the budget
            rethrow_at(e, SourcePos{}, "the template");
        }
        exec_body(tmpl_.body, top, out);
        return out.take();
    }

    std::tm now() const override {
        if (env_.now) return *env_.now;
        const std::time_t t = std::time(nullptr);
        std::tm local{};
        localtime_r(&t, &local);
        return local;
    }

    void adopt(const std::shared_ptr<Object>& object) override {
        // Forget the objects that are gone whenever the list has doubled since it was last pruned.
        if (objects_.size() >= 2 * objects_kept_ + 16) {
            std::erase_if(objects_, [](const std::weak_ptr<Object>& o) { return o.expired(); });
            objects_kept_ = objects_.size();
        }
        objects_.push_back(object);
    }

    Value call_macro(const MacroStmt& node, const std::weak_ptr<Scope>& closure, CallArgs args) {
        const ScopePtr scope = std::make_shared<Scope>(closure.lock());
        const size_t n_params = node.params.size();
        size_t given = std::min(args.positional.size(), n_params);
        for (size_t i = 0; i < given; ++i) scope->set(node.params[i].name, args.positional[i]);
        for (size_t i = given; i < n_params; ++i) {
            const MacroParam& p = node.params[i];
            bool found = false;
            for (auto it = args.keyword.begin(); it != args.keyword.end(); ++it) {
                if (it->first == p.name) {
                    scope->set(p.name, it->second);
                    args.keyword.erase(it);
                    found = true;
                    break;
                }
            }
            if (!found)
                scope->set(p.name, p.default_value ? eval(*p.default_value, scope)
                                                   : Value::undefined("parameter '" + p.name + "' was not provided"));
        }
        if (node.catches_kwargs) {
            Dict kwargs;
            for (auto& [k, v] : args.keyword) kwargs.set(Value::string(k), v);
            scope->set("kwargs", Value::dict(std::move(kwargs)));
        } else if (!args.keyword.empty()) {
            throw EvalError("macro '" + node.name + "' takes no keyword argument '" + args.keyword.front().first + "'");
        }
        if (node.catches_varargs) {
            scope->set("varargs", Value::tuple(ValueList(args.positional.begin() + static_cast<std::ptrdiff_t>(given),
                                                         args.positional.end())));
        } else if (args.positional.size() > n_params) {
            throw EvalError("macro '" + node.name + "' takes not more than " + std::to_string(n_params) +
                            " argument(s)");
        }
        Output out;
        exec_body(node.body, scope, out);
        return Value::string(out.take());
    }

private:
    enum class Flow { normal, break_loop, continue_loop };

    // An error that escaped a statement or an expression, as the TemplateError (or, for a pool
    // that refused, the memory::BudgetError) the caller sees: at the node's position, and for
    // limits naming the construct.
    [[noreturn]] void rethrow_at(const EvalError& e, SourcePos pos, const std::string& construct) const {
        if (!e.is_fatal()) throw TemplateError(error_kind(e), tmpl_.name, pos, e.what());
        const std::string detail = construct + ": " + e.what();
        if (const memory::BudgetError* refused = e.budget_error())
            throw memory::BudgetError(
                tmpl_.name + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column) + ": " + detail,
                refused->pool(), refused->requested(), refused->capacity(), refused->in_use());
        throw TemplateError(TemplateError::Kind::limit, tmpl_.name, pos, detail);
    }

    Flow exec_body(const Body& body, const ScopePtr& scope, Output& out) {
        for (const StmtPtr& stmt : body) {
            const Flow flow = exec(*stmt, scope, out);
            if (flow != Flow::normal) return flow;
        }
        return Flow::normal;
    }

    Flow exec(const Stmt& stmt, const ScopePtr& scope, Output& out) {
        try {
            const Nesting::Level level = nesting_.enter();
            budget_.step();
            return exec_node(stmt, scope, out);
        } catch (const EvalError& e) {
            rethrow_at(e, stmt.pos, statement_name(stmt));
        }
    }

    // A block's own scope: a child of the enclosing one, gone when the block ends.
    static ScopePtr child_of(const ScopePtr& parent) { return std::make_shared<Scope>(parent); }

    Flow exec_node(const Stmt& stmt, const ScopePtr& scope, Output& out) {
        switch (stmt.kind) {
            case Stmt::Kind::text:
                out.append(static_cast<const TextStmt&>(stmt).text);
                return Flow::normal;
            case Stmt::Kind::output: {
                const Value value = eval(*static_cast<const OutputStmt&>(stmt).expr, scope);
                budget_.step(read_cost(value));
                out.append(value.is_string() ? value.as_string() : to_str(value));
                return Flow::normal;
            }
            case Stmt::Kind::if_: {
                const auto& node = static_cast<const IfStmt&>(stmt);
                for (const auto& [test, body] : node.branches)
                    if (truthy(eval(*test, scope))) return exec_body(body, scope, out);
                return exec_body(node.else_body, scope, out);
            }
            case Stmt::Kind::for_:
                return exec_for(static_cast<const ForStmt&>(stmt), scope, out);
            case Stmt::Kind::set: {
                const auto& node = static_cast<const SetStmt&>(stmt);
                assign(node.target, eval(*node.value, scope), scope);
                return Flow::normal;
            }
            case Stmt::Kind::set_block: {
                const auto& node = static_cast<const SetBlockStmt&>(stmt);
                Output body;
                exec_body(node.body, child_of(scope), body);
                Value value = Value::string(body.take());
                if (node.filter) value = eval_filter(*node.filter, &value, scope);
                assign(node.target, std::move(value), scope);
                return Flow::normal;
            }
            case Stmt::Kind::macro: {
                const auto& node = static_cast<const MacroStmt&>(stmt);
                if (!scope->holds_macros) {
                    scope->holds_macros = true;
                    macro_scopes_.push_back(scope);
                }
                scope->set(node.name, Value::callable(std::make_shared<Macro>(*this, node, scope)));
                return Flow::normal;
            }
            case Stmt::Kind::filter_block: {
                const auto& node = static_cast<const FilterBlockStmt&>(stmt);
                Output body;
                exec_body(node.body, child_of(scope), body);
                const Value input = Value::string(body.take());
                const Value result = eval_filter(*node.filter, &input, scope);
                out.append(result.is_string() ? result.as_string() : to_str(result));
                return Flow::normal;
            }
            case Stmt::Kind::with: {
                const auto& node = static_cast<const WithStmt&>(stmt);
                const ScopePtr inner = child_of(scope);
                for (const auto& [target, value] : node.assignments) assign(target, eval(*value, scope), inner);
                return exec_body(node.body, inner, out);
            }
            case Stmt::Kind::loop_control:
                return static_cast<const LoopControlStmt&>(stmt).is_break ? Flow::break_loop : Flow::continue_loop;
            case Stmt::Kind::generation:
                exec_body(static_cast<const GenerationStmt&>(stmt).body, child_of(scope), out);
                return Flow::normal;
        }
        return Flow::normal;
    }

    Flow exec_for(const ForStmt& node, const ScopePtr& scope, Output& out) {
        const Value iterable = eval(*node.iterable, scope);
        Items items = iterate(iterable);
        if (node.filter) {
            ValueList kept;
            for (const Value& item : items) {
                budget_.step();
                const ScopePtr probe = child_of(scope);
                assign(node.target, item, probe);
                if (truthy(eval(*node.filter, probe))) kept.push_back(item);
            }
            items = Items(Value::list(std::move(kept)));
        }
        if (items.empty()) {
            exec_body(node.else_body, child_of(scope), out);
            return Flow::normal;
        }
        const auto loop = std::make_shared<LoopObject>(items);
        const Value loop_value = Value::object(loop);
        for (size_t i = 0; i < items.size(); ++i, loop->advance()) {
            budget_.step();
            const ScopePtr iteration = child_of(scope);  // fresh per iteration, as in jinja2
            iteration->set("loop", loop_value);
            assign(node.target, items[i], iteration);
            if (exec_body(node.body, iteration, out) == Flow::break_loop) break;
        }
        return Flow::normal;
    }

    void assign(const AssignTarget& target, Value value, const ScopePtr& scope) {
        switch (target.kind) {
            case AssignTarget::Kind::name:
                scope->set(target.name, std::move(value));
                return;
            case AssignTarget::Kind::tuple: {
                const Items items = iterate(value);
                if (items.size() > target.items.size())
                    throw EvalError("too many values to unpack (expected " + std::to_string(target.items.size()) + ")");
                if (items.size() < target.items.size())
                    throw EvalError("not enough values to unpack (expected " + std::to_string(target.items.size()) +
                                    ", got " + std::to_string(items.size()) + ")");
                for (size_t i = 0; i < items.size(); ++i) assign(target.items[i], items[i], scope);
                return;
            }
            case AssignTarget::Kind::namespace_attribute: {
                const Value* ns = scope->find(target.name);
                if (!ns || !ns->is_object() || !ns->as_object().set_attribute(target.attribute, std::move(value)))
                    throw EvalError("cannot assign attribute on non-namespace object");
                return;
            }
        }
    }

    const Dict& globals() {
        if (!globals_) globals_ = builtin_globals();
        return *globals_;
    }

    Value lookup(const std::string& name, const ScopePtr& scope) {
        if (constant_mode_) throw NotConstant();
        if (const Value* v = scope->find(name)) return *v;
        if (const Value* v = env_.variables.find(name)) return *v;
        if (const Value* v = globals().find(name)) return *v;
        return Value::undefined("'" + name + "' is undefined");
    }

public:
    Value eval(const Expr& expr, const ScopePtr& scope) {
        try {
            const Nesting::Level level = nesting_.enter();
            budget_.step();
            return eval_node(expr, scope);
        } catch (const EvalError& e) {
            rethrow_at(e, expr.pos, expression_name(expr, nullptr));
        }
    }

private:
    CallArgs eval_args(const std::vector<ExprPtr>& args, const std::vector<KeywordArg>& kwargs, const ScopePtr& scope) {
        CallArgs call;
        for (const ExprPtr& a : args) call.positional.push_back(eval(*a, scope));
        for (const KeywordArg& k : kwargs) call.keyword.emplace_back(k.name, eval(*k.value, scope));
        for (const Value& v : call.positional) budget_.step(read_cost(v));
        for (const auto& [name, v] : call.keyword) budget_.step(read_cost(v));
        return call;
    }

    // x|f|g: the filters of a chain are evaluated one inside the other, a level each.
    Value eval_chained_filter(const Expr& expr, const Value* block, const ScopePtr& scope) {
        const Nesting::Level level = nesting_.enter();
        budget_.step();
        return eval_filter(expr, block, scope);
    }

    // A filter whose innermost operand is null takes `block` (the rendered body) instead.
    Value eval_filter(const Expr& expr, const Value* block, const ScopePtr& scope) {
        const auto& node = static_cast<const FilterExpr&>(expr);
        if (constant_mode_) {
            // jinja2 does not fold filters that need the render context, nor unresolved ones.
            static const std::set<std::string_view> kNeedContext = {"map", "select", "reject", "selectattr",
                                                                    "rejectattr"};
            if (!node.operand || !node.deferred_error.empty() || kNeedContext.count(node.name)) throw NotConstant();
        }
        fail_if_deferred(node);
        std::optional<CallArgs> args;
        try {
            const Value input = !node.operand ? *block
                                : node.operand->kind == Expr::Kind::filter
                                    ? eval_chained_filter(*node.operand, block, scope)
                                    : eval(*node.operand, scope);
            args = eval_args(node.args, node.kwargs, scope);
            budget_.step(1 + read_cost(input));
            return apply_filter(node.name, input, *args);
        } catch (const EvalError& e) {
            rethrow_at(e, expr.pos, expression_name(expr, args ? &*args : nullptr));
        }
    }

    Value eval_node(const Expr& expr, const ScopePtr& scope) {
        switch (expr.kind) {
            case Expr::Kind::literal:
                return static_cast<const LiteralExpr&>(expr).value;
            case Expr::Kind::name:
                return lookup(static_cast<const NameExpr&>(expr).name, scope);
            case Expr::Kind::list:
            case Expr::Kind::tuple: {
                ValueList items;
                for (const ExprPtr& e : static_cast<const SequenceExpr&>(expr).items) items.push_back(eval(*e, scope));
                return expr.kind == Expr::Kind::list ? Value::list(std::move(items)) : Value::tuple(std::move(items));
            }
            case Expr::Kind::dict: {
                Dict d;
                for (const auto& [k, v] : static_cast<const DictExpr&>(expr).entries) {
                    Value key = eval(*k, scope);
                    if (key.is_list() || key.is_dict()) throw EvalError("unhashable type: '" + type_name(key) + "'");
                    d.set(std::move(key), eval(*v, scope));
                }
                return Value::dict(std::move(d));
            }
            case Expr::Kind::attribute: {
                const auto& node = static_cast<const AttributeExpr&>(expr);
                const Value object = eval(*node.object, scope);
                if (object.is_string()) budget_.step(read_cost(object));  // its methods read all of it
                return get_attribute(object, node.attribute);
            }
            case Expr::Kind::subscript: {
                const auto& node = static_cast<const SubscriptExpr&>(expr);
                const Value object = eval(*node.object, scope);
                if (object.is_string()) budget_.step(read_cost(object));  // indexing decodes it
                if (node.index->kind == Expr::Kind::slice) {
                    const auto& s = static_cast<const SliceExpr&>(*node.index);
                    auto bound = [&](const ExprPtr& e) { return e ? eval(*e, scope) : Value::none(); };
                    const Value start = bound(s.start), stop = bound(s.stop), step = bound(s.step);
                    if (!constant_mode_) return get_slice(object, start, stop, step);
                    // At compile time jinja2 slices through its getitem: failure is undefined.
                    try {
                        return get_slice(object, start, stop, step);
                    } catch (const EvalError& e) {
                        // jinja2's getitem catches TypeError and LookupError, not ValueError
                        if (e.is_fatal() || std::string_view(e.what()) == "slice step cannot be zero") throw;
                        return Value::undefined(object_type_repr(object) + " has no element slice(" + to_repr(start) +
                                                ", " + to_repr(stop) + ", " + to_repr(step) + ")");
                    }
                }
                return get_item(object, eval(*node.index, scope));
            }
            case Expr::Kind::slice:
                throw EvalError("a slice can only appear inside []");
            case Expr::Kind::call: {
                if (constant_mode_) throw NotConstant();
                const auto& node = static_cast<const CallExpr&>(expr);
                const Value callee = eval(*node.callee, scope);
                const CallArgs args = eval_args(node.args, node.kwargs, scope);
                if (callee.is_undefined()) fail_undefined(callee);
                if (!callee.is_callable()) throw EvalError("'" + type_name(callee) + "' object is not callable");
                try {
                    return callee.as_callable().call(args, *this);  // a copy: args stay for the message
                } catch (const EvalError& e) {
                    rethrow_at(e, expr.pos, expression_name(expr, &args));
                }
            }
            case Expr::Kind::filter:
                return eval_filter(expr, nullptr, scope);
            case Expr::Kind::test: {
                const auto& node = static_cast<const FilterExpr&>(expr);
                if (constant_mode_ && !node.deferred_error.empty()) throw NotConstant();
                fail_if_deferred(node);
                const Value input = eval(*node.operand, scope);
                budget_.step(read_cost(input));
                return Value::boolean(apply_test(node.name, input, eval_args(node.args, node.kwargs, scope)));
            }
            case Expr::Kind::unary: {
                const auto& node = static_cast<const UnaryExpr&>(expr);
                return unary_op(node.op, eval(*node.operand, scope));
            }
            case Expr::Kind::binary: {
                const auto& node = static_cast<const BinaryExpr&>(expr);
                const Value left = eval(*node.left, scope);
                const Value right = eval(*node.right, scope);
                budget_.step(read_cost(left) + read_cost(right));
                return binary_op(node.op, left, right);
            }
            case Expr::Kind::logical: {
                const auto& node = static_cast<const LogicalExpr&>(expr);
                Value left = eval(*node.left, scope);
                if (truthy(left) != node.is_and) return left;  // `a and b` stops at a false a, `a or b` at a true one
                return eval(*node.right, scope);
            }
            case Expr::Kind::concat: {
                std::string out;
                for (const ExprPtr& e : static_cast<const ConcatExpr&>(expr).items) {
                    const Value item = eval(*e, scope);
                    budget_.step(read_cost(item));
                    append_within_limit(out, item.is_string() ? item.as_string() : to_str(item));
                }
                return Value::string(std::move(out));
            }
            case Expr::Kind::compare:
                return eval_compare(static_cast<const CompareExpr&>(expr), scope);
            case Expr::Kind::conditional: {
                const auto& node = static_cast<const ConditionalExpr&>(expr);
                if (truthy(eval(*node.condition, scope))) return eval(*node.then_value, scope);
                if (node.else_value) return eval(*node.else_value, scope);
                if (constant_mode_) throw NotConstant();
                return Value::undefined("the inline if-expression on line " + std::to_string(expr.pos.line) +
                                        " evaluated to false and no else section was defined.");
            }
        }
        return Value();
    }

    // A filter or test check_template could not resolve, reached at run time (as jinja2 fails then).
    static void fail_if_deferred(const FilterExpr& node) {
        if (node.deferred_error.empty()) return;
        throw EvalError(node.deferred_error,
                        node.deferred_unsupported ? EvalError::Kind::unsupported : EvalError::Kind::runtime);
    }

    Value eval_compare(const CompareExpr& node, const ScopePtr& scope) {
        Value left = eval(*node.first, scope);
        for (const auto& [op, operand] : node.rest) {
            Value right = eval(*operand, scope);
            budget_.step(read_cost(left) + read_cost(right));
            bool ok = false;
            switch (op) {
                case CompareExpr::Op::eq:
                    ok = equals(left, right);
                    break;
                case CompareExpr::Op::ne:
                    ok = !equals(left, right);
                    break;
                case CompareExpr::Op::lt:
                    ok = compare(left, right, "<") < 0;
                    break;
                case CompareExpr::Op::le:
                    ok = compare(left, right, "<=") <= 0;
                    break;
                case CompareExpr::Op::gt:
                    ok = compare(left, right, ">") > 0;
                    break;
                case CompareExpr::Op::ge:
                    ok = compare(left, right, ">=") >= 0;
                    break;
                case CompareExpr::Op::in:
                    ok = contains(right, left);
                    break;
                case CompareExpr::Op::not_in:
                    ok = !contains(right, left);
                    break;
            }
            if (!ok) return Value::boolean(false);
            left = std::move(right);
        }
        return Value::boolean(true);
    }

    const Template& tmpl_;
    const RenderEnvironment& env_;
    RenderBudget& budget_;
    Nesting nesting_;
    std::optional<Dict> globals_;
    // Scopes that macros were defined in, kept until the render ends (see Macro).
    std::vector<ScopePtr> macro_scopes_;
    // Objects that may end up in reference cycles (namespaces), cleared when the render ends.
    std::vector<std::weak_ptr<Object>> objects_;
    size_t objects_kept_ = 0;
    bool constant_mode_ = false;  // evaluate_constant: jinja2's Node.as_const rules
};

Value Macro::call(CallArgs args, CallContext&) const {
    return evaluator_.call_macro(node_, closure_, std::move(args));
}

}  // namespace

std::string render(const Template& tmpl, const RenderEnvironment& environment) {
    std::optional<RenderBudget> own;
    RenderBudget* budget = RenderBudget::active();
    if (!budget) budget = &own.emplace();
    return Evaluator(tmpl, environment, *budget).run();
}

std::optional<Value> evaluate_constant(const Expr& expr, bool* needs_context) {
    static const Template kNoTemplate;
    static const RenderEnvironment kNoEnvironment;
    std::optional<RenderBudget> own;
    RenderBudget* budget = RenderBudget::active();
    if (!budget) budget = &own.emplace();
    return Evaluator(kNoTemplate, kNoEnvironment, *budget).constant(expr, needs_context);
}

}  // namespace fitllm::chat::jinja
