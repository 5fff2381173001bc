// fitllm run -m MODEL -p PROMPT [-n N] [-c CTX] [-b N] [-t N] [sampling options] [KV options]
#include <algorithm>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generation_options.h"
#include "cli/run_budget.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "runtime/parallel.h"
#include "runtime/session.h"
#include "sampling/sampler.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::cli {
namespace {

double per_second(int n, double seconds) {
    return seconds > 0.0 ? n / seconds : 0.0;
}

// -np N: the continuations decoded together, printed one after the other.
int run_parallel(model::Model& model, const tokenizer::Tokenizer& tokenizer, const std::string& prompt,
                 const std::vector<tokenizer::TokenId>& ids, int n_predict, int n_parallel,
                 const sampling::SamplingParams& sp, const runtime::SessionParams& params, ops::ThreadPool& pool,
                 const RunBudget& budget) {
    std::vector<sampling::Sampler> samplers;
    for (int s = 0; s < n_parallel; ++s) {
        sampling::SamplingParams one = sp;
        if (sp.seed != sampling::kRandomSeed) one.seed = sp.seed + static_cast<uint64_t>(s);
        samplers.emplace_back(one, model.n_vocab());
    }
    const tokenizer::Vocab& vocab = tokenizer.vocab();
    const runtime::ParallelResult r = runtime::generate_parallel(
        model, params, ids, n_predict, samplers, [&](int32_t id) { return vocab.is_eog(id); }, pool);
    for (int s = 0; s < n_parallel; ++s) {
        tokenizer::Detokenizer detok(tokenizer, /*remove_special=*/false, /*unparse_special=*/false);
        std::string text;
        for (const int32_t id : r.tokens[static_cast<size_t>(s)]) {
            if (!vocab.is_eog(id)) text += detok.feed(id);
        }
        text += detok.flush();
        std::printf("--- sequence %d ---\n%s%s\n", s, prompt.c_str(), text.c_str());
    }
    std::fflush(stdout);
    if (r.stats.context_full) {
        std::fprintf(stderr,
                     "fitllm run: the context is full (%d tokens for %d sequences); generation stopped. Use -c for a "
                     "longer one.\n",
                     params.n_ctx, n_parallel);
    }
    std::fprintf(stderr,
                 "prompt: %d tokens, %.1f tok/s | generated: %d tokens in %d sequences, %.1f tok/s | threads %d | "
                 "peak RSS %.1f MiB | %s\n",
                 r.stats.n_prompt, per_second(r.stats.n_prompt, r.stats.prompt_seconds), r.stats.n_generated,
                 n_parallel, per_second(r.stats.n_generated, r.stats.generate_seconds), pool.size(),
                 peak_rss_kib() / 1024.0, budget.peak_summary().c_str());
    return 0;
}

}  // namespace

