#pragma once
// What the evaluator keeps while it runs a block: the block's variables (a Scope) and the text
// it writes (an Output), both charged to the render's budget (chat/render_budget.h). A scope
// lives exactly as long as the block that made it (a loop pass, a macro call, a with block),
// unless a macro defined in it still needs it.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"
#include "chat/render_budget.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {

// Variables of one scope; lookups fall back to the enclosing scope.
class Scope {
public:
    explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) { charge_.add(kScopeBytes); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
        for (auto& [name, value] : vars_) dispose(value);
    }

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
        charge_.add(kVariableBytes + name.size());
        vars_.emplace_back(name, std::move(value));
    }

    // Set once a macro was defined here: the renderer then keeps the scope until the render ends.
    bool holds_macros = false;

private:
    // A scope's own heap bytes (the object, its control block, its vector) and a variable's.
    static constexpr uint64_t kScopeBytes = 128;
    static constexpr uint64_t kVariableBytes = 96;

    std::shared_ptr<Scope> parent_;
    std::vector<std::pair<std::string, Value>> vars_;
    MeteredBytes charge_;
};
using ScopePtr = std::shared_ptr<Scope>;

// The text a template, a macro call or a set/filter block writes: at most max_output_bytes,
// charged to the render's meter as its buffer grows.
class Output {
public:
    Output() : max_bytes_(active_limits().max_output_bytes) {}

    void append(std::string_view text) {
        if (text_.size() + text.size() > max_bytes_)
            throw EvalError("output of " + limit_text(text_.size() + text.size()) + " is over the render limit of " +
                                limit_text(max_bytes_),
                            EvalError::Kind::limit);
        text_ += text;
        if (text_.capacity() > charged_) {
            charge_.add(text_.capacity() - charged_);
            charged_ = text_.capacity();
        }
    }

    // The text, which stops being charged here (a Value made of it is charged anew).
    std::string take() {
        charge_.reset();
        charged_ = 0;
        return std::move(text_);
    }

private:
    std::string text_;
    uint64_t max_bytes_;
    uint64_t charged_ = 0;
    MeteredBytes charge_;
};

}  // namespace fitllm::chat::jinja
