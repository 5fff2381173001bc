#include "chat/jinja_eval.h"

#include <memory>
#include <set>

#include "chat/jinja_access.h"
#include "chat/jinja_filters.h"
#include "chat/jinja_objects.h"
#include "chat/jinja_operators.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {
namespace {

// Variables of one scope; lookups fall back to the enclosing scope.
class Scope {
public:
    explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
    const Value* find(std::string_view name) const {
        for (const Scope* s = this; s; s = s->parent_.get())
            for (const auto& [n, v] : s->vars_)
                if (n == name) return &v;
        return nullptr;
    }
    void set(const std::string& name, Value value) {
        for (auto& [n, v] : vars_) {
            if (n == name) {
                v = std::move(value);
                return;
            }
        }
        vars_.emplace_back(name, std::move(value));
    }

    // Drops everything the scope holds: a macro keeps its defining scope alive and a scope
    // keeps its macros, so the renderer breaks these cycles when it is done.
    void clear() {
        vars_.clear();
        parent_.reset();
    }

private:
    std::shared_ptr<Scope> parent_;
    std::vector<std::pair<std::string, Value>> vars_;
};
using ScopePtr = std::shared_ptr<Scope>;

TemplateError::Kind error_kind(const EvalError& e) {
    switch (e.kind()) {
        case EvalError::Kind::raised:
            return TemplateError::Kind::raised;
        case EvalError::Kind::unsupported:
            return TemplateError::Kind::unsupported;
        default:
            return TemplateError::Kind::runtime;
    }
}

// Thrown in constant mode when an expression needs the render context (a name, a call).
struct NotConstant {};

class Evaluator;

// A {% macro %}: calling it renders its body with the arguments bound, in a scope whose
// parent is the scope the macro was defined in.
class Macro : public Callable {
public:
    Macro(Evaluator& evaluator, const MacroStmt& node, ScopePtr closure)
        : evaluator_(evaluator), node_(node), closure_(std::move(closure)) {}
    std::string describe() const override { return "Macro '" + node_.name + "'"; }
    Value call(CallArgs args, CallContext& context) const override;

private:
    Evaluator& evaluator_;
    const MacroStmt& node_;
    ScopePtr closure_;
};

class Evaluator : public CallContext {
public:
    Evaluator(const Template& tmpl, const RenderEnvironment& env)
        : tmpl_(tmpl), env_(env), globals_(builtin_globals()) {}
    Evaluator(const Evaluator&) = delete;
    Evaluator& operator=(const Evaluator&) = delete;
    ~Evaluator() override {
        for (const auto& weak : scopes_)
            if (const ScopePtr scope = weak.lock()) scope->clear();
    }

    // jinja2's Node.as_const: the value if the expression needs nothing from the render.
    std::optional<Value> constant(const Expr& expr) {
        constant_mode_ = true;
        try {
            return eval(expr, child_of(nullptr));
        } catch (const NotConstant&) {
        } catch (const TemplateError&) {  // jinja2 leaves failing expressions to run time
        }
        return std::nullopt;
    }

    std::string run() {
        std::string out;
        exec_body(tmpl_.body, child_of(nullptr), out);
        return out;
    }

    std::tm now() const override {
        if (env_.now) return *env_.now;
        const std::time_t t = std::time(nullptr);
        std::tm local{};
        localtime_r(&t, &local);
        return local;
    }

    Value call_macro(const MacroStmt& node, const ScopePtr& closure, CallArgs args) {
        constexpr int kMaxDepth = 200;
        if (depth_ >= kMaxDepth) throw EvalError("maximum recursion depth exceeded in macro '" + node.name + "'");
        const ScopePtr scope = child_of(closure);
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
        std::string out;
        ++depth_;
        try {
            exec_body(node.body, scope, out);
        } catch (...) {
            --depth_;
            throw;
        }
        --depth_;
        return Value::string(std::move(out));
    }

private:
    enum class Flow { normal, break_loop, continue_loop };

    ScopePtr child_of(const ScopePtr& parent) {
        ScopePtr scope = std::make_shared<Scope>(parent);
        scopes_.push_back(scope);
        return scope;
    }

    [[noreturn]] void rethrow_at(const EvalError& e, SourcePos pos) const {
        throw TemplateError(error_kind(e), tmpl_.name, pos, e.what());
    }

    Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
        for (const StmtPtr& stmt : body) {
            const Flow flow = exec(*stmt, scope, out);
            if (flow != Flow::normal) return flow;
        }
        return Flow::normal;
    }

    Flow exec(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
        try {
            return exec_node(stmt, scope, out);
        } catch (const EvalError& e) {
            rethrow_at(e, stmt.pos);
        }
    }

