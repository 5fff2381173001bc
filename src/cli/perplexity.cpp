// fitllm perplexity -m MODEL -f TEXT [-c 512] [-b 512] [--chunks N] [-t N] [-np N] [KV options]
#include "runtime/perplexity.h"

#include <algorithm>
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
#include "tokenizer/tokenizer.h"

namespace fitllm::cli {

int run_perplexity(const std::vector<std::string>& args) {
    std::string model_path;
    std::string text_path;
    int n_ctx = 512;
    int n_batch = 512;
    int n_chunks = -1;
    int n_threads = 0;
    int n_seq = 1;
    runtime::SessionParams kv_params;  // the KV options' target
    ArgParser p(
        "fitllm perplexity -m MODEL -f TEXT [-c 512] [-b 512] [--chunks N] [-t N] [-np N] [-ctk TYPE] [-ctv TYPE] "
        "[--no-kv-rotation] [--mem SIZE] [--fit] [--mlock] [--stream-layers N]",
        "Perplexity of the model over a text file, computed as llama.cpp's llama-perplexity does:\n"
        "chunks of -c tokens, each from an empty cache and starting with BOS, the second half\n"
        "of each chunk scored. Prints the running value per chunk ([1]12.34,[2]...) and\n"
        "'Final estimate: PPL = X +/- E'. The text needs at least 2 * c tokens.");
    p.option("-m, --model", "MODEL", "the GGUF model", &model_path);
    p.option("-f, --file", "TEXT", "the text file to score", &text_path);
    p.option("-c, --ctx-size", "N", "tokens per chunk (default 512)", &n_ctx);
    p.option("-b, --batch-size", "N", "tokens per forward pass in the unscored half (default 512)", &n_batch);
    p.option("--chunks", "N", "score at most N chunks (default: all)", &n_chunks);
    p.option("-t, --threads", "N", "threads (default: the physical cores)", &n_threads);
    p.option("-np, --parallel", "N", "evaluate N chunks at once, one sequence each (default 1; same result)", &n_seq);
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

    ops::ThreadPool pool(n_threads);
    const int64_t n_avail = static_cast<int64_t>(tokens.size()) / n_ctx;
    std::fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %d, threads %d, KV cache %s, %d at once\n",
                 tokens.size(), static_cast<long long>(n_chunks < 0 ? n_avail : std::min<int64_t>(n_chunks, n_avail)),
                 n_ctx, pool.size(), describe_kv(kv_params).c_str(), n_seq);
    const runtime::PerplexityResult r = runtime::perplexity(*model, tokens, pp, pool, [](int chunk, double ppl) {
        std::printf("[%d]%.4f,", chunk, ppl);
        std::fflush(stdout);
    });
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_error);
    std::fprintf(stderr, "peak RSS %.1f MiB | %s\n", peak_rss_kib() / 1024.0, budget->peak_summary().c_str());
    return 0;
}

}  // namespace fitllm::cli
