// fitllm perplexity -m MODEL -f TEXT [-c 512] [-b 512] [--chunks N] [-t N] [-np N] [KV options]
//                   [--kl-divergence-base FILE [--kl-divergence]]
#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "engine/kl_divergence.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::cli {
namespace {

// As llama-perplexity --kl-divergence ends.
void print_kl_stats(const engine::KlStats& s, const engine::PerplexityResult& r, int top_k) {
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

ArgParser perplexity_parser(PerplexityOptions& o) {
    ContextConfig& c = o.engine.context;
    c.n_batch = 512;
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
    p.option("-m, --model", "MODEL", "the GGUF model", &o.engine.load.model_path);
    p.option("-f, --file", "TEXT", "the text file to score", &o.text_path);
    p.option("-c, --ctx-size", "N", "tokens per chunk (default 512)", &o.n_ctx);
    p.option("-b, --batch-size", "N", "tokens per forward pass in the unscored half (default 512)", &c.n_batch);
    p.option("--chunks", "N", "score at most N chunks (default: all)", &o.n_chunks);
    add_threads_option(p, c);
    p.option(
        "-np, --parallel", "N",
        "evaluate N chunks at once, one sequence each (default 1; the batches are split between them, which moves the "
        "result in the last digits: kernels follow llama.cpp's batch-size-dependent arithmetic)",
        &o.n_seq);
    p.option("--kl-divergence-base", "FILE",
             "write each scored token's top-64 log-probs to FILE (written atomically); with --kl-divergence: read "
             "FILE and compare",
             &o.kl_base_path);
    p.flag("--kl-divergence", &o.kl_compare,
           "compare this run's distributions with --kl-divergence-base FILE's: KL divergence, same top token, PPL "
           "ratio");
    add_kv_options(p, c);
    add_memory_options(p, o.engine);
    return p;
}

void validate(const PerplexityOptions& o) {
    if (o.engine.load.model_path.empty()) throw UsageError("-m MODEL is required");
    if (o.text_path.empty()) throw UsageError("-f TEXT is required");
    if (o.n_ctx < 4) throw UsageError("-c: " + std::to_string(o.n_ctx) + " must be at least 4");
    if (o.engine.context.n_batch < 1) {
        throw UsageError("-b: " + std::to_string(o.engine.context.n_batch) + " must be positive");
    }
    if (o.n_seq < 1 || o.n_seq > kv::kMaxSequences) {
        throw UsageError("-np: " + std::to_string(o.n_seq) + " must be in 1.." + std::to_string(kv::kMaxSequences));
    }
    if (o.kl_compare && o.kl_base_path.empty()) {
        throw UsageError("--kl-divergence needs --kl-divergence-base FILE (the base run's file to compare with)");
    }
}

namespace {

engine::PerplexityParams perplexity_params(const PerplexityOptions& o) {
    engine::PerplexityParams pp;
    pp.n_ctx = o.n_ctx;
    pp.n_batch = o.engine.context.n_batch;
    pp.n_chunks = o.n_chunks;
    pp.n_seq = o.n_seq;
    return pp;
}

int score(engine::Engine& e, const PerplexityOptions& o, std::optional<engine::KlBaseReader>& kl_base,
          const std::string& text) {
    engine::PerplexityParams pp = perplexity_params(o);
    const tokenizer::Tokenizer& tokenizer = e.tokenizer();
    const std::vector<tokenizer::TokenId> tokens = tokenizer.tokenize(text, /*add_special=*/true, false);
    if (static_cast<int64_t>(tokens.size()) < 2 * int64_t{o.n_ctx}) {
        throw UsageError(o.text_path + " has " + std::to_string(tokens.size()) + " tokens; -c " +
                         std::to_string(o.n_ctx) + " needs at least " + std::to_string(2 * o.n_ctx) +
                         " (a longer text or a smaller -c)");
    }
    const tokenizer::Vocab& vocab = tokenizer.vocab();
    if (vocab.add_bos() && vocab.valid(vocab.special().bos)) pp.bos = vocab.special().bos;

    const engine::KlHeader kl_header = engine::kl_header(e.model().n_vocab(), tokens, pp);
    std::optional<engine::KlBaseWriter> kl_writer;
    std::optional<engine::KlComparison> kl_comparison;
    engine::ScoredTokenFn on_token;
    if (kl_base) {
        kl_base->check(kl_header);
        kl_comparison.emplace(*kl_base);
        on_token = [&](int64_t index, std::span<const float> logits, double lp) {
            kl_comparison->add(index, logits, lp);
        };
    } else if (!o.kl_base_path.empty()) {
        kl_writer.emplace(o.kl_base_path, kl_header);
        on_token = [&](int64_t index, std::span<const float> logits, double lp) { kl_writer->add(index, logits, lp); };
    }

    ops::ThreadPool& pool = e.threads();
    const int64_t n_avail = static_cast<int64_t>(tokens.size()) / o.n_ctx;
    std::fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %d, threads %d, KV cache %s, %d at once\n",
                 tokens.size(),
                 static_cast<long long>(o.n_chunks < 0 ? n_avail : std::min<int64_t>(o.n_chunks, n_avail)), o.n_ctx,
                 pool.size(), engine::describe_kv(e.context()).c_str(), o.n_seq);
    const engine::PerplexityResult r = engine::perplexity(
        e.model(), tokens, pp, e.context(), pool, &e.host(),
        [](int chunk, double ppl) {
            std::printf("[%d]%.4f,", chunk, ppl);
            std::fflush(stdout);
        },
        on_token);
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_error);
    if (kl_writer) {
        kl_writer->finish(r.mean_nll);
        std::fprintf(stderr, "KL base: %lld scored tokens' top %d written to %s\n",
                     static_cast<long long>(kl_header.n_scored), kl_header.top_k, o.kl_base_path.c_str());
    }
    if (kl_comparison) print_kl_stats(kl_comparison->stats(), r, kl_header.top_k);
    std::fprintf(stderr, "peak RSS %.1f MiB | %s\n", peak_rss_kib() / 1024.0, e.peak_summary().c_str());
    return 0;
}

}  // namespace

int run_perplexity(const std::vector<std::string>& args) {
    return parse_and_run(args, perplexity_parser, [](const PerplexityOptions& o) {
        // Read before loading anything, so a foreign or truncated file is refused at once.
        std::optional<engine::KlBaseReader> kl_base;
        if (o.kl_compare) kl_base.emplace(engine::KlBaseReader::open(o.kl_base_path));
        std::ifstream in(o.text_path, std::ios::binary);
        if (!in) throw UsageError("-f: cannot open '" + o.text_path + "'");
        std::stringstream text;
        text << in.rdbuf();

        // Planned for the cache and logits engine::perplexity() makes (at most n_seq chunks at once);
        // a shorter chunk would change what is measured: --fit may not shorten it.
        EngineOptions eo = o.engine;
        eo.context = engine::perplexity_context(perplexity_params(o), eo.context);
        eo.load.fit_may_shorten_context = false;
        return with_engine("perplexity", eo, [&](engine::Engine& e) { return score(e, o, kl_base, text.str()); });
    });
}

}  // namespace fitllm::cli
