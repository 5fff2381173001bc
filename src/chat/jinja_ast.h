#pragma once
// The parsed form of a template: expressions and statements, each with the position of the
// source it came from so that rendering errors can point at it. Node kinds mirror jinja2's
// (nodes.py) for the subset fitllm implements.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {

struct Expr {
    enum class Kind {
        literal,
        name,
        list,
        tuple,
        dict,
        attribute,
        subscript,
        slice,
        call,
        filter,
        test,
        unary,
        binary,
        logical,
        concat,
        compare,
        conditional,
    };
    Expr(Kind k, SourcePos p) : kind(k), pos(p) {}
    virtual ~Expr() = default;
    Kind kind;
    SourcePos pos;
};
using ExprPtr = std::unique_ptr<Expr>;

struct KeywordArg {
    std::string name;
    ExprPtr value;
};

struct LiteralExpr : Expr {
    LiteralExpr(SourcePos p, Value v) : Expr(Kind::literal, p), value(std::move(v)) {}
    Value value;
};
struct NameExpr : Expr {
    NameExpr(SourcePos p, std::string n) : Expr(Kind::name, p), name(std::move(n)) {}
    std::string name;
};
struct SequenceExpr : Expr {  // Kind::list or Kind::tuple
    SequenceExpr(Kind k, SourcePos p) : Expr(k, p) {}
    std::vector<ExprPtr> items;
};
struct DictExpr : Expr {
    explicit DictExpr(SourcePos p) : Expr(Kind::dict, p) {}
    std::vector<std::pair<ExprPtr, ExprPtr>> entries;
};
struct AttributeExpr : Expr {  // obj.name
    AttributeExpr(SourcePos p, ExprPtr o, std::string a)
        : Expr(Kind::attribute, p), object(std::move(o)), attribute(std::move(a)) {}
    ExprPtr object;
    std::string attribute;
};
struct SubscriptExpr : Expr {  // obj[index]; index may be a SliceExpr
    SubscriptExpr(SourcePos p, ExprPtr o, ExprPtr i)
        : Expr(Kind::subscript, p), object(std::move(o)), index(std::move(i)) {}
    ExprPtr object;
    ExprPtr index;
};
struct SliceExpr : Expr {  // start:stop:step, each optional
    explicit SliceExpr(SourcePos p) : Expr(Kind::slice, p) {}
    ExprPtr start, stop, step;
};
struct CallExpr : Expr {
    CallExpr(SourcePos p, ExprPtr c) : Expr(Kind::call, p), callee(std::move(c)) {}
    ExprPtr callee;
    std::vector<ExprPtr> args;
    std::vector<KeywordArg> kwargs;
};
// `value|name(args)` and `value is name(args)`; a filter's operand is null in `{% filter %}`
// and `{% set x | filter %}` blocks, where the rendered body takes its place.
struct FilterExpr : Expr {
    FilterExpr(Kind k, SourcePos p, ExprPtr o, std::string n) : Expr(k, p), operand(std::move(o)), name(std::move(n)) {}
    ExprPtr operand;
    std::string name;
    std::vector<ExprPtr> args;
    std::vector<KeywordArg> kwargs;
    // Set by check_template for a name that is no filter (or test) fitllm can apply, where
    // jinja2 only fails if the expression runs (inside if blocks and inline ifs).
    std::string deferred_error;
    bool deferred_unsupported = false;
};
struct UnaryExpr : Expr {
    enum class Op { negate, plus, logical_not };
    UnaryExpr(SourcePos p, Op o, ExprPtr e) : Expr(Kind::unary, p), op(o), operand(std::move(e)) {}
    Op op;
    ExprPtr operand;
};
struct BinaryExpr : Expr {
    enum class Op { add, sub, mul, div, floordiv, mod, pow };
    BinaryExpr(SourcePos p, Op o, ExprPtr l, ExprPtr r)
        : Expr(Kind::binary, p), op(o), left(std::move(l)), right(std::move(r)) {}
    Op op;
    ExprPtr left, right;
};
struct LogicalExpr : Expr {  // and / or, returning an operand as Python does
    LogicalExpr(SourcePos p, bool a, ExprPtr l, ExprPtr r)
        : Expr(Kind::logical, p), is_and(a), left(std::move(l)), right(std::move(r)) {}
    bool is_and;
    ExprPtr left, right;
};
struct ConcatExpr : Expr {  // a ~ b ~ c
    explicit ConcatExpr(SourcePos p) : Expr(Kind::concat, p) {}
    std::vector<ExprPtr> items;
};
struct CompareExpr : Expr {  // a < b <= c, chained as in Python
    enum class Op { eq, ne, lt, le, gt, ge, in, not_in };
    CompareExpr(SourcePos p, ExprPtr f) : Expr(Kind::compare, p), first(std::move(f)) {}
    ExprPtr first;
    std::vector<std::pair<Op, ExprPtr>> rest;
};
struct ConditionalExpr : Expr {  // then_value if condition else else_value (else optional)
    ConditionalExpr(SourcePos p, ExprPtr t, ExprPtr c, ExprPtr e)
        : Expr(Kind::conditional, p), then_value(std::move(t)), condition(std::move(c)), else_value(std::move(e)) {}
    ExprPtr then_value, condition, else_value;
};

