// fitllm perplexity -m MODEL -f TEXT [-c 512] [-b 512] [--chunks N] [-t N] [-np N] [KV options]
//                   [--kl-divergence-base FILE [--kl-divergence]]
#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generation_options.h"
#include "cli/run_budget.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "runtime/kl_divergence.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::cli {
namespace {

// As llama-perplexity --kl-divergence ends.
void print_kl_stats(const runtime::KlStats& s, const runtime::PerplexityResult& r, int top_k) {
    std::printf("\n====== Perplexity statistics ======\n");
    std::printf("Mean PPL(Q)                   : %10.6f \u00b1 %10.6f\n", r.ppl, r.ppl_error);
    std::printf("Mean PPL(base)                : %10.6f\n", s.base_ppl);
    std::printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f \u00b1 %10.6f\n", s.ln_ppl_ratio, s.ln_ppl_ratio_error);
    const double ratio = std::exp(s.ln_ppl_ratio);
    std::printf("Mean PPL(Q)/PPL(base)         : %10.6f \u00b1 %10.6f\n", ratio, ratio * s.ln_ppl_ratio_error);
    std::printf("\n====== KL divergence statistics (each token's base top %d + the rest) ======\n", top_k);
    std::printf("Mean    KLD: %10.6f \u00b1 %10.6f\n", s.mean_kl, s.mean_kl_error);
    std::printf("Maximum KLD: %10.6f\n", s.max_kl);
    std::printf("99.0%%   KLD: %10.6f\n", s.p99_kl);
    std::printf("Median  KLD: %10.6f\n", s.median_kl);
    std::printf("\n====== Token probability statistics ======\n");
    std::printf("Same top p: %6.3f \u00b1 %5.3f %%\n", 100.0 * s.same_top, 100.0 * s.same_top_error);
}

}  // namespace

