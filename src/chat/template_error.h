#pragma once
// Errors of the chat-template engine. A TemplateError always names the template and the
// line:column of the construct that failed, whether it was found while parsing (a syntax
// error, a construct fitllm does not support) or while rendering (a type error, an undefined
// value used, or the template's own raise_exception).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fitllm/error.h"

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
    };

    TemplateError(Kind kind, std::string template_name, SourcePos pos, std::string detail)
        : Error(template_name + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column) + ": " +
                (kind == Kind::raised ? "template raised: " : "") + detail),
          kind_(kind),
          template_name_(std::move(template_name)),
          pos_(pos),
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
    enum class Kind { runtime, unsupported, raised };
    explicit EvalError(const std::string& message, Kind kind = Kind::runtime)
        : std::runtime_error(message), kind_(kind) {}
    Kind kind() const { return kind_; }

private:
    Kind kind_;
};

}  // namespace jinja
}  // namespace fitllm::chat
