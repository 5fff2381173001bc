#include "chat/jinja_check.h"

#include "chat/jinja_eval.h"
#include "chat/jinja_filters.h"
#include "chat/render_budget.h"

namespace fitllm::chat::jinja {
namespace {

// jinja2's has_safe_repr: values its compiler can write back into code as literals (and,
// here, that nest within the depth limit: deeper ones stay as they are, to fail when rendered).
bool has_safe_repr(const Value& v);

bool safe_repr_within_limits(const Value& v) {
    try {
        return has_safe_repr(v);
    } catch (const EvalError&) {
        return false;
    }
}

bool has_safe_repr(const Value& v) {
    const ValueWalk level;
    switch (v.kind()) {
        case Value::Kind::none:
        case Value::Kind::boolean:
        case Value::Kind::integer:
        case Value::Kind::floating:
        case Value::Kind::string:
            return true;
        case Value::Kind::list:
        case Value::Kind::tuple:
            for (const Value& item : v.items())
                if (!has_safe_repr(item)) return false;
            return true;
        case Value::Kind::dict:
            for (const auto& [k, val] : v.as_dict().entries())
                if (!has_safe_repr(k) || !has_safe_repr(val)) return false;
            return true;
        default:
            return false;
    }
}

class Checker {
public:
    explicit Checker(const std::string& name) : name_(name) {}

    // `soft` mirrors jinja2's soft frames: the test and body of an if (not what nests in a
    // loop, macro, with, filter or set block inside it) and all of an inline if.
    void body(Body& stmts, bool soft) {
        for (StmtPtr& s : stmts) stmt(*s, soft);
    }

private:
    // The parser bounds how deep it recursed; this counts every node, as the evaluator will.
    Nesting::Level enter(SourcePos pos) {
        try {
            return nesting_.enter();
        } catch (const EvalError& e) {
            throw TemplateError(TemplateError::Kind::limit, name_, pos, e.what());
        }
    }

    void stmt(Stmt& s, bool soft) {
        const Nesting::Level level = enter(s.pos);
        switch (s.kind) {
            case Stmt::Kind::text:
            case Stmt::Kind::loop_control:
                return;
            case Stmt::Kind::output: {
                // jinja2 prints a constant {{ }} expression from its compile-time value even when
                // that value would not fold (an undefined from a failed slice prints as "").
                ExprPtr& slot = static_cast<OutputStmt&>(s).expr;
                if (expr(slot, soft)) return;
                if (slot->kind != Expr::Kind::literal)
                    if (auto value = evaluate_constant(*slot))
                        slot = std::make_unique<LiteralExpr>(slot->pos, std::move(*value));
                return;
            }
            case Stmt::Kind::if_: {
                auto& node = static_cast<IfStmt&>(s);
                for (auto& [test, branch] : node.branches) {
                    expr(test, true);
                    body(branch, true);
                }
                body(node.else_body, true);
                return;
            }
            case Stmt::Kind::for_: {
                auto& node = static_cast<ForStmt&>(s);
                expr(node.iterable, soft);
                expr(node.filter, false);
                body(node.body, false);
                body(node.else_body, false);
                return;
            }
            case Stmt::Kind::set:
                expr(static_cast<SetStmt&>(s).value, soft);
                return;
            case Stmt::Kind::set_block: {
                auto& node = static_cast<SetBlockStmt&>(s);
                body(node.body, false);
                expr(node.filter, false);
                return;
            }
            case Stmt::Kind::macro: {
                auto& node = static_cast<MacroStmt&>(s);
                for (MacroParam& p : node.params) expr(p.default_value, false);
                body(node.body, false);
                return;
            }
            case Stmt::Kind::filter_block: {
                auto& node = static_cast<FilterBlockStmt&>(s);
                body(node.body, false);
                expr(node.filter, false);
                return;
            }
            case Stmt::Kind::with: {
                auto& node = static_cast<WithStmt&>(s);
                for (auto& [target, value] : node.assignments) expr(value, soft);
                body(node.body, false);
                return;
            }
            case Stmt::Kind::generation:
                body(static_cast<GenerationStmt&>(s).body, false);
                return;
        }
    }

    // Checks the names under `slot` and then folds it, like jinja2's optimizer: a constant
    // subexpression whose value prints back as a literal becomes that literal. Returns whether
    // the expression needs the render context (a name, a call), which it passes up: a parent
    // with such a child is not evaluated to find that out again (each try costs an exception,
    // 100,000 of them for a template that lists 100,000 names), unless it may short-circuit.
    bool expr(ExprPtr& slot, bool soft) {
        if (!slot) return false;
        const Nesting::Level level = enter(slot->pos);
        const bool child_needs_context = visit(slot.get(), soft);
        switch (slot->kind) {
            case Expr::Kind::literal:
            case Expr::Kind::slice:  // evaluated with its subscript
                return child_needs_context;
            case Expr::Kind::name:
            case Expr::Kind::call:
                return true;
            case Expr::Kind::logical:  // `false and x`, `x if true else 1`, `2 < 1 < x` are constant
            case Expr::Kind::conditional:
            case Expr::Kind::compare:
                break;
            default:
                if (child_needs_context) return true;
        }
        bool needs_context = false;
        if (auto value = evaluate_constant(*slot, &needs_context); value && safe_repr_within_limits(*value))
            slot = std::make_unique<LiteralExpr>(slot->pos, std::move(*value));
        return needs_context;
    }

