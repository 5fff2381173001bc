// fitllm run -m MODEL -p PROMPT [-n N] [-c CTX] [-b N] [-t N] [sampling options] [KV options]
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "engine/drafter.h"
#include "engine/parallel.h"
#include "engine/session.h"
#include "kv/cache.h"
#include "sampling/grammar.h"
#include "sampling/sampler.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::cli {
namespace {

double per_second(int n, double seconds) {
    return seconds > 0.0 ? n / seconds : 0.0;
}

// --lookup or -md: how many drafts the model accepted, and what that saved.
void print_lookup_stats(const char* drafter, const engine::GenerationStats& s, int max_draft) {
    const int plain_passes = s.n_generated - s.n_accepted;  // forward passes of the generated tokens
    std::fprintf(stderr,
                 "%s: %d drafted, %d accepted (%.1f%%) in %d draft passes of up to %d | %d tokens in %d forward "
                 "passes (%.2f tokens/pass)\n",
                 drafter, s.n_drafted, s.n_accepted, s.n_drafted > 0 ? 100.0 * s.n_accepted / s.n_drafted : 0.0,
                 s.n_draft_passes, max_draft, s.n_generated, plain_passes,
                 plain_passes > 0 ? static_cast<double>(s.n_generated) / plain_passes : 0.0);
}

// -np N: the continuations decoded together, printed one after the other.
int run_parallel(engine::Engine& e, const RunOptions& o, const std::vector<tokenizer::TokenId>& ids) {
    const int n_parallel = e.context().n_seq;
    std::vector<sampling::Sampler> samplers;
    const auto grammar_vocab = o.sampling.grammar ? sampling::GrammarVocab::from_tokenizer(e.tokenizer()) : nullptr;
    for (int s = 0; s < n_parallel; ++s) {
        sampling::SamplingParams one = o.sampling;
        one.grammar_vocab = grammar_vocab;
        if (o.sampling.seed != sampling::kRandomSeed) one.seed = o.sampling.seed + static_cast<uint64_t>(s);
        samplers.emplace_back(one, e.model().n_vocab());
    }
    const tokenizer::Vocab& vocab = e.tokenizer().vocab();
    const engine::ParallelResult r = engine::generate_parallel(
        e.model(), e.context(), ids, o.n_predict, samplers, [&](int32_t id) { return vocab.is_eog(id); }, e.threads(),
        &e.host());
    for (int s = 0; s < n_parallel; ++s) {
        tokenizer::Detokenizer detok(e.tokenizer(), /*remove_special=*/false, /*unparse_special=*/false);
        std::string text;
        for (const int32_t id : r.tokens[static_cast<size_t>(s)]) {
            if (!vocab.is_eog(id)) text += detok.feed(id);
        }
        text += detok.flush();
        std::printf("--- sequence %d ---\n%s%s\n", s, o.prompt.c_str(), text.c_str());
    }
    std::fflush(stdout);
    if (r.stats.context_full) {
        std::fprintf(stderr,
                     "fitllm run: the context is full (%d tokens for %d sequences); generation stopped. Use -c for a "
                     "longer one.\n",
                     e.context().n_ctx, n_parallel);
    }
    std::fprintf(stderr,
                 "prompt: %d tokens, %.1f tok/s | generated: %d tokens in %d sequences, %.1f tok/s | threads %d | "
                 "peak RSS %.1f MiB | %s\n",
                 r.stats.n_prompt, per_second(r.stats.n_prompt, r.stats.prompt_seconds), r.stats.n_generated,
                 n_parallel, per_second(r.stats.n_generated, r.stats.generate_seconds), e.threads().size(),
                 peak_rss_kib() / 1024.0, e.peak_summary().c_str());
    return 0;
}

int generate(engine::Engine& e, const RunOptions& o) {
    const std::vector<tokenizer::TokenId> ids = e.tokenizer().tokenize(o.prompt, true, true);
    if (ids.empty()) throw UsageError("-p: the prompt has no tokens");
    const ContextConfig& context = e.context();
    if (static_cast<int>(ids.size()) >= context.n_ctx && !context.context_shift) {
        throw UsageError("the prompt has " + std::to_string(ids.size()) + " tokens; -c " +
                         std::to_string(context.n_ctx) + " leaves no room to generate");
    }
    if (context.n_seq > 1) return run_parallel(e, o, ids);

    engine::Session session(e.model(), context, e.threads(), &e.host());
    sampling::SamplingParams params = o.sampling;
    if (params.grammar) params.grammar_vocab = sampling::GrammarVocab::from_tokenizer(e.tokenizer());
    sampling::Sampler sampler(params, e.model().n_vocab());
    tokenizer::Detokenizer detok(e.tokenizer(), /*remove_special=*/false, /*unparse_special=*/false);
    const tokenizer::Vocab& vocab = e.tokenizer().vocab();

    std::fputs(o.prompt.c_str(), stdout);
    std::fflush(stdout);
    const auto is_eog = [&](int32_t id) { return vocab.is_eog(id); };
    const auto on_token = [&](int32_t id) {
        if (!vocab.is_eog(id)) {
            std::fputs(detok.feed(id).c_str(), stdout);
            std::fflush(stdout);
        }
        return true;
    };
    const std::unique_ptr<engine::Drafter> drafter = make_drafter(e, o.lookup);
    const engine::GenerationStats stats =
        drafter ? session.generate_speculative(ids, o.n_predict, sampler, *drafter, is_eog, on_token)
                : session.generate(ids, o.n_predict, sampler, is_eog, on_token);
    std::fputs(detok.flush().c_str(), stdout);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (stats.context_full) {
        std::fprintf(stderr,
                     "fitllm run: the context is full (%d tokens); generation stopped after %d tokens. Use -c for a "
                     "longer one, or --context-shift to drop the oldest tokens.\n",
                     context.n_ctx, stats.n_generated);
    }
    if (stats.n_shifts > 0) std::fprintf(stderr, "context shifts: %d\n", stats.n_shifts);
    std::fprintf(stderr,
                 "prompt: %d tokens, %.1f tok/s | generated: %d tokens, %.1f tok/s | threads %d | peak RSS %.1f MiB | "
                 "%s\n",
                 stats.n_prompt, per_second(stats.n_prompt, stats.prompt_seconds), stats.n_generated,
                 per_second(stats.n_generated, stats.generate_seconds), e.threads().size(), peak_rss_kib() / 1024.0,
                 e.peak_summary().c_str());
    if (drafter) {
        print_lookup_stats(e.draft() ? "draft model" : "lookup", stats, session.max_draft(drafter->n_draft()));
    }
    if (const auto* m = dynamic_cast<const engine::ModelDrafter*>(drafter.get())) {
        std::fprintf(stderr, "draft model: %lld tokens fed, %lld proposed, %.2f s of the %.2f s of generation\n",
                     static_cast<long long>(m->n_fed()), static_cast<long long>(m->n_proposed()), m->seconds(),
                     stats.generate_seconds);
    }
    return 0;
}

}  // namespace