int run_perplexity(const std::vector<std::string>& args) {
    std::string model_path;
    std::string text_path;
    int n_ctx = 512;
    int n_batch = 512;
    int n_chunks = -1;
    int n_threads = 0;
    int n_seq = 1;
    std::string kl_base_path;
    bool kl_compare = false;
    runtime::SessionParams kv_params;  // the KV options' target
    ArgParser p(
        "fitllm perplexity -m MODEL -f TEXT [-c 512] [-b 512] [--chunks N] [-t N] [-np N] [-ctk TYPE] [-ctv TYPE] "
        "[--no-kv-rotation] [--mem SIZE] [--fit] [--mlock] [--stream-layers N] [--kl-divergence-base FILE "
        "[--kl-divergence]]",
        "Perplexity of the model over a text file, computed as llama.cpp's llama-perplexity does:\n"
        "chunks of -c tokens, each from an empty cache and starting with BOS, the second half\n"
        "of each chunk scored. Prints the running value per chunk ([1]12.34,[2]...) and\n"
        "'Final estimate: PPL = X +/- E'. The text needs at least 2 * c tokens.\n"
        "KL divergence from a reference run, as llama-perplexity's: run once with\n"
        "--kl-divergence-base FILE to store each scored token's distribution (its top 64 tokens\n"
        "and the rest of the mass, ~0.8 KiB a token), then again with the same -f, -c and --chunks\n"
        "(other KV types, -np, ...) plus --kl-divergence to compare: mean / median / 99% / max KL,\n"
        "'Same top p' and the PPL ratio.");
    p.option("-m, --model", "MODEL", "the GGUF model", &model_path);
    p.option("-f, --file", "TEXT", "the text file to score", &text_path);
    p.option("-c, --ctx-size", "N", "tokens per chunk (default 512)", &n_ctx);
    p.option("-b, --batch-size", "N", "tokens per forward pass in the unscored half (default 512)", &n_batch);
    p.option("--chunks", "N", "score at most N chunks (default: all)", &n_chunks);
    p.option("-t, --threads", "N", "threads (default: the physical cores)", &n_threads);
    p.option(
        "-np, --parallel", "N",
        "evaluate N chunks at once, one sequence each (default 1; the batches are split between them, which moves the "
        "result in the last digits: kernels follow llama.cpp's batch-size-dependent arithmetic)",
        &n_seq);
    p.option("--kl-divergence-base", "FILE",
             "write each scored token's top-64 log-probs to FILE (written atomically); with --kl-divergence: read "
             "FILE and compare",
             &kl_base_path);
    p.flag("--kl-divergence", &kl_compare,
           "compare this run's distributions with --kl-divergence-base FILE's: KL divergence, same top token, PPL "
           "ratio");
    add_kv_options(p, kv_params);
    MemoryOptions memory_options;
    add_memory_options(p, memory_options);
    if (!p.parse(args)) return 0;
    if (model_path.empty()) throw UsageError("-m MODEL is required");
    if (text_path.empty()) throw UsageError("-f TEXT is required");
    if (n_ctx < 4) throw UsageError("-c: " + std::to_string(n_ctx) + " must be at least 4");
    if (n_batch < 1) throw UsageError("-b: " + std::to_string(n_batch) + " must be positive");
    if (n_seq < 1 || n_seq > kv::kMaxSequences) {
        throw UsageError("-np: " + std::to_string(n_seq) + " must be in 1.." + std::to_string(kv::kMaxSequences));
    }
    if (kl_compare && kl_base_path.empty()) {
        throw UsageError("--kl-divergence needs --kl-divergence-base FILE (the base run's file to compare with)");
    }
    // Read before loading anything, so a foreign or truncated file is refused at once.
    std::optional<runtime::KlBaseReader> kl_base;
    if (kl_compare) kl_base.emplace(runtime::KlBaseReader::open(kl_base_path));

    std::ifstream in(text_path, std::ios::binary);
    if (!in) throw UsageError("-f: cannot open '" + text_path + "'");
    std::stringstream text;
    text << in.rdbuf();

    gguf::GgufFile file = gguf::GgufFile::open(model_path);
    runtime::PerplexityParams pp;
    pp.n_ctx = n_ctx;
    pp.n_batch = n_batch;
    pp.n_chunks = n_chunks;
    pp.n_seq = n_seq;
    // The cache and logits runtime::perplexity() makes (at most n_seq chunks at once).
    const int ctx_batch = std::max(1, n_batch / n_seq);
    const int score_batch = std::max(1, std::min(pp.score_batch / n_seq, n_ctx - n_ctx / 2));
    memory::PlanParams planned = session_plan_params(kv_params, n_threads);
    planned.n_ctx = n_ctx * n_seq;
    planned.n_seq = n_seq;
    planned.n_batch = n_seq * std::max(ctx_batch, score_batch);
    planned.n_outputs = n_seq * score_batch;
    std::optional<RunBudget> budget =
        RunBudget::prepare("perplexity", file, planned, memory_options, ContextMayShrink::no);
    if (!budget) return kExitDoesNotFit;
    kv_params.type_k = budget->plan().params.type_k;
    kv_params.type_v = budget->plan().params.type_v;
    pp.device = &budget->device();
    const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::from_gguf(file);
    const auto model = budget->load_model(file);
    const std::vector<tokenizer::TokenId> tokens = tokenizer.tokenize(text.str(), /*add_special=*/true, false);
    if (static_cast<int64_t>(tokens.size()) < 2 * int64_t{n_ctx}) {
        throw UsageError(text_path + " has " + std::to_string(tokens.size()) + " tokens; -c " + std::to_string(n_ctx) +
                         " needs at least " + std::to_string(2 * n_ctx) + " (a longer text or a smaller -c)");
    }

    pp.type_k = kv_params.type_k;
    pp.type_v = kv_params.type_v;
    pp.kv_rotation = kv_params.kv_rotation;
    pp.kv_spill_dir = kv_params.kv_spill_dir;
    pp.kv_resident_limit = kv_params.kv_resident_limit;
    const tokenizer::Vocab& vocab = tokenizer.vocab();
    if (vocab.add_bos() && vocab.valid(vocab.special().bos)) pp.bos = vocab.special().bos;

    const runtime::KlHeader kl_header = runtime::kl_header(model->n_vocab(), tokens, pp);
    std::optional<runtime::KlBaseWriter> kl_writer;
    std::optional<runtime::KlComparison> kl_comparison;
    runtime::ScoredTokenFn on_token;
    if (kl_base) {
        kl_base->check(kl_header);
        kl_comparison.emplace(*kl_base);
        on_token = [&](int64_t index, std::span<const float> logits, double lp) {
            kl_comparison->add(index, logits, lp);
        };
    } else if (!kl_base_path.empty()) {
        kl_writer.emplace(kl_base_path, kl_header);
        on_token = [&](int64_t index, std::span<const float> logits, double lp) { kl_writer->add(index, logits, lp); };
    }

    ops::ThreadPool pool(n_threads);
    const int64_t n_avail = static_cast<int64_t>(tokens.size()) / n_ctx;
    std::fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %d, threads %d, KV cache %s, %d at once\n",
                 tokens.size(), static_cast<long long>(n_chunks < 0 ? n_avail : std::min<int64_t>(n_chunks, n_avail)),
                 n_ctx, pool.size(), describe_kv(kv_params).c_str(), n_seq);
    const runtime::PerplexityResult r = runtime::perplexity(
        *model, tokens, pp, pool,
        [](int chunk, double ppl) {
            std::printf("[%d]%.4f,", chunk, ppl);
            std::fflush(stdout);
        },
        on_token);
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_error);
    if (kl_writer) {
        kl_writer->finish(r.mean_nll);
        std::fprintf(stderr, "KL base: %lld scored tokens' top %d written to %s\n",
                     static_cast<long long>(kl_header.n_scored), kl_header.top_k, kl_base_path.c_str());
    }
    if (kl_comparison) print_kl_stats(kl_comparison->stats(), r, kl_header.top_k);
    std::fprintf(stderr, "peak RSS %.1f MiB | %s\n", peak_rss_kib() / 1024.0, budget->peak_summary().c_str());
    return 0;
}

}  // namespace fitllm::cli
