#include "chat/jinja_parser.h"

#include <algorithm>
#include <set>

#include "chat/jinja_check.h"
#include "chat/jinja_lexer.h"
#include "chat/render_budget.h"

namespace fitllm::chat::jinja {
namespace {

using Names = std::vector<std::string>;

bool contains(const Names& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
}

class Parser {
public:
    Parser(std::vector<Token> tokens, const std::string& name) : tokens_(std::move(tokens)), name_(name) {}

    Body parse() {
        Body body = subparse(nullptr);
        if (current().type != TokenType::eof) fail(current(), "unexpected '" + describe(current()) + "'");
        return body;
    }

private:
    // ---- token stream ----
    const Token& current() const { return tokens_[pos_]; }
    const Token& look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
    const Token& next() {
        const Token& t = tokens_[pos_];
        if (pos_ + 1 < tokens_.size()) ++pos_;
        return t;
    }
    bool skip_op(std::string_view op) {
        if (!current().is_op(op)) return false;
        next();
        return true;
    }
    bool skip_name(std::string_view n) {
        if (!current().is_name(n)) return false;
        next();
        return true;
    }

    [[noreturn]] void fail(const Token& at, const std::string& message,
                           TemplateError::Kind kind = TemplateError::Kind::syntax) const {
        throw TemplateError(kind, name_, at.pos, message);
    }
    // One more level of nesting (a block, an expression in brackets, a `not` or a `-`), counted
    // as the checker and the evaluator count it; a TemplateError (Kind::limit) past the limit,
    // so that a template nested 10,000 deep is refused here instead of exhausting the stack.
    Nesting::Level nest(const Token& at, std::string_view construct = "expression") {
        try {
            return nesting_.enter();
        } catch (const EvalError& e) {
            fail(at, std::string(construct) + ": " + e.what(), TemplateError::Kind::limit);
        }
    }
    // The same for each link of a chain a loop builds: a.b.c, x|f|g, 1 + 2 + 3, f()().
    void deepen(Nesting::Chain& chain, const Token& at) {
        try {
            chain.add();
        } catch (const EvalError& e) {
            fail(at, std::string("expression: ") + e.what(), TemplateError::Kind::limit);
        }
    }

    [[noreturn]] void unsupported(const Token& at, const std::string& what) const {
        fail(at, what + " is not supported by fitllm's template engine", TemplateError::Kind::unsupported);
    }

    // jinja2's TokenStream.expect and its messages.
    const Token& expect(bool ok, const std::string& what) {
        if (!ok) {
            if (current().type == TokenType::eof)
                fail(current(), "unexpected end of template, expected '" + what + "'.");
            fail(current(), "expected token '" + what + "', got '" + describe(current()) + "'");
        }
        return next();
    }
    const Token& expect_op(std::string_view op) { return expect(current().is_op(op), std::string(op)); }
    const Token& expect_name() { return expect(current().type == TokenType::name, "name"); }
    const Token& expect_name(std::string_view n) { return expect(current().is_name(n), std::string(n)); }
    const Token& expect_block_end() { return expect(current().type == TokenType::block_end, "end of statement block"); }
    const Token& expect_variable_end() {
        return expect(current().type == TokenType::variable_end, "end of print statement");
    }

    // ---- statements ----
    Body subparse(const Names* end_names) {
        Body body;
        while (true) {
            const Token& t = current();
            switch (t.type) {
                case TokenType::data:
                    body.push_back(std::make_unique<TextStmt>(t.pos, t.text));
                    next();
                    break;
                case TokenType::variable_begin: {
                    next();
                    ExprPtr e = parse_tuple(false, true, false, false);
                    expect_variable_end();
                    body.push_back(std::make_unique<OutputStmt>(e->pos, std::move(e)));
                    break;
                }
                case TokenType::block_begin: {
                    next();
                    if (end_names && current().type == TokenType::name && contains(*end_names, current().text))
                        return body;
                    parse_statement(body);
                    expect_block_end();
                    break;
                }
                case TokenType::eof:
                    return body;
                default:
                    fail(t, "unexpected '" + describe(t) + "'");
            }
        }
    }

