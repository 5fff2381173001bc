#include "chat/jinja_check.h"

#include "chat/jinja_eval.h"
#include "chat/jinja_filters.h"

namespace fitllm::chat::jinja {
namespace {

// jinja2's has_safe_repr: values its compiler can write back into code as literals.
bool has_safe_repr(const Value& v) {
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
    void stmt(Stmt& s, bool soft) {
        switch (s.kind) {
            case Stmt::Kind::text:
            case Stmt::Kind::loop_control:
                return;
            case Stmt::Kind::output: {
                // jinja2 prints a constant {{ }} expression from its compile-time value even when
                // that value would not fold (an undefined from a failed slice prints as "").
                ExprPtr& slot = static_cast<OutputStmt&>(s).expr;
                expr(slot, soft);
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
    // subexpression whose value prints back as a literal becomes that literal.
    void expr(ExprPtr& slot, bool soft) {
        if (!slot) return;
        visit(slot.get(), soft);
        if (slot->kind == Expr::Kind::literal || slot->kind == Expr::Kind::slice) return;
        if (auto value = evaluate_constant(*slot); value && has_safe_repr(*value))
            slot = std::make_unique<LiteralExpr>(slot->pos, std::move(*value));
    }

    void visit(Expr* e, bool soft) {
        switch (e->kind) {
            case Expr::Kind::literal:
            case Expr::Kind::name:
                return;
            case Expr::Kind::list:
            case Expr::Kind::tuple:
                for (ExprPtr& item : static_cast<SequenceExpr*>(e)->items) expr(item, soft);
                return;
            case Expr::Kind::dict:
                for (auto& [k, v] : static_cast<DictExpr*>(e)->entries) {
                    expr(k, soft);
                    expr(v, soft);
                }
                return;
            case Expr::Kind::attribute:
                expr(static_cast<AttributeExpr*>(e)->object, soft);
                return;
            case Expr::Kind::subscript: {
                auto* node = static_cast<SubscriptExpr*>(e);
                expr(node->object, soft);
                expr(node->index, soft);
                return;
            }
            case Expr::Kind::slice: {
                auto* node = static_cast<SliceExpr*>(e);
                expr(node->start, soft);
                expr(node->stop, soft);
                expr(node->step, soft);
                return;
            }
            case Expr::Kind::call: {
                auto* node = static_cast<CallExpr*>(e);
                expr(node->callee, soft);
                for (ExprPtr& a : node->args) expr(a, soft);
                for (KeywordArg& k : node->kwargs) expr(k.value, soft);
                return;
            }
            case Expr::Kind::filter:
            case Expr::Kind::test: {
                auto* node = static_cast<FilterExpr*>(e);
                check_name(*node, soft);
                expr(node->operand, soft);
                for (ExprPtr& a : node->args) expr(a, soft);
                for (KeywordArg& k : node->kwargs) expr(k.value, soft);
                return;
            }
            case Expr::Kind::unary:
                expr(static_cast<UnaryExpr*>(e)->operand, soft);
                return;
            case Expr::Kind::binary: {
                auto* node = static_cast<BinaryExpr*>(e);
                expr(node->left, soft);
                expr(node->right, soft);
                return;
            }
            case Expr::Kind::logical: {
                auto* node = static_cast<LogicalExpr*>(e);
                expr(node->left, soft);
                expr(node->right, soft);
                return;
            }
            case Expr::Kind::concat:
                for (ExprPtr& item : static_cast<ConcatExpr*>(e)->items) expr(item, soft);
                return;
            case Expr::Kind::compare: {
                auto* node = static_cast<CompareExpr*>(e);
                expr(node->first, soft);
                for (auto& [op, operand] : node->rest) expr(operand, soft);
                return;
            }
            case Expr::Kind::conditional: {
                auto* node = static_cast<ConditionalExpr*>(e);
                expr(node->then_value, true);
                expr(node->condition, true);
                expr(node->else_value, true);
                return;
            }
        }
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
};

}  // namespace

void check_template(Template& tmpl) {
    Checker(tmpl.name).body(tmpl.body, false);
}

}  // namespace fitllm::chat::jinja
