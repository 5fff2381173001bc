#include "chat/render_budget.h"

#include <cstdio>

#include "chat/template_error.h"
#include "memory/pool.h"

namespace fitllm::chat::jinja {
namespace {

thread_local RenderBudget* t_active = nullptr;

// The pool is charged in steps of this many bytes, so that it is not asked for every string.
constexpr uint64_t kPoolQuantum = uint64_t{256} << 10;

const RenderLimits& default_limits() {
    static const RenderLimits kDefaults;
    return kDefaults;
}

}  // namespace

std::string limit_text(uint64_t bytes) {
    static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
    double v = static_cast<double>(bytes) / 1024;
    int unit = 0;
    while (v >= 1024 && unit < 3) {
        v /= 1024;
        ++unit;
    }
    char buf[32];
    if (v == static_cast<double>(static_cast<uint64_t>(v)))
        std::snprintf(buf, sizeof buf, "%llu %s", static_cast<unsigned long long>(v), kUnits[unit]);
    else
        std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[unit]);
    return buf;
}

RenderBudget::RenderBudget(const RenderLimits& limits, memory::Pool* pool)
    : limits_(limits), meter_(std::make_shared<Meter>(limits, pool)), enclosing_(t_active) {
    t_active = this;
}

RenderBudget::~RenderBudget() {
    t_active = enclosing_;
    meter_->detach();
}

RenderBudget* RenderBudget::active() {
    return t_active;
}

uint64_t RenderBudget::live_bytes() const {
    return meter_->live();
}

uint64_t RenderBudget::peak_live_bytes() const {
    return meter_->peak();
}

void RenderBudget::fail_steps() const {
    throw EvalError("over the render limit of " + std::to_string(limits_.max_steps) + " steps", EvalError::Kind::limit);
}

void RenderBudget::Meter::charge(uint64_t bytes) {
    const uint64_t live = live_ + bytes;
    if (live > limits_.max_live_bytes)
        throw EvalError("the render's values would hold " + limit_text(live) + ", over the render limit of " +
                            limit_text(limits_.max_live_bytes),
                        EvalError::Kind::limit);
    if (pool_ && live > reserved_) {
        const uint64_t target = (live + kPoolQuantum - 1) / kPoolQuantum * kPoolQuantum;
        try {
            pool_->reserve(target - reserved_, "chat template rendering");
        } catch (const memory::BudgetError& e) {
            throw EvalError(e);
        }
        reserved_ = target;
    }
    live_ = live;
    if (live_ > peak_) peak_ = live_;
}

void RenderBudget::Meter::release(uint64_t bytes) noexcept {
    live_ -= bytes < live_ ? bytes : live_;
    // Give the pool back what is well above the live bytes, keeping one quantum of slack.
    if (pool_ && reserved_ > live_ + 2 * kPoolQuantum) {
        const uint64_t target = (live_ + kPoolQuantum - 1) / kPoolQuantum * kPoolQuantum + kPoolQuantum;
        pool_->release(reserved_ - target);
        reserved_ = target;
    }
}

void RenderBudget::Meter::detach() noexcept {
    if (pool_ && reserved_ > 0) pool_->release(reserved_);
    reserved_ = 0;
    pool_ = nullptr;
}

void MeteredBytes::add(uint64_t bytes) {
    RenderBudget* budget = RenderBudget::active();
    if (!budget || bytes == 0) return;
    budget->step(bytes / 64);
    budget->meter()->charge(bytes);
    if (!meter_) meter_ = budget->meter();
    bytes_ += bytes;
}

void MeteredBytes::reset() noexcept {
    if (meter_) meter_->release(bytes_);
    meter_.reset();
    bytes_ = 0;
}

const RenderLimits& active_limits() {
    return t_active ? t_active->limits() : default_limits();
}

void check_value_size(uint64_t bytes, std::string_view what) {
    if (bytes > active_limits().max_value_bytes) fail_value_size(what, "of " + limit_text(bytes));
}

void check_value_size(int64_t count, uint64_t unit_bytes, std::string_view what) {
    if (count <= 0 || unit_bytes == 0) return;
    if (static_cast<uint64_t>(count) > active_limits().max_value_bytes / unit_bytes)
        fail_value_size(what, std::to_string(count));
}

void fail_value_size(std::string_view what, std::string_view amount) {
    throw EvalError(std::string(what) + " " + std::string(amount) + " is over the render limit of " +
                        limit_text(active_limits().max_value_bytes) + " for one value",
                    EvalError::Kind::limit);
}

void append_within_limit(std::string& out, std::string_view piece) {
    const uint64_t limit = active_limits().max_value_bytes;
    if (out.size() + piece.size() > limit)
        throw EvalError("a string over the render limit of " + limit_text(limit) + " for one value",
                        EvalError::Kind::limit);
    out += piece;
}

void Nesting::fail(std::string_view what) const {
    throw EvalError(depth_message(what, max_depth_), EvalError::Kind::limit);
}

void Nesting::Chain::add(std::string_view what) {
    if (nesting_.depth_ >= nesting_.max_depth_)
        throw EvalError(depth_message(what, nesting_.max_depth_), EvalError::Kind::limit);
    ++nesting_.depth_;
    ++taken_;
}

std::string depth_message(std::string_view what, uint32_t max_depth) {
    if (!what.empty())
        return std::string(what) + " nested too deeply (the limit is " + std::to_string(max_depth) + " levels)";
    return "nested too deeply (the limit is " + std::to_string(max_depth) +
           " levels of statements, expressions and macro calls)";
}

}  // namespace fitllm::chat::jinja