    Body parse_statements(const Names& end_names, bool drop_needle) {
        skip_op(":");
        expect_block_end();
        end_stack_.push_back(end_names);
        Body body = subparse(&end_names);
        if (current().type == TokenType::eof) fail_unknown_tag(nullptr, current());
        end_stack_.pop_back();
        if (drop_needle) next();
        return body;
    }

    // jinja2's _fail_ut_eof: what was found, what the parser was looking for, what is open.
    [[noreturn]] void fail_unknown_tag(const std::string* tag, const Token& at) const {
        std::set<std::string> expected;
        for (const Names& names : end_stack_) expected.insert(names.begin(), names.end());
        std::string message = tag ? "Encountered unknown tag '" + *tag + "'." : "Unexpected end of template.";
        if (!end_stack_.empty()) {
            std::string looking;
            for (const std::string& n : end_stack_.back()) looking += (looking.empty() ? "'" : " or '") + n + "'";
            if (tag && expected.count(*tag))
                message +=
                    " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for " +
                    looking + ".";
            else
                message += " Jinja was looking for the following tags: " + looking + ".";
        }
        if (!tag_stack_.empty())
            message += " The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
        fail(at, message);
    }

    void parse_statement(Body& body) {
        const Token& t = current();
        if (t.type != TokenType::name) fail(t, "tag name expected");
        const std::string tag = t.text;
        static const std::set<std::string> kNotImplemented = {"block", "extends",    "include", "import",
                                                              "from",  "autoescape", "call"};
        if (kNotImplemented.count(tag)) unsupported(t, "the '{% " + tag + " %}' tag");
        const Nesting::Level level = nest(t, "{% " + tag + " %}");
        tag_stack_.push_back(tag);
        if (tag == "for")
            body.push_back(parse_for());
        else if (tag == "if")
            body.push_back(parse_if());
        else if (tag == "set")
            body.push_back(parse_set());
        else if (tag == "macro")
            body.push_back(parse_macro());
        else if (tag == "print")
            parse_print(body);
        else if (tag == "with")
            body.push_back(parse_with());
        else if (tag == "filter")
            body.push_back(parse_filter_block());
        else if (tag == "generation")
            body.push_back(parse_generation());
        else if (tag == "break" || tag == "continue")
            body.push_back(parse_loop_control());
        else {
            tag_stack_.pop_back();
            fail_unknown_tag(&tag, t);
        }
        tag_stack_.pop_back();
    }

    StmtPtr parse_for() {
        auto node = std::make_unique<ForStmt>(next().pos);
        node->target = parse_assign_target(true, false, false);
        expect_name("in");
        node->iterable = parse_tuple(false, false, false, false);
        if (skip_name("if")) node->filter = parse_expression(true);
        if (current().is_name("recursive")) unsupported(current(), "a recursive for loop");
        ++loop_depth_;
        node->body = parse_statements({"endfor", "else"}, false);
        --loop_depth_;
        if (next().text == "else") node->else_body = parse_statements({"endfor"}, true);
        return node;
    }

    StmtPtr parse_if() {
        auto node = std::make_unique<IfStmt>(next().pos);
        while (true) {
            ExprPtr test = parse_tuple(false, false, false, false);
            Body body = parse_statements({"elif", "else", "endif"}, false);
            node->branches.emplace_back(std::move(test), std::move(body));
            const Token& t = next();
            if (t.text == "elif") continue;
            if (t.text == "else") node->else_body = parse_statements({"endif"}, true);
            break;
        }
        return node;
    }

    StmtPtr parse_set() {
        const SourcePos pos = next().pos;
        AssignTarget target = parse_assign_target(true, false, true);
        if (skip_op("="))
            return std::make_unique<SetStmt>(pos, std::move(target), parse_tuple(false, true, false, false));
        auto node = std::make_unique<SetBlockStmt>(pos);
        node->target = std::move(target);
        node->filter = parse_filter(nullptr, false);
        node->body = parse_statements({"endset"}, true);
        return node;
    }

