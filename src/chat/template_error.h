#pragma once
// Errors of the chat-template engine. A TemplateError always names the template and the
// line:column of the construct that failed, whether it was found while parsing (a syntax
// error, a construct fitllm does not support) or while rendering (a type error, an undefined
// value used, a render limit reached, or the template's own raise_exception). When the memory
// pool a render is charged to refuses, the render ends with a memory::BudgetError instead,
// its message prefixed with the same location.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "fitllm/error.h"
#include "memory/device.h"

namespace fitllm::chat {

// 1-based line and column; columns count code points, not bytes.
struct SourcePos {
    uint32_t line = 1;
    uint32_t column = 1;
};

class TemplateError : public Error {
public:
    enum class Kind {
        syntax,       // the template is not valid Jinja
        unsupported,  // valid Jinja that fitllm does not implement
        runtime,      // rendering failed (jinja2 would raise too)
        raised,       // the template called raise_exception(message)
        limit,        // a render limit (chat/render_budget.h): too deep, too many steps, too large
    };

    TemplateError(Kind kind, std::string template_name, SourcePos pos, std::string detail)
        : Error(template_name + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column) + ": " +
                (kind == Kind::raised ? "template raised: " : "") + detail),
          kind_(kind),
          template_name_(std::move(template_name)),
          pos_(pos),
          detail_(std::move(detail)) {}

    // An error in what a render was given (the messages, the extra context) rather than in the
    // template itself: no position, line() and column() are 0.
    TemplateError(Kind kind, std::string template_name, std::string detail)
        : Error(template_name + ": " + detail),
          kind_(kind),
          template_name_(std::move(template_name)),
          pos_{0, 0},
          detail_(std::move(detail)) {}

    Kind kind() const { return kind_; }
    const std::string& template_name() const { return template_name_; }
    SourcePos pos() const { return pos_; }
    uint32_t line() const { return pos_.line; }
    uint32_t column() const { return pos_.column; }
    // The message without the location: for Kind::raised, exactly what the template passed.
    const std::string& detail() const { return detail_; }

private:
    Kind kind_;
    std::string template_name_;
    SourcePos pos_;
    std::string detail_;
};

namespace jinja {

// Thrown by value operations that do not know where in the template they run; the evaluator
// catches it at the innermost node and rethrows it as a TemplateError with that node's position.
class EvalError : public std::runtime_error {
public:
    // limit: a render limit; budget: the memory pool refused (budget_error() says how).
    enum class Kind { runtime, unsupported, raised, limit, budget };
    explicit EvalError(const std::string& message, Kind kind = Kind::runtime)
        : std::runtime_error(message), kind_(kind) {}
    explicit EvalError(const memory::BudgetError& refused)
        : std::runtime_error(refused.what()),
          kind_(Kind::budget),
          budget_error_(std::make_shared<memory::BudgetError>(refused)) {}
    Kind kind() const { return kind_; }
    // Errors the template cannot catch or defer (a generator's error waits until it is
    // iterated; these end the render where they happen).
    bool is_fatal() const { return kind_ == Kind::limit || kind_ == Kind::budget; }
    const memory::BudgetError* budget_error() const { return budget_error_.get(); }

private:
    Kind kind_;
    std::shared_ptr<const memory::BudgetError> budget_error_;
};

}  // namespace jinja
}  // namespace fitllm::chat