ArgParser run_parser(RunOptions& o) {
    o.engine.context.n_ctx = 2048;
    o.engine.context.n_batch = 512;
    ArgParser p(
        "fitllm run -m MODEL -p PROMPT [-n N] [-c CTX] [-t N] [--temp T] [--top-k K] [--top-p P] "
        "[--min-p P] [--seed S] [--repeat-penalty R] [-ctk TYPE] [-ctv TYPE] [--no-kv-rotation] "
        "[--context-shift] [--keep N] [-np N] [--lookup | -md FILE] [--draft-max N] [--mem SIZE] [--fit] [--mlock] "
        "[--stream-layers N]",
        "Generate text after PROMPT on the CPU, streaming it as it comes, then print a summary\n"
        "line (tokens and speed of prompt and generation, peak resident memory) to stderr.\n"
        "Control tokens spelled in the prompt (\"<start_of_turn>\") are parsed as such.\n"
        "When the context (-c) is full, generation stops with a message, or with --context-shift\n"
        "drops the oldest half of the tokens after the first --keep N and goes on.\n"
        "With -np N, N continuations of the prompt are decoded together (the prompt's KV cache\n"
        "shared, one token of each per forward pass) and printed one after the other at the end.\n"
        "With --lookup, drafts taken from the prompt and the output so far are checked several\n"
        "tokens per forward pass (speculative decoding): the same text, sooner when it repeats.\n"
        "With -md FILE, a smaller model with the same vocabulary drafts them instead.\n"
        "Before loading, the run is planned (as `fitllm plan`) against --mem: a plan over it is\n"
        "refused (exit status 3) unless --fit may change the settings; what the run allocates is\n"
        "charged to the budget, and the summary shows the peak of each pool.");
    ContextConfig& c = o.engine.context;
    p.option("-m, --model", "MODEL", "the GGUF model to run", &o.engine.load.model_path);
    p.option("-p, --prompt", "PROMPT", "the text to continue", &o.prompt);
    p.option("-n, --n-predict", "N", "tokens to generate at most (default 64)", &o.n_predict);
    p.option("-c, --ctx-size", "N", "context size in tokens, prompt included (default 2048)", &c.n_ctx);
    p.option("-b, --batch-size", "N", "prompt tokens per forward pass (default 512)", &c.n_batch);
    add_threads_option(p, c);
    add_sampling_options(p, o.sampling);
    add_grammar_options(p, o.sampling);
    add_kv_options(p, c);
    add_context_shift_options(p, c);
    p.option("-np, --parallel", "N",
             "decode N continuations together; -c is shared by all, their seeds are --seed + i (default 1)", &c.n_seq);
    add_lookup_options(p, o.lookup);
    add_draft_model_options(p, o.lookup, o.engine);
    add_memory_options(p, o.engine);
    return p;
}

void validate(const RunOptions& o) {
    const ContextConfig& c = o.engine.context;
    if (o.engine.load.model_path.empty()) throw UsageError("-m MODEL is required");
    if (o.prompt.empty()) throw UsageError("-p PROMPT is required");
    if (o.n_predict < 0) throw UsageError("-n: " + std::to_string(o.n_predict) + " must not be negative");
    if (c.n_ctx <= 0) throw UsageError("-c: " + std::to_string(c.n_ctx) + " must be positive");
    if (c.n_batch <= 0) throw UsageError("-b: " + std::to_string(c.n_batch) + " must be positive");
    if (c.n_seq < 1 || c.n_seq > kv::kMaxSequences) {
        throw UsageError("-np: " + std::to_string(c.n_seq) + " must be in 1.." + std::to_string(kv::kMaxSequences));
    }
    if (c.n_seq > 1 && c.context_shift) throw UsageError("--context-shift works with one sequence only");
    validate_sampling_options(o.sampling);
    validate_lookup_options(o.lookup);
    if (o.lookup.enabled && c.n_seq > 1) throw UsageError("--lookup works with one sequence only (not -np)");
    if (!o.lookup.draft_model.empty() && c.n_seq > 1) throw UsageError("-md works with one sequence only (not -np)");
}

int run_run(const std::vector<std::string>& args) {
    return parse_and_run(args, run_parser, [](const RunOptions& options) {
        RunOptions o = options;
        apply_lookup_options(o.lookup, o.engine.context);
        return with_engine("run", o.engine, [&](engine::Engine& e) { return generate(e, o); });
    });
}

}  // namespace fitllm::cli