    StmtPtr parse_macro() {
        auto node = std::make_unique<MacroStmt>(next().pos);
        node->name = expect_name().text;
        expect_op("(");
        while (!current().is_op(")")) {
            if (!node->params.empty()) expect_op(",");
            if (current().is_op(")")) break;
            MacroParam param;
            param.name = expect_name().text;
            if (skip_op("="))
                param.default_value = parse_expression(true);
            else if (!node->params.empty() && node->params.back().default_value)
                fail(current(), "non-default argument follows default argument");
            node->params.push_back(std::move(param));
        }
        expect_op(")");
        const int saved_depth = loop_depth_;
        loop_depth_ = 0;
        macro_names_.emplace_back();
        node->body = parse_statements({"endmacro"}, true);
        node->catches_varargs = macro_names_.back().count("varargs") > 0;
        node->catches_kwargs = macro_names_.back().count("kwargs") > 0;
        macro_names_.pop_back();
        loop_depth_ = saved_depth;
        return node;
    }

    void parse_print(Body& body) {
        next();
        bool first = true;
        while (current().type != TokenType::block_end) {
            if (!first) expect_op(",");
            first = false;
            ExprPtr e = parse_expression(true);
            body.push_back(std::make_unique<OutputStmt>(e->pos, std::move(e)));
        }
    }

    StmtPtr parse_with() {
        auto node = std::make_unique<WithStmt>(next().pos);
        while (current().type != TokenType::block_end) {
            if (!node->assignments.empty()) expect_op(",");
            AssignTarget target = parse_assign_target(true, false, false);
            expect_op("=");
            node->assignments.emplace_back(std::move(target), parse_expression(true));
        }
        node->body = parse_statements({"endwith"}, true);
        return node;
    }

    StmtPtr parse_filter_block() {
        auto node = std::make_unique<FilterBlockStmt>(next().pos);
        node->filter = parse_filter(nullptr, true);
        node->body = parse_statements({"endfilter"}, true);
        return node;
    }

    StmtPtr parse_generation() {
        auto node = std::make_unique<GenerationStmt>(next().pos);
        node->body = parse_statements({"endgeneration"}, true);
        return node;
    }

    StmtPtr parse_loop_control() {
        const Token& t = next();
        if (loop_depth_ == 0) fail(t, "'" + t.text + "' outside of a for loop");
        return std::make_unique<LoopControlStmt>(t.pos, t.text == "break");
    }

    // ---- assignment targets ----
    AssignTarget parse_assign_target(bool with_tuple, bool name_only, bool with_namespace) {
        if (name_only) {
            const Token& t = expect_name();
            return AssignTarget{AssignTarget::Kind::name, t.text, {}, {}, t.pos};
        }
        ExprPtr e = with_tuple ? parse_tuple(true, true, with_namespace, false) : parse_target_primary(with_namespace);
        return to_target(*e);
    }

    AssignTarget to_target(const Expr& e) const {
        if (e.kind == Expr::Kind::name) {
            const auto& n = static_cast<const NameExpr&>(e);
            if (n.name == "true" || n.name == "false" || n.name == "none" || n.name == "True" || n.name == "False" ||
                n.name == "None")
                fail_at(e.pos, "can't assign to 'const'");
            return AssignTarget{AssignTarget::Kind::name, n.name, {}, {}, e.pos};
        }
        if (e.kind == Expr::Kind::attribute) {  // only made by parse_target_primary: ns.attr
            const auto& a = static_cast<const AttributeExpr&>(e);
            return AssignTarget{AssignTarget::Kind::namespace_attribute,
                                static_cast<const NameExpr&>(*a.object).name,
                                a.attribute,
                                {},
                                e.pos};
        }
        if (e.kind == Expr::Kind::tuple) {
            AssignTarget target{AssignTarget::Kind::tuple, {}, {}, {}, e.pos};
            for (const auto& item : static_cast<const SequenceExpr&>(e).items) target.items.push_back(to_target(*item));
            return target;
        }
        static const char* kNames[] = {"const",   "name",    "list",   "tuple",   "dict",    "getattr",
                                       "getitem", "slice",   "call",   "filter",  "test",    "unary",
                                       "binary",  "logical", "concat", "compare", "condexpr"};
        fail_at(e.pos, std::string("can't assign to '") + kNames[static_cast<int>(e.kind)] + "'");
    }

