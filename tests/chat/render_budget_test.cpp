// The render budget's parts on their own: the depth counter, the step count, the meter and the
// pool it charges, and which budget is active.
#include "chat/render_budget.h"

#include <gtest/gtest.h>

#include "chat/jinja_value.h"
#include "chat/template_error.h"
#include "memory/device.h"
#include "memory/pool.h"

namespace fitllm::chat::jinja {
namespace {

EvalError::Kind kind_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const EvalError& e) {
        return e.kind();
    }
    ADD_FAILURE() << "no EvalError";
    return EvalError::Kind::runtime;
}

TEST(RenderBudget, NestingCountsLevelsAndGivesThemBack) {
    Nesting nesting(3);
    {
        const Nesting::Level a = nesting.enter();
        const Nesting::Level b = nesting.enter();
        EXPECT_EQ(nesting.depth(), 2u);
        {
            Nesting::Chain chain(nesting);
            chain.add();
            EXPECT_EQ(nesting.depth(), 3u);
            EXPECT_EQ(kind_of([&] { chain.add(); }), EvalError::Kind::limit);
            EXPECT_EQ(kind_of([&] { const Nesting::Level c = nesting.enter(); }), EvalError::Kind::limit);
        }
        EXPECT_EQ(nesting.depth(), 2u);
    }
    EXPECT_EQ(nesting.depth(), 0u);
    try {
        Nesting none(0);
        const Nesting::Level a = none.enter("value");
        FAIL();
    } catch (const EvalError& e) {
        EXPECT_STREQ(e.what(), "value nested too deeply (the limit is 0 levels)");
    }
}

TEST(RenderBudget, StepsStopAtTheLimit) {
    RenderBudget budget(RenderLimits{.max_steps = 10});
    budget.step(10);
    EXPECT_EQ(budget.steps(), 10u);
    try {
        budget.step();
        FAIL();
    } catch (const EvalError& e) {
        EXPECT_EQ(e.kind(), EvalError::Kind::limit);
        EXPECT_STREQ(e.what(), "over the render limit of 10 steps");
    }
}

TEST(RenderBudget, ValuesChargeTheActiveBudgetWhileTheyLive) {
    const RenderBudget budget;
    EXPECT_EQ(RenderBudget::active(), &budget);
    EXPECT_EQ(budget.live_bytes(), 0u);
    {
        const Value s = Value::string(std::string(100000, 'x'));
        const Value copy = s;  // shared, charged once
        EXPECT_GE(budget.live_bytes(), 100000u);
        EXPECT_LT(budget.live_bytes(), 100200u);
        const Value list = Value::list(ValueList(1000, s));
        EXPECT_GE(budget.live_bytes(), 100000u + 1000 * sizeof(Value));
    }
    EXPECT_EQ(budget.live_bytes(), 0u);
    EXPECT_GE(budget.peak_live_bytes(), 100000u + 1000 * sizeof(Value));
}

TEST(RenderBudget, BudgetsNestAndTheInnermostIsActive) {
    EXPECT_EQ(RenderBudget::active(), nullptr);
    Value outer_value;
    {
        const RenderBudget outer;
        {
            const RenderBudget inner(RenderLimits{.max_value_bytes = 10});
            EXPECT_EQ(RenderBudget::active(), &inner);
            EXPECT_EQ(active_limits().max_value_bytes, 10u);
            EXPECT_EQ(kind_of([] { Value::string("more than ten bytes"); }), EvalError::Kind::limit);
        }
        EXPECT_EQ(RenderBudget::active(), &outer);
        outer_value = Value::string(std::string(1000, 'y'));
        EXPECT_GT(outer.live_bytes(), 1000u);
    }
    EXPECT_EQ(RenderBudget::active(), nullptr);
    outer_value = Value();  // outlived its budget: gives its bytes back to a meter nobody reads
    EXPECT_EQ(active_limits().max_value_bytes, RenderLimits{}.max_value_bytes);
}

TEST(RenderBudget, ThePoolIsChargedInQuantaAndGivenEverythingBack) {
    memory::Device host("host", uint64_t{8} << 20);
    memory::Pool& pool = host.pool("chat");
    {
        const RenderBudget budget({}, &pool);
        const Value a = Value::string(std::string(1000, 'a'));
        EXPECT_EQ(pool.live(), uint64_t{256} << 10);  // one quantum
        {
            const Value big = Value::string(std::string(3u << 20, 'b'));
            EXPECT_EQ(pool.live(), uint64_t{13} << 18);  // 3 MiB and a bit: 13 quanta
        }
        EXPECT_LE(pool.live(), uint64_t{512} << 10);  // given back but a quantum of slack
        try {
            const Value too_big = Value::string(std::string(9u << 20, 'c'));
            FAIL();
        } catch (const EvalError& e) {
            EXPECT_EQ(e.kind(), EvalError::Kind::budget);
            ASSERT_NE(e.budget_error(), nullptr);
            EXPECT_EQ(e.budget_error()->pool(), "chat");
        }
    }
    EXPECT_EQ(pool.live(), 0u);
}

TEST(RenderBudget, SizesAreCheckedBeforeTheyAreBuilt) {
    const RenderBudget budget(RenderLimits{.max_value_bytes = 1000});
    EXPECT_NO_THROW(check_value_size(uint64_t{1000}, "string"));
    EXPECT_EQ(kind_of([] { check_value_size(uint64_t{1001}, "string"); }), EvalError::Kind::limit);
    EXPECT_EQ(kind_of([] { check_value_size(int64_t{101}, 10, "width"); }), EvalError::Kind::limit);
    EXPECT_NO_THROW(check_value_size(int64_t{-5}, 10, "width"));  // negative: nothing to build
    EXPECT_NO_THROW(check_value_size(int64_t{100}, 10, "width"));
    std::string out(990, 'x');
    append_within_limit(out, "0123456789");
    EXPECT_EQ(kind_of([&] { append_within_limit(out, "!"); }), EvalError::Kind::limit);
    EXPECT_EQ(out.size(), 1000u);
}

TEST(RenderBudget, LimitText) {
    EXPECT_EQ(limit_text(1), "1 byte");
    EXPECT_EQ(limit_text(300), "300 bytes");
    EXPECT_EQ(limit_text(16u << 20), "16 MiB");
    EXPECT_EQ(limit_text(uint64_t{3} << 29), "1.5 GiB");
}

TEST(RenderBudget, DestroyingADeeplyNestedValueDoesNotRecurse) {
    Value v = Value::list({});
    for (int i = 0; i < 200'000; ++i) v = Value::list({v});  // recursing, this would overflow the stack
    v = Value();
    Dict d;
    for (int i = 0; i < 100; ++i) d.set(Value::integer(i), Value::integer(i));
    EXPECT_EQ(d.find(Value::floating(42.0))->as_int(), 42);  // 42.0 == 42, also through the index
    EXPECT_EQ(d.find(Value::boolean(true))->as_int(), 1);
    EXPECT_EQ(d.find(Value::floating(42.5)), nullptr);
}

}  // namespace
}  // namespace fitllm::chat::jinja