    bool visit(Expr* e, bool soft) {
        bool needs = false;
        auto sub = [&](ExprPtr& slot, bool sub_soft) { needs = expr(slot, sub_soft) || needs; };
        switch (e->kind) {
            case Expr::Kind::literal:
            case Expr::Kind::name:
                break;
            case Expr::Kind::list:
            case Expr::Kind::tuple:
                for (ExprPtr& item : static_cast<SequenceExpr*>(e)->items) sub(item, soft);
                break;
            case Expr::Kind::dict:
                for (auto& [k, v] : static_cast<DictExpr*>(e)->entries) {
                    sub(k, soft);
                    sub(v, soft);
                }
                break;
            case Expr::Kind::attribute:
                sub(static_cast<AttributeExpr*>(e)->object, soft);
                break;
            case Expr::Kind::subscript: {
                auto* node = static_cast<SubscriptExpr*>(e);
                sub(node->object, soft);
                sub(node->index, soft);
                break;
            }
            case Expr::Kind::slice: {
                auto* node = static_cast<SliceExpr*>(e);
                sub(node->start, soft);
                sub(node->stop, soft);
                sub(node->step, soft);
                break;
            }
            case Expr::Kind::call: {
                auto* node = static_cast<CallExpr*>(e);
                sub(node->callee, soft);
                for (ExprPtr& a : node->args) sub(a, soft);
                for (KeywordArg& k : node->kwargs) sub(k.value, soft);
                break;
            }
            case Expr::Kind::filter:
            case Expr::Kind::test: {
                auto* node = static_cast<FilterExpr*>(e);
                check_name(*node, soft);
                sub(node->operand, soft);
                for (ExprPtr& a : node->args) sub(a, soft);
                for (KeywordArg& k : node->kwargs) sub(k.value, soft);
                break;
            }
            case Expr::Kind::unary:
                sub(static_cast<UnaryExpr*>(e)->operand, soft);
                break;
            case Expr::Kind::binary: {
                auto* node = static_cast<BinaryExpr*>(e);
                sub(node->left, soft);
                sub(node->right, soft);
                break;
            }
            case Expr::Kind::logical: {
                auto* node = static_cast<LogicalExpr*>(e);
                sub(node->left, soft);
                sub(node->right, soft);
                break;
            }
            case Expr::Kind::concat:
                for (ExprPtr& item : static_cast<ConcatExpr*>(e)->items) sub(item, soft);
                break;
            case Expr::Kind::compare: {
                auto* node = static_cast<CompareExpr*>(e);
                sub(node->first, soft);
                for (auto& [op, operand] : node->rest) sub(operand, soft);
                break;
            }
            case Expr::Kind::conditional: {
                auto* node = static_cast<ConditionalExpr*>(e);
                sub(node->then_value, true);
                sub(node->condition, true);
                sub(node->else_value, true);
                break;
            }
        }
        return needs;
    }

    void check_name(FilterExpr& node, bool soft) {
        const bool is_filter = node.kind == Expr::Kind::filter;
        const Support support = is_filter ? filter_support(node.name) : test_support(node.name);
        if (support == Support::supported) return;
        const std::string what = is_filter ? "filter" : "test";
        if (support == Support::unknown) {
            if (!soft)
                throw TemplateError(TemplateError::Kind::syntax, name_, node.pos,
                                    "No " + what + " named '" + node.name + "'.");
            node.deferred_error = "No " + what + " named '" + node.name + "' found.";
            return;
        }
        const std::string message = "the '" + node.name + "' " + what + " is not supported by fitllm's template engine";
        if (!soft) throw TemplateError(TemplateError::Kind::unsupported, name_, node.pos, message);
        node.deferred_error = message;
        node.deferred_unsupported = true;
    }

    const std::string& name_;
    Nesting nesting_{RenderLimits{}.max_depth};
};

}  // namespace

void check_template(Template& tmpl) {
    // Constant folding runs built-ins on literals, so it gets a budget of its own, smaller than
    // a render's: what would go past it is left unfolded, to run (or fail) when the template
    // renders, rather than hold up the load of its model or stay in memory with the template.
    const RenderBudget folding(RenderLimits{
        .max_steps = 1'000'000, .max_value_bytes = uint64_t{1} << 20, .max_live_bytes = uint64_t{4} << 20});
    Checker(tmpl.name).body(tmpl.body, false);
}

}  // namespace fitllm::chat::jinja