    [[noreturn]] void fail_at(SourcePos pos, const std::string& message,
                              TemplateError::Kind kind = TemplateError::Kind::syntax) const {
        throw TemplateError(kind, name_, pos, message);
    }

    // ---- expressions ----
    // jinja2 passes its extra end rules to Token.test_any as one tuple argument, which never
    // matches, so `for a, in b` reads `in` as a second target name and then fails. Kept as is.
    bool is_tuple_end() const {
        const Token& t = current();
        return t.type == TokenType::variable_end || t.type == TokenType::block_end || t.is_op(")");
    }

    ExprPtr parse_tuple(bool simplified, bool with_condexpr, bool with_namespace, bool explicit_parentheses) {
        const SourcePos pos = current().pos;
        std::vector<ExprPtr> items;
        bool is_tuple = false;
        while (true) {
            if (!items.empty()) expect_op(",");
            if (is_tuple_end()) break;
            items.push_back(simplified ? parse_target_primary(with_namespace) : parse_expression(with_condexpr));
            if (current().is_op(","))
                is_tuple = true;
            else
                break;
        }
        if (!is_tuple) {
            if (!items.empty()) return std::move(items[0]);
            if (!explicit_parentheses) fail(current(), "Expected an expression, got '" + describe(current()) + "'");
        }
        auto tuple = std::make_unique<SequenceExpr>(Expr::Kind::tuple, pos);
        tuple->items = std::move(items);
        return tuple;
    }

    // A primary in an assignment target: with_namespace allows `ns.attr` (an NSRef in jinja2).
    ExprPtr parse_target_primary(bool with_namespace) {
        if (with_namespace && current().type == TokenType::name && look().is_op(".")) {
            const Token& ns = next();
            next();  // the dot
            return std::make_unique<AttributeExpr>(ns.pos, std::make_unique<NameExpr>(ns.pos, ns.text),
                                                   expect_name().text);
        }
        return parse_primary();
    }

    ExprPtr parse_expression(bool with_condexpr) {
        const Nesting::Level level = nest(current());
        return with_condexpr ? parse_condexpr() : parse_or();
    }

    ExprPtr parse_condexpr() {
        ExprPtr expr = parse_or();
        Nesting::Chain chain(nesting_);
        while (current().is_name("if")) {
            deepen(chain, current());
            const SourcePos pos = next().pos;
            ExprPtr condition = parse_or();
            ExprPtr otherwise = skip_name("else") ? parse_condexpr() : nullptr;
            expr = std::make_unique<ConditionalExpr>(pos, std::move(expr), std::move(condition), std::move(otherwise));
        }
        return expr;
    }

    ExprPtr parse_or() {
        ExprPtr left = parse_and();
        Nesting::Chain chain(nesting_);
        while (current().is_name("or")) {
            deepen(chain, current());
            const SourcePos pos = next().pos;
            left = std::make_unique<LogicalExpr>(pos, false, std::move(left), parse_and());
        }
        return left;
    }

    ExprPtr parse_and() {
        ExprPtr left = parse_not();
        Nesting::Chain chain(nesting_);
        while (current().is_name("and")) {
            deepen(chain, current());
            const SourcePos pos = next().pos;
            left = std::make_unique<LogicalExpr>(pos, true, std::move(left), parse_not());
        }
        return left;
    }

    ExprPtr parse_not() {
        if (current().is_name("not")) {
            const Nesting::Level level = nest(current());
            const SourcePos pos = next().pos;
            ExprPtr operand = parse_not();
            return std::make_unique<UnaryExpr>(pos, UnaryExpr::Op::logical_not, std::move(operand));
        }
        return parse_compare();
    }

