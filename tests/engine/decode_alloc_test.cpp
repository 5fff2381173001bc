// The decode loop allocates nothing per token: after the first step (which sizes the working
// buffers), feeding one token and sampling the next never calls operator new or malloc through
// it, on any thread. Counted by replacing the global operator new for this test binary; the
// counter only runs while a test turns it on.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "ops/thread_pool.h"
#include "quant/ggml_type.h"
#include "sampling/sampler.h"
#include "test_support.h"

// AddressSanitizer brings its own operator new (and checks that every variant is paired with
// its delete), so under it the replacement is left out and the counting tests skip.
#ifndef FITLLM_UNDER_ASAN  // tests/CMakeLists.txt sets it in the sanitizer build
#define FITLLM_UNDER_ASAN 0
#endif
#define FITLLM_COUNT_ALLOCATIONS (!FITLLM_UNDER_ASAN)

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};

[[maybe_unused]] void* counted_alloc(std::size_t n) {
    if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
    throw std::bad_alloc();
}
}  // namespace

#if FITLLM_COUNT_ALLOCATIONS
void* operator new(std::size_t n) {
    return counted_alloc(n);
}
void* operator new[](std::size_t n) {
    return counted_alloc(n);
}
void* operator new(std::size_t n, std::align_val_t a) {
    if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
    const std::size_t align = static_cast<std::size_t>(a);
    if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
    return operator new(n, a);
}
void operator delete(void* p, std::align_val_t) noexcept {
    std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
    std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
    std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
    std::free(p);
}
void operator delete(void* p) noexcept {
    std::free(p);
}
void operator delete[](void* p) noexcept {
    std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
    std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
    std::free(p);
}

#endif  // FITLLM_COUNT_ALLOCATIONS

namespace fitllm {
namespace {

// Runs n_warm decode steps, then counts the allocations of the next n_steps.
long allocations_per_decode(model::Model& model, std::span<const int32_t> prompt, int n_warm, int n_steps,
                            sampling::SamplingParams sp, KvType kv_type = KvType::f16) {
    ops::ThreadPool pool(2);
    engine::Session session(model, {.n_ctx = 256, .n_batch = 64, .type_k = kv_type, .type_v = kv_type}, pool);
    sampling::Sampler sampler(sp, model.n_vocab());
    std::span<const float> logits = session.feed(prompt);
    for (const int32_t id : prompt) sampler.accept(id);
    long counted = 0;
    for (int i = 0; i < n_warm + n_steps; ++i) {
        if (i == n_warm) {
            g_allocations = 0;
            g_counting = true;
        }
        const int32_t next = sampler.sample(logits);
        sampler.accept(next);
        logits = session.feed(std::span<const int32_t>(&next, 1));
    }
    g_counting = false;
    counted = g_allocations.load();
    return counted;
}

TEST(DecodeAllocations, CountingWorks) {
    if (!FITLLM_COUNT_ALLOCATIONS) GTEST_SKIP() << "built with AddressSanitizer, whose operator new is not replaced";
    g_allocations = 0;
    g_counting = true;
    auto p = std::make_unique<std::vector<int>>(100);
    g_counting = false;
    EXPECT_GE(g_allocations.load(), 2);  // the unique_ptr's vector and its buffer
}

TEST(DecodeAllocations, NoneAfterTheFirstStepGreedy) {
    if (!FITLLM_COUNT_ALLOCATIONS) GTEST_SKIP() << "built with AddressSanitizer, whose operator new is not replaced";
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    sampling::SamplingParams sp;
    sp.temperature = 0.0f;
    const std::vector<int32_t> prompt = {2, 9, 4, 33, 17, 8, 1};
    EXPECT_EQ(allocations_per_decode(*model, prompt, 1, 40, sp), 0);
}

TEST(DecodeAllocations, NoneAfterTheFirstStepWithTheFullSamplingChain) {
    if (!FITLLM_COUNT_ALLOCATIONS) GTEST_SKIP() << "built with AddressSanitizer, whose operator new is not replaced";
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    sampling::SamplingParams sp;
    sp.temperature = 0.8f;
    sp.top_k = 20;
    sp.top_p = 0.9f;
    sp.min_p = 0.05f;
    sp.repeat_penalty = 1.1f;
    sp.seed = 7;
    const std::vector<int32_t> prompt = {2, 9, 4, 33, 17, 8, 1};
    EXPECT_EQ(allocations_per_decode(*model, prompt, 1, 40, sp), 0);
}

TEST(DecodeAllocations, NoneAfterTheFirstStepOnTheDemoModel) {
    if (!FITLLM_COUNT_ALLOCATIONS) GTEST_SKIP() << "built with AddressSanitizer, whose operator new is not replaced";
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model not found (scripts/setup.sh assembles it)";
    const gguf::GgufFile file = gguf::GgufFile::open(path->string());
    const auto model = model::Model::load(file);
    sampling::SamplingParams sp;
    sp.temperature = 0.0f;
    const std::vector<int32_t> prompt = {2, 818, 5279, 529, 7001, 563};
    EXPECT_EQ(allocations_per_decode(*model, prompt, 1, 8, sp), 0);
}

// The quantized cache: q quantized for the K dot and rotated, in the same preallocated scratch.
// The K transform is fitted once each layer has stored KvCache::kMinKeyRows rows (this 6-token
// prompt: during the second decode step), and its fit allocates its working memory that once;
// nothing after it.
TEST(DecodeAllocations, NoneAfterTheKeyTransformIsFittedOnTheDemoModelWithAQuantizedCache) {
    if (!FITLLM_COUNT_ALLOCATIONS) GTEST_SKIP() << "built with AddressSanitizer, whose operator new is not replaced";
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model not found (scripts/setup.sh assembles it)";
    const gguf::GgufFile file = gguf::GgufFile::open(path->string());
    const auto model = model::Model::load(file);
    sampling::SamplingParams sp;
    sp.temperature = 0.0f;
    const std::vector<int32_t> prompt = {2, 818, 5279, 529, 7001, 563};
    for (const KvType type : {KvType::q8_0, KvType::q4_0}) {
        EXPECT_EQ(allocations_per_decode(*model, prompt, kv::KvCache::kMinKeyRows, 8, sp, type), 0)
            << kv_type_name(type);
    }
}

}  // namespace
}  // namespace fitllm