int run_run(const std::vector<std::string>& args) {
    std::string model_path;
    std::string prompt;
    int n_predict = 64;
    int n_threads = 0;
    int n_parallel = 1;
    sampling::SamplingParams sp;
    runtime::SessionParams session_params{.n_ctx = 2048, .n_batch = 512};
    int& n_ctx = session_params.n_ctx;
    int& n_batch = session_params.n_batch;
    ArgParser p(
        "fitllm run -m MODEL -p PROMPT [-n N] [-c CTX] [-t N] [--temp T] [--top-k K] [--top-p P] "
        "[--min-p P] [--seed S] [--repeat-penalty R] [-ctk TYPE] [-ctv TYPE] [--no-kv-rotation] "
        "[--context-shift] [--keep N] [-np N] [--mem SIZE] [--fit] [--mlock] [--stream-layers N]",
        "Generate text after PROMPT on the CPU, streaming it as it comes, then print a summary\n"
        "line (tokens and speed of prompt and generation, peak resident memory) to stderr.\n"
        "Control tokens spelled in the prompt (\"<start_of_turn>\") are parsed as such.\n"
        "When the context (-c) is full, generation stops with a message, or with --context-shift\n"
        "drops the oldest half of the tokens after the first --keep N and goes on.\n"
        "With -np N, N continuations of the prompt are decoded together (the prompt's KV cache\n"
        "shared, one token of each per forward pass) and printed one after the other at the end.\n"
        "Before loading, the run is planned (as `fitllm plan`) against --mem: a plan over it is\n"
        "refused (exit status 3) unless --fit may change the settings; what the run allocates is\n"
        "charged to the budget, and the summary shows the peak of each pool.");
    p.option("-m, --model", "MODEL", "the GGUF model to run", &model_path);
    p.option("-p, --prompt", "PROMPT", "the text to continue", &prompt);
    p.option("-n, --n-predict", "N", "tokens to generate at most (default 64)", &n_predict);
    p.option("-c, --ctx-size", "N", "context size in tokens, prompt included (default 2048)", &n_ctx);
    p.option("-b, --batch-size", "N", "prompt tokens per forward pass (default 512)", &n_batch);
    p.option("-t, --threads", "N", "threads (default: the physical cores)", &n_threads);
    add_sampling_options(p, sp);
    add_kv_options(p, session_params);
    add_context_shift_options(p, session_params);
    p.option("-np, --parallel", "N",
             "decode N continuations together; -c is shared by all, their seeds are --seed + i (default 1)",
             &n_parallel);
    MemoryOptions memory_options;
    add_memory_options(p, memory_options);
    if (!p.parse(args)) return 0;

    if (model_path.empty()) throw UsageError("-m MODEL is required");
    if (prompt.empty()) throw UsageError("-p PROMPT is required");
    if (n_predict < 0) throw UsageError("-n: " + std::to_string(n_predict) + " must not be negative");
    if (n_ctx <= 0) throw UsageError("-c: " + std::to_string(n_ctx) + " must be positive");
    if (n_batch <= 0) throw UsageError("-b: " + std::to_string(n_batch) + " must be positive");
    validate_sampling_options(sp);
    validate_context_shift_options(session_params);
    if (n_parallel < 1 || n_parallel > kv::kMaxSequences) {
        throw UsageError("-np: " + std::to_string(n_parallel) + " must be in 1.." + std::to_string(kv::kMaxSequences));
    }
    if (n_parallel > 1 && session_params.context_shift)
        throw UsageError("--context-shift works with one sequence only");

    gguf::GgufFile file = gguf::GgufFile::open(model_path);
    // The cells the cache gets: a context shift needs two blocks more (runtime/session.cpp), and
    // -np one block per sequence (runtime/parallel.cpp).
    const int block = kv::CacheParams{}.block_size;
    const int extra_cells = n_parallel > 1 ? n_parallel * block : session_params.context_shift ? 2 * block : 0;
    memory::PlanParams planned = session_plan_params(session_params, n_threads);
    planned.n_ctx = n_ctx + extra_cells;
    planned.n_seq = n_parallel;
    planned.n_batch = std::max(n_batch, n_parallel);
    std::optional<RunBudget> budget = RunBudget::prepare("run", file, planned, memory_options, ContextMayShrink::yes);
    if (!budget) return kExitDoesNotFit;
    n_ctx = budget->plan().params.n_ctx - extra_cells;
    if (n_ctx < 1)
        throw UsageError("--fit: the context that fits leaves no cells for " + std::to_string(n_parallel) +
                         " sequences; raise --mem or lower -np");
    session_params.type_k = budget->plan().params.type_k;
    session_params.type_v = budget->plan().params.type_v;
    session_params.device = &budget->device();
    const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::from_gguf(file);
    const auto model = budget->load_model(file);
    const std::vector<tokenizer::TokenId> ids = tokenizer.tokenize(prompt, true, true);
    if (ids.empty()) throw UsageError("-p: the prompt has no tokens");
    if (static_cast<int>(ids.size()) >= n_ctx && !session_params.context_shift) {
        throw UsageError("the prompt has " + std::to_string(ids.size()) + " tokens; -c " + std::to_string(n_ctx) +
                         " leaves no room to generate");
    }

    ops::ThreadPool pool(n_threads);
    if (n_parallel > 1)
        return run_parallel(*model, tokenizer, prompt, ids, n_predict, n_parallel, sp, session_params, pool, *budget);
    runtime::Session session(*model, session_params, pool);
    sampling::Sampler sampler(sp, model->n_vocab());
    tokenizer::Detokenizer detok(tokenizer, /*remove_special=*/false, /*unparse_special=*/false);
    const tokenizer::Vocab& vocab = tokenizer.vocab();

    std::fputs(prompt.c_str(), stdout);
    std::fflush(stdout);
    const runtime::GenerationStats stats = session.generate(
        ids, n_predict, sampler, [&](int32_t id) { return vocab.is_eog(id); },
        [&](int32_t id) {
            if (!vocab.is_eog(id)) {
                std::fputs(detok.feed(id).c_str(), stdout);
                std::fflush(stdout);
            }
            return true;
        });
    std::fputs(detok.flush().c_str(), stdout);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (stats.context_full) {
        std::fprintf(stderr,
                     "fitllm run: the context is full (%d tokens); generation stopped after %d tokens. Use -c for a "
                     "longer one, or --context-shift to drop the oldest tokens.\n",
                     n_ctx, stats.n_generated);
    }
    if (stats.n_shifts > 0) std::fprintf(stderr, "context shifts: %d\n", stats.n_shifts);
    std::fprintf(stderr,
                 "prompt: %d tokens, %.1f tok/s | generated: %d tokens, %.1f tok/s | threads %d | peak RSS %.1f MiB | "
                 "%s\n",
                 stats.n_prompt, per_second(stats.n_prompt, stats.prompt_seconds), stats.n_generated,
                 per_second(stats.n_generated, stats.generate_seconds), pool.size(), peak_rss_kib() / 1024.0,
                 budget->peak_summary().c_str());
    return 0;
}

}  // namespace fitllm::cli