    ExprPtr parse_compare() {
        const SourcePos pos = current().pos;
        ExprPtr expr = parse_math1();
        std::unique_ptr<CompareExpr> cmp;
        auto add = [&](CompareExpr::Op op) {
            if (!cmp) cmp = std::make_unique<CompareExpr>(pos, std::move(expr));
            cmp->rest.emplace_back(op, parse_math1());
        };
        while (true) {
            const Token& t = current();
            if (t.is_op("==")) {
                next();
                add(CompareExpr::Op::eq);
            } else if (t.is_op("!=")) {
                next();
                add(CompareExpr::Op::ne);
            } else if (t.is_op("<")) {
                next();
                add(CompareExpr::Op::lt);
            } else if (t.is_op("<=")) {
                next();
                add(CompareExpr::Op::le);
            } else if (t.is_op(">")) {
                next();
                add(CompareExpr::Op::gt);
            } else if (t.is_op(">=")) {
                next();
                add(CompareExpr::Op::ge);
            } else if (t.is_name("in")) {
                next();
                add(CompareExpr::Op::in);
            } else if (t.is_name("not") && look().is_name("in")) {
                next();
                next();
                add(CompareExpr::Op::not_in);
            } else
                break;
        }
        if (cmp) return cmp;
        return expr;
    }

    ExprPtr parse_math1() {
        ExprPtr left = parse_concat();
        Nesting::Chain chain(nesting_);
        while (current().is_op("+") || current().is_op("-")) {
            deepen(chain, current());
            const Token& t = next();
            const auto op = t.text == "+" ? BinaryExpr::Op::add : BinaryExpr::Op::sub;
            left = std::make_unique<BinaryExpr>(t.pos, op, std::move(left), parse_concat());
        }
        return left;
    }

    ExprPtr parse_concat() {
        const SourcePos pos = current().pos;
        ExprPtr first = parse_math2();
        if (!current().is_op("~")) return first;
        auto concat = std::make_unique<ConcatExpr>(pos);
        concat->items.push_back(std::move(first));
        while (skip_op("~")) concat->items.push_back(parse_math2());
        return concat;
    }

    ExprPtr parse_math2() {
        ExprPtr left = parse_pow();
        Nesting::Chain chain(nesting_);
        while (true) {
            const Token& t = current();
            BinaryExpr::Op op;
            if (t.is_op("*"))
                op = BinaryExpr::Op::mul;
            else if (t.is_op("/"))
                op = BinaryExpr::Op::div;
            else if (t.is_op("//"))
                op = BinaryExpr::Op::floordiv;
            else if (t.is_op("%"))
                op = BinaryExpr::Op::mod;
            else
                break;
            deepen(chain, current());
            const SourcePos pos = next().pos;
            left = std::make_unique<BinaryExpr>(pos, op, std::move(left), parse_pow());
        }
        return left;
    }

    ExprPtr parse_pow() {
        ExprPtr left = parse_unary(true);
        Nesting::Chain chain(nesting_);
        while (current().is_op("**")) {
            deepen(chain, current());
            const SourcePos pos = next().pos;
            left = std::make_unique<BinaryExpr>(pos, BinaryExpr::Op::pow, std::move(left), parse_unary(true));
        }
        return left;
    }

    ExprPtr parse_unary(bool with_filter) {
        const Token& t = current();
        ExprPtr node;
        if (t.is_op("-") || t.is_op("+")) {
            const Nesting::Level level = nest(t);
            const auto op = t.text == "-" ? UnaryExpr::Op::negate : UnaryExpr::Op::plus;
            const SourcePos pos = next().pos;
            node = std::make_unique<UnaryExpr>(pos, op, parse_unary(false));
        } else {
            node = parse_primary();
        }
        node = parse_postfix(std::move(node));
        if (with_filter) node = parse_filter_expr(std::move(node));
        return node;
    }

