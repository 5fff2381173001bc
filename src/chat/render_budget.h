#pragma once
// What one render of a chat template may use, and the meter that holds it to that. Templates
// come from model files, so a template is untrusted code: every render runs under limits that
// no real template comes near (tests/chat/fixtures render far below them), checked where the
// cost arises rather than per filter:
//  - depth: statements, expressions and macro calls nest at most max_depth deep (the parser,
//    the checker and the evaluator count the same way), and so do the values a render walks
//    (repr, tojson, ==, sorting), so neither the stack nor the time of a render can run away;
//  - steps: each statement, expression and loop pass is a step, and a built-in charges one
//    more per 64 bytes (or 8 items) of the values it reads or builds;
//  - bytes: no value (a string, a list, a dict) and no width, repeat count or fill may pass
//    max_value_bytes; the rendered text (and a macro's or block's output) no more than
//    max_output_bytes; all values alive at once no more than max_live_bytes, which is also
//    charged to a memory::Pool when the caller gives one.
// Going past a limit is an EvalError of Kind::limit; the evaluator turns it into a TemplateError
// naming the construct and its line. A pool that refuses is a memory::BudgetError.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace fitllm::memory {
class Pool;
}

namespace fitllm::chat {

struct RenderLimits {
    uint32_t max_depth = 256;
    uint64_t max_steps = 20'000'000;
    uint64_t max_value_bytes = uint64_t{16} << 20;
    uint64_t max_output_bytes = uint64_t{64} << 20;
    uint64_t max_live_bytes = uint64_t{256} << 20;
};

namespace jinja {

// "16 MiB", "1.5 GiB", "300 bytes": limits and sizes for messages.
std::string limit_text(uint64_t bytes);

// The meter of one render (or of one parse's constant folding). While it lives it is the
// active budget of its thread: values made on that thread charge it, and the free functions
// below read its limits. Budgets nest (the innermost is active) and must be destroyed in the
// reverse order of their creation, on the thread that made them.
class RenderBudget {
public:
    // pool: charged with the live bytes (rounded up to 256 KiB) while the render runs; may be null.
    explicit RenderBudget(const RenderLimits& limits = {}, memory::Pool* pool = nullptr);
    ~RenderBudget();
    RenderBudget(const RenderBudget&) = delete;
    RenderBudget& operator=(const RenderBudget&) = delete;

    // The budget of the render running on this thread, or null.
    static RenderBudget* active();

    const RenderLimits& limits() const { return limits_; }

    // Counts n steps; EvalError (Kind::limit) past max_steps.
    void step(uint64_t n = 1) {
        steps_ += n;
        if (steps_ > limits_.max_steps) fail_steps();
    }
    uint64_t steps() const { return steps_; }

    // The meter that value payloads charge: shared, so that a payload that outlives the render
    // (it should not) still has something to give its bytes back to.
    class Meter;
    const std::shared_ptr<Meter>& meter() const { return meter_; }
    uint64_t live_bytes() const;
    uint64_t peak_live_bytes() const;

private:
    [[noreturn]] void fail_steps() const;

    RenderLimits limits_;
    uint64_t steps_ = 0;
    std::shared_ptr<Meter> meter_;
    RenderBudget* enclosing_;
};

class RenderBudget::Meter {
public:
    Meter(const RenderLimits& limits, memory::Pool* pool) : limits_(limits), pool_(pool) {}
    // Charges bytes now alive, or throws (Kind::limit past max_live_bytes; Kind::budget when
    // the pool refuses) and charges nothing.
    void charge(uint64_t bytes);
    void release(uint64_t bytes) noexcept;
    // Gives the pool back what it holds and stops charging it (the render is over).
    void detach() noexcept;
    uint64_t live() const { return live_; }
    uint64_t peak() const { return peak_; }

private:
    RenderLimits limits_;
    memory::Pool* pool_;
    uint64_t live_ = 0, peak_ = 0, reserved_ = 0;
};

// Bytes charged to the active render's meter for as long as this lives: a value's payload, a
// scope, a block's output. Outside a render it charges nothing.
class MeteredBytes {
public:
    MeteredBytes() = default;
    MeteredBytes(const MeteredBytes&) = delete;
    MeteredBytes& operator=(const MeteredBytes&) = delete;
    ~MeteredBytes() { reset(); }
    // Counts the work of building `bytes` (a step per 64) and charges them; throws, charging
    // nothing, past a limit.
    void add(uint64_t bytes);
    void reset() noexcept;

private:
    std::shared_ptr<RenderBudget::Meter> meter_;
    uint64_t bytes_ = 0;
};

// The limits in force on this thread: the active budget's, or the defaults.
const RenderLimits& active_limits();
// One value (or a width, fill or repeat count) of `bytes`: EvalError (Kind::limit) when it is
// over max_value_bytes. `what` names it: "width", "string", "list", "repeat count", ...
void check_value_size(uint64_t bytes, std::string_view what);
// The same for a size given as an int64 argument (negative counts as zero).
void check_value_size(int64_t count, uint64_t unit_bytes, std::string_view what);
// The error of both: "width 10000000000 is over the render limit of 16 MiB for one value".
[[noreturn]] void fail_value_size(std::string_view what, std::string_view amount);
// Appends to a string being built as one value, within max_value_bytes.
void append_within_limit(std::string& out, std::string_view piece);

// How deep the parser, the checker or the evaluator is in a template (statements, expressions
// and macro calls), or a walk over a value (repr, tojson, ==): each keeps one Nesting and enters
// it once per level, against the same max_depth.
class Nesting {
public:
    explicit Nesting(uint32_t max_depth) : max_depth_(max_depth) {}
    uint32_t depth() const { return depth_; }

    // One level deeper while it lives.
    class Level {
    public:
        ~Level() { --nesting_.depth_; }
        Level(const Level&) = delete;
        Level& operator=(const Level&) = delete;

    private:
        friend class Nesting;
        explicit Level(Nesting& nesting) : nesting_(nesting) {}
        Nesting& nesting_;
    };
    // EvalError (Kind::limit) past max_depth; `what` is "value" for walks over values.
    [[nodiscard]] Level enter(std::string_view what = {}) {
        if (depth_ >= max_depth_) fail(what);
        ++depth_;
        return Level(*this);
    }

    // Levels taken one at a time as a loop nests what it builds (a.b.c, x|f|g, 1 + 2 + 3),
    // all given back when the Chain goes.
    class Chain {
    public:
        explicit Chain(Nesting& nesting) : nesting_(nesting) {}
        ~Chain() { nesting_.depth_ -= taken_; }
        Chain(const Chain&) = delete;
        Chain& operator=(const Chain&) = delete;
        void add(std::string_view what = {});

    private:
        Nesting& nesting_;
        uint32_t taken_ = 0;
    };

private:
    [[noreturn]] void fail(std::string_view what) const;

    uint32_t depth_ = 0;
    uint32_t max_depth_;
};

// "nested too deeply (the limit is 256 levels of statements, expressions and macro calls)", or
// for a walk over a value, "value nested too deeply (the limit is 256 levels)".
std::string depth_message(std::string_view what, uint32_t max_depth);

}  // namespace jinja
}  // namespace fitllm::chat