    Flow exec_node(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
        switch (stmt.kind) {
            case Stmt::Kind::text:
                out += static_cast<const TextStmt&>(stmt).text;
                return Flow::normal;
            case Stmt::Kind::output:
                out += to_str(eval(*static_cast<const OutputStmt&>(stmt).expr, scope));
                return Flow::normal;
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
                std::string body;
                exec_body(node.body, child_of(scope), body);
                Value value = Value::string(std::move(body));
                if (node.filter) value = eval_filter(*node.filter, &value, scope);
                assign(node.target, std::move(value), scope);
                return Flow::normal;
            }
            case Stmt::Kind::macro: {
                const auto& node = static_cast<const MacroStmt&>(stmt);
                scope->set(node.name, Value::callable(std::make_shared<Macro>(*this, node, scope)));
                return Flow::normal;
            }
            case Stmt::Kind::filter_block: {
                const auto& node = static_cast<const FilterBlockStmt&>(stmt);
                std::string body;
                exec_body(node.body, child_of(scope), body);
                const Value input = Value::string(std::move(body));
                out += to_str(eval_filter(*node.filter, &input, scope));
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

    Flow exec_for(const ForStmt& node, const ScopePtr& scope, std::string& out) {
        ValueList items = iterate(eval(*node.iterable, scope));
        if (node.filter) {
            ValueList kept;
            for (Value& item : items) {
                const ScopePtr probe = child_of(scope);
                assign(node.target, item, probe);
                if (truthy(eval(*node.filter, probe))) kept.push_back(std::move(item));
            }
            items = std::move(kept);
        }
        if (items.empty()) {
            exec_body(node.else_body, child_of(scope), out);
            return Flow::normal;
        }
        const auto loop = std::make_shared<LoopObject>(items);
        const Value loop_value = Value::object(loop);
        for (size_t i = 0; i < items.size(); ++i, loop->advance()) {
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
                const ValueList items = iterate(value);
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

    Value lookup(const std::string& name, const ScopePtr& scope) const {
        if (constant_mode_) throw NotConstant();
        if (const Value* v = scope->find(name)) return *v;
        if (const Value* v = env_.variables.find(name)) return *v;
        if (const Value* v = globals_.find(name)) return *v;
        return Value::undefined("'" + name + "' is undefined");
    }

public:
    Value eval(const Expr& expr, const ScopePtr& scope) {
        try {
            return eval_node(expr, scope);
        } catch (const EvalError& e) {
            rethrow_at(e, expr.pos);
        }
    }

private:
    CallArgs eval_args(const std::vector<ExprPtr>& args, const std::vector<KeywordArg>& kwargs, const ScopePtr& scope) {
        CallArgs call;
        for (const ExprPtr& a : args) call.positional.push_back(eval(*a, scope));
        for (const KeywordArg& k : kwargs) call.keyword.emplace_back(k.name, eval(*k.value, scope));
        return call;
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
        const Value input = node.operand
                                ? (node.operand->kind == Expr::Kind::filter ? eval_filter(*node.operand, block, scope)
                                                                            : eval(*node.operand, scope))
                                : *block;
        const CallArgs args = eval_args(node.args, node.kwargs, scope);
        try {
            return apply_filter(node.name, input, args);
        } catch (const EvalError& e) {
            rethrow_at(e, expr.pos);
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
                return get_attribute(eval(*node.object, scope), node.attribute);
            }
            case Expr::Kind::subscript: {
                const auto& node = static_cast<const SubscriptExpr&>(expr);
                const Value object = eval(*node.object, scope);
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
                        if (std::string_view(e.what()) == "slice step cannot be zero") throw;
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
                CallArgs args = eval_args(node.args, node.kwargs, scope);
                if (callee.is_undefined()) fail_undefined(callee);
                if (!callee.is_callable()) throw EvalError("'" + type_name(callee) + "' object is not callable");
                return callee.as_callable().call(std::move(args), *this);
            }
            case Expr::Kind::filter:
                return eval_filter(expr, nullptr, scope);
            case Expr::Kind::test: {
                const auto& node = static_cast<const FilterExpr&>(expr);
                if (constant_mode_ && !node.deferred_error.empty()) throw NotConstant();
                fail_if_deferred(node);
                const Value input = eval(*node.operand, scope);
                return Value::boolean(apply_test(node.name, input, eval_args(node.args, node.kwargs, scope)));
            }
            case Expr::Kind::unary: {
                const auto& node = static_cast<const UnaryExpr&>(expr);
                return unary_op(node.op, eval(*node.operand, scope));
            }
            case Expr::Kind::binary: {
                const auto& node = static_cast<const BinaryExpr&>(expr);
                const Value left = eval(*node.left, scope);
                return binary_op(node.op, left, eval(*node.right, scope));
            }
            case Expr::Kind::logical: {
                const auto& node = static_cast<const LogicalExpr&>(expr);
                Value left = eval(*node.left, scope);
                if (truthy(left) != node.is_and) return left;  // `a and b` stops at a false a, `a or b` at a true one
                return eval(*node.right, scope);
            }
            case Expr::Kind::concat: {
                std::string out;
                for (const ExprPtr& e : static_cast<const ConcatExpr&>(expr).items) out += to_str(eval(*e, scope));
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
    Dict globals_;
    std::vector<std::weak_ptr<Scope>> scopes_;
    int depth_ = 0;
    bool constant_mode_ = false;  // evaluate_constant: jinja2's Node.as_const rules
};

Value Macro::call(CallArgs args, CallContext&) const {
    return evaluator_.call_macro(node_, closure_, std::move(args));
}

}  // namespace

std::string render(const Template& tmpl, const RenderEnvironment& environment) {
    return Evaluator(tmpl, environment).run();
}

std::optional<Value> evaluate_constant(const Expr& expr) {
    static const Template kNoTemplate;
    static const RenderEnvironment kNoEnvironment;
    return Evaluator(kNoTemplate, kNoEnvironment).constant(expr);
}

}  // namespace fitllm::chat::jinja