    ExprPtr parse_primary() {
        const Token& t = current();
        switch (t.type) {
            case TokenType::name: {
                next();
                if (t.text == "true" || t.text == "True")
                    return std::make_unique<LiteralExpr>(t.pos, Value::boolean(true));
                if (t.text == "false" || t.text == "False")
                    return std::make_unique<LiteralExpr>(t.pos, Value::boolean(false));
                if (t.text == "none" || t.text == "None") return std::make_unique<LiteralExpr>(t.pos, Value::none());
                if (!macro_names_.empty()) macro_names_.back().insert(t.text);
                return std::make_unique<NameExpr>(t.pos, t.text);
            }
            case TokenType::string: {
                std::string text;
                const SourcePos pos = t.pos;
                while (current().type == TokenType::string) text += next().text;  // "a" "b" is "ab"
                try {
                    return std::make_unique<LiteralExpr>(pos, Value::string(std::move(text)));
                } catch (const EvalError& e) {  // a literal over the value limit
                    fail_at(pos, std::string("string literal: ") + e.what(), TemplateError::Kind::limit);
                }
            }
            case TokenType::integer:
                next();
                return std::make_unique<LiteralExpr>(t.pos, Value::integer(t.int_value));
            case TokenType::floating:
                next();
                return std::make_unique<LiteralExpr>(t.pos, Value::floating(t.float_value));
            default:
                break;
        }
        if (t.is_op("(")) {
            next();
            ExprPtr e = parse_tuple(false, true, false, true);
            expect_op(")");
            return e;
        }
        if (t.is_op("[")) return parse_list();
        if (t.is_op("{")) return parse_dict();
        if (t.type == TokenType::eof) fail(t, "unexpected end of template");
        fail(t, "unexpected '" + describe(t) + "'");
    }

    ExprPtr parse_list() {
        auto list = std::make_unique<SequenceExpr>(Expr::Kind::list, next().pos);
        while (!current().is_op("]")) {
            if (!list->items.empty()) expect_op(",");
            if (current().is_op("]")) break;
            list->items.push_back(parse_expression(true));
        }
        expect_op("]");
        return list;
    }

    ExprPtr parse_dict() {
        auto dict = std::make_unique<DictExpr>(next().pos);
        while (!current().is_op("}")) {
            if (!dict->entries.empty()) expect_op(",");
            if (current().is_op("}")) break;
            ExprPtr key = parse_expression(true);
            expect_op(":");
            dict->entries.emplace_back(std::move(key), parse_expression(true));
        }
        expect_op("}");
        return dict;
    }

    ExprPtr parse_postfix(ExprPtr node) {
        Nesting::Chain chain(nesting_);
        while (true) {
            if (current().is_op(".") || current().is_op("[") || current().is_op("(")) deepen(chain, current());
            if (current().is_op(".") || current().is_op("["))
                node = parse_subscript(std::move(node));
            else if (current().is_op("("))
                node = parse_call(std::move(node));
            else
                return node;
        }
    }

    ExprPtr parse_filter_expr(ExprPtr node) {
        Nesting::Chain chain(nesting_);
        while (true) {
            if (current().is_op("|") || current().is_name("is") || current().is_op("(")) deepen(chain, current());
            if (current().is_op("|"))
                node = parse_filter(std::move(node), false);
            else if (current().is_name("is"))
                node = parse_test(std::move(node));
            else if (current().is_op("("))
                node = parse_call(std::move(node));
            else
                return node;
        }
    }

    // Postfix nodes (a.b, a[b], a(b)) take the position of the expression they extend, so that
    // an error in `messages[0].content.strip()` points at `messages`.
    ExprPtr parse_subscript(ExprPtr node) {
        const Token& t = next();
        const SourcePos pos = node->pos;
        if (t.text == ".") {
            const Token& attr = next();
            if (attr.type == TokenType::name) return std::make_unique<AttributeExpr>(pos, std::move(node), attr.text);
            if (attr.type != TokenType::integer) fail(attr, "expected name or number");
            return std::make_unique<SubscriptExpr>(
                pos, std::move(node), std::make_unique<LiteralExpr>(attr.pos, Value::integer(attr.int_value)));
        }
        std::vector<ExprPtr> args;
        while (!current().is_op("]")) {
            if (!args.empty()) expect_op(",");
            args.push_back(parse_subscribed());
        }
        expect_op("]");
        if (args.size() == 1) return std::make_unique<SubscriptExpr>(pos, std::move(node), std::move(args[0]));
        auto tuple = std::make_unique<SequenceExpr>(Expr::Kind::tuple, pos);
        tuple->items = std::move(args);
        return std::make_unique<SubscriptExpr>(pos, std::move(node), std::move(tuple));
    }