// Left side of set, for and with: a name, a tuple of targets, or namespace.attribute.
struct AssignTarget {
    enum class Kind { name, tuple, namespace_attribute };
    Kind kind = Kind::name;
    std::string name;
    std::string attribute;
    std::vector<AssignTarget> items;
    SourcePos pos;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
    enum class Kind { text, output, if_, for_, set, set_block, macro, filter_block, with, loop_control, generation };
    Stmt(Kind k, SourcePos p) : kind(k), pos(p) {}
    virtual ~Stmt() = default;
    Kind kind;
    SourcePos pos;
};

struct TextStmt : Stmt {
    TextStmt(SourcePos p, std::string t) : Stmt(Kind::text, p), text(std::move(t)) {}
    std::string text;
};
struct OutputStmt : Stmt {  // {{ expr }} and {% print expr %}
    OutputStmt(SourcePos p, ExprPtr e) : Stmt(Kind::output, p), expr(std::move(e)) {}
    ExprPtr expr;
};
struct IfStmt : Stmt {
    explicit IfStmt(SourcePos p) : Stmt(Kind::if_, p) {}
    std::vector<std::pair<ExprPtr, Body>> branches;  // if, then each elif
    Body else_body;
};
struct ForStmt : Stmt {
    explicit ForStmt(SourcePos p) : Stmt(Kind::for_, p) {}
    AssignTarget target;
    ExprPtr iterable;
    ExprPtr filter;  // `for x in xs if cond`, or null
    Body body;
    Body else_body;
};
struct SetStmt : Stmt {
    SetStmt(SourcePos p, AssignTarget t, ExprPtr v) : Stmt(Kind::set, p), target(std::move(t)), value(std::move(v)) {}
    AssignTarget target;
    ExprPtr value;
};
struct SetBlockStmt : Stmt {  // {% set x %}body{% endset %}
    explicit SetBlockStmt(SourcePos p) : Stmt(Kind::set_block, p) {}
    AssignTarget target;
    ExprPtr filter;  // optional filter chain applied to the body
    Body body;
};
struct MacroParam {
    std::string name;
    ExprPtr default_value;  // null: required
};
struct MacroStmt : Stmt {
    explicit MacroStmt(SourcePos p) : Stmt(Kind::macro, p) {}
    std::string name;
    std::vector<MacroParam> params;
    bool catches_varargs = false;  // the body reads `varargs`: extra positional arguments go there
    bool catches_kwargs = false;   // the body reads `kwargs`
    Body body;
};
struct FilterBlockStmt : Stmt {  // {% filter f %}body{% endfilter %}
    explicit FilterBlockStmt(SourcePos p) : Stmt(Kind::filter_block, p) {}
    ExprPtr filter;
    Body body;
};
struct WithStmt : Stmt {
    explicit WithStmt(SourcePos p) : Stmt(Kind::with, p) {}
    std::vector<std::pair<AssignTarget, ExprPtr>> assignments;
    Body body;
};
struct LoopControlStmt : Stmt {  // break / continue (jinja2.ext.loopcontrols)
    LoopControlStmt(SourcePos p, bool b) : Stmt(Kind::loop_control, p), is_break(b) {}
    bool is_break;
};
struct GenerationStmt : Stmt {  // {% generation %}: HF's marker of assistant output; renders its body
    explicit GenerationStmt(SourcePos p) : Stmt(Kind::generation, p) {}
    Body body;
};

struct Template {
    std::string name;
    Body body;
};

}  // namespace fitllm::chat::jinja
