// Constrained sampling on real models: every output of a schema's grammar ends by itself and parses
// as JSON of the schema's shape, on a tiny generated model (random weights: the grammar does all
// the work) and on the demo model; and on the demo model the grammar's share of a decode step.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "sampling/grammar.h"
#include "sampling/json_schema.h"
#include "sampling/sampler.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

const char* const kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]})",
    R"({"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4})",
    R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "score": {"type": "number", "minimum": -1,
        "maximum": 1}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
        "required": ["ok", "score", "tags"], "additionalProperties": false})",
};

struct Timing {
    double forward = 0.0, sample_grammar = 0.0, sample_plain = 0.0;
    int steps = 0;
    uint64_t misses = 0, hits = 0;
};

// Generates under the schema's grammar (greedy or at temperature 1) and checks what comes out.
void run_schema(model::Model& model, const tokenizer::Tokenizer& tok, ops::ThreadPool& pool,
                const std::shared_ptr<const sampling::GrammarVocab>& vocab, const std::string& prompt_text,
                const char* schema_text, float temperature, uint64_t seed, Timing& t) {
    const json schema = json::parse(schema_text);
    sampling::SamplingParams sp;
    sp.temperature = temperature;
    sp.seed = seed;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sampling::SamplingParams plain_params = sp;
    sp.grammar = sampling::Grammar::parse(sampling::json_schema_to_gbnf(schema));
    sp.grammar_vocab = vocab;
    sampling::Sampler sampler(sp, model.n_vocab());
    sampling::Sampler plain(plain_params, model.n_vocab());
    engine::Session session(model, {.n_ctx = 512, .n_batch = 64}, pool);
    const std::vector<int32_t> prompt = tok.tokenize(prompt_text, true, true);
    std::span<const float> logits = session.feed(prompt);
    std::string out;
    bool ended = false;
    for (int i = 0; i < 300 && !ended; ++i) {
        auto t0 = Clock::now();
        (void)plain.sample(logits);
        auto t1 = Clock::now();
        const int32_t id = sampler.sample(logits);
        auto t2 = Clock::now();
        t.sample_plain += std::chrono::duration<double>(t1 - t0).count();
        t.sample_grammar += std::chrono::duration<double>(t2 - t1).count();
        if (tok.vocab().is_eog(id)) {
            ended = true;
            break;
        }
        out += tok.token_to_piece(id, false);
        const int32_t one[] = {id};
        auto t3 = Clock::now();
        logits = session.feed(one);
        t.forward += std::chrono::duration<double>(Clock::now() - t3).count();
        ++t.steps;
    }
    t.misses += sampler.grammar()->cache_misses();
    t.hits += sampler.grammar()->cache_hits();
    ASSERT_TRUE(ended) << schema_text << "\nno end in 300 tokens: " << out;
    json v;
    ASSERT_NO_THROW(v = json::parse(out)) << out;
    const std::string type = schema["type"];
    EXPECT_EQ(type == "object", v.is_object()) << out;
    EXPECT_EQ(type == "array", v.is_array()) << out;
    if (v.is_object()) {
        for (const auto& r : schema["required"]) {
            EXPECT_TRUE(v.contains(r.get<std::string>())) << out;
        }
    }
}

TEST(GrammarModel, TinyRandomModelFollowsEverySchema) {
    const auto path = test::source_dir() / "tests" / "model" / "data" / "tiny-llama-q8_0.gguf";
    const gguf::GgufFile file = gguf::GgufFile::open(path.string());
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(file);
    const auto model = model::Model::load(file);
    ops::ThreadPool pool{2};
    const auto vocab = sampling::GrammarVocab::from_tokenizer(tok);
    Timing t;
    for (const char* schema : kSchemas)
        for (uint64_t seed = 1; seed <= 3; ++seed) run_schema(*model, tok, pool, vocab, "JSON:", schema, 1.0f, seed, t);
}

TEST(GrammarModel, DemoModelFollowsEverySchemaAndTheCostIsSmall) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model not found (scripts/setup.sh assembles it)";
    const gguf::GgufFile file = gguf::GgufFile::open(path->string());
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(file);
    const auto model = model::Model::load(file);
    ops::ThreadPool pool{2};
    const auto b0 = Clock::now();
    const auto vocab = sampling::GrammarVocab::from_tokenizer(tok);
    const double build = std::chrono::duration<double>(Clock::now() - b0).count();
    Timing t;
    const std::string prompt =
        "<start_of_turn>user\nAnswer with JSON only: a person, colors or a test result.<end_of_turn>\n"
        "<start_of_turn>model\n";
    for (const char* schema : kSchemas) {
        run_schema(*model, tok, pool, vocab, prompt, schema, 0.0f, 1, t);
        run_schema(*model, tok, pool, vocab, prompt, schema, 1.0f, 7, t);
    }
    // The worst state for a mask: inside a string, where nearly every token may follow.
    const auto object_grammar = sampling::Grammar::parse(sampling::json_object_gbnf());
    double mask_seconds = 0.0;
    int n_allowed = 0;
    for (int i = 0; i < 5; ++i) {
        sampling::GrammarMatcher m(object_grammar, vocab);
        m.accept_text("{\"key\": \"some ");
        const auto m0 = Clock::now();
        const auto& mask = m.allowed_tokens();
        mask_seconds += std::chrono::duration<double>(Clock::now() - m0).count() / 5;
        n_allowed = 0;
        for (const uint64_t w : mask) n_allowed += __builtin_popcountll(w);
    }
    std::printf("demo model: a mask inside a JSON string (%d of %d tokens allowed) takes %.1f ms\n", n_allowed,
                vocab->size(), mask_seconds * 1e3);
    std::printf("demo model: a json_object matcher is charged %.1f MiB; the grammar vocabulary holds %.1f MiB\n",
                double(sampling::GrammarMatcher::memory_bound(*object_grammar, *vocab)) / (1 << 20),
                double(vocab->memory_bytes()) / (1 << 20));
    const double step = t.forward / t.steps;
    const double extra = (t.sample_grammar - t.sample_plain) / t.steps;
    std::printf(
        "demo model: %d tokens; decode step %.2f ms; sample %.3f ms plain, %.3f ms with the grammar: +%.3f ms "
        "(%.1f%% of a step); masks computed %llu, cached %llu; vocabulary built once in %.0f ms\n",
        t.steps, step * 1e3, t.sample_plain / t.steps * 1e3, t.sample_grammar / t.steps * 1e3, extra * 1e3,
        100.0 * extra / step, static_cast<unsigned long long>(t.misses), static_cast<unsigned long long>(t.hits),
        build * 1e3);
}

}  // namespace
}  // namespace fitllm