    ExprPtr parse_subscribed() {
        const SourcePos pos = current().pos;
        auto slice = std::make_unique<SliceExpr>(pos);
        if (!skip_op(":")) {
            ExprPtr e = parse_expression(true);
            if (!skip_op(":")) return e;
            slice->start = std::move(e);
        }
        if (!current().is_op(":") && !current().is_op("]") && !current().is_op(","))
            slice->stop = parse_expression(true);
        if (skip_op(":") && !current().is_op("]") && !current().is_op(",")) slice->step = parse_expression(true);
        return slice;
    }

    void parse_call_args(std::vector<ExprPtr>& args, std::vector<KeywordArg>& kwargs) {
        const Token& open = expect_op("(");
        bool require_comma = false;
        while (!current().is_op(")")) {
            if (require_comma) {
                expect_op(",");
                if (current().is_op(")")) break;
            }
            if (current().is_op("*") || current().is_op("**"))
                unsupported(current(), "'*args' and '**kwargs' in calls");
            if (current().type == TokenType::name && look().is_op("=")) {
                std::string key = next().text;
                next();
                kwargs.push_back(KeywordArg{std::move(key), parse_expression(true)});
            } else {
                if (!kwargs.empty()) fail(open, "invalid syntax for function call expression");
                args.push_back(parse_expression(true));
            }
            require_comma = true;
        }
        expect_op(")");
    }

    ExprPtr parse_call(ExprPtr node) {
        const SourcePos pos = node->pos;
        auto call = std::make_unique<CallExpr>(pos, std::move(node));
        parse_call_args(call->args, call->kwargs);
        return call;
    }

    std::string parse_dotted_name() {
        std::string name = expect_name().text;
        while (skip_op(".")) name += "." + expect_name().text;
        return name;
    }

    ExprPtr parse_filter(ExprPtr node, bool start_inline) {
        Nesting::Chain chain(nesting_);
        while (current().is_op("|") || start_inline) {
            deepen(chain, current());
            if (!start_inline) next();
            start_inline = false;
            const Token& name_token = current();
            std::string name = parse_dotted_name();
            auto filter =
                std::make_unique<FilterExpr>(Expr::Kind::filter, name_token.pos, std::move(node), std::move(name));
            if (current().is_op("(")) parse_call_args(filter->args, filter->kwargs);
            node = std::move(filter);
        }
        return node;
    }

    ExprPtr parse_test(ExprPtr node) {
        const SourcePos pos = next().pos;  // 'is'
        const bool negated = skip_name("not");
        const Token& name_token = current();
        std::string name = parse_dotted_name();
        auto test = std::make_unique<FilterExpr>(Expr::Kind::test, name_token.pos, std::move(node), std::move(name));
        const Token& t = current();
        if (t.is_op("(")) {
            parse_call_args(test->args, test->kwargs);
        } else if ((t.type == TokenType::name || t.type == TokenType::string || t.type == TokenType::integer ||
                    t.type == TokenType::floating || t.is_op("[") || t.is_op("{")) &&
                   !t.is_name("else") && !t.is_name("or") && !t.is_name("and")) {
            if (t.is_name("is")) fail(t, "You cannot chain multiple tests with is");
            test->args.push_back(parse_postfix(parse_primary()));
        }
        if (negated) return std::make_unique<UnaryExpr>(pos, UnaryExpr::Op::logical_not, std::move(test));
        return test;
    }

    std::vector<Token> tokens_;
    size_t pos_ = 0;
    const std::string& name_;
    std::vector<Names> end_stack_;
    std::vector<std::string> tag_stack_;
    std::vector<std::set<std::string>> macro_names_;
    int loop_depth_ = 0;
    Nesting nesting_{RenderLimits{}.max_depth};
};

}  // namespace

std::shared_ptr<const Template> parse_template(std::string_view source, std::string name) {
    auto tmpl = std::make_shared<Template>();
    tmpl->name = std::move(name);
    Parser parser(tokenize(source, tmpl->name), tmpl->name);
    tmpl->body = parser.parse();
    check_template(*tmpl);
    return tmpl;
}

}  // namespace fitllm::chat::jinja
