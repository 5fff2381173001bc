// fitllm bench -m MODEL [-p 512] [-n 128] [-t N] [-r 5] [-o md|json] [-ctk TYPE] [-ctv TYPE] [--no-kv-rotation]
// [-np N]
// llama-bench style: prompt processing (pp) and token generation (tg) speed in tokens/s,
// mean ± stdev over repetitions, on a fresh KV cache each time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "model/model.h"
#include "ops/read_bandwidth.h"
#include "ops/thread_pool.h"
#include "quant/file_type.h"
#include "util/text.h"

namespace fitllm::cli {

namespace {

struct Result {
    std::string test;         // "pp512", "tg128"
    int tokens_per_pass = 0;  // tg tests: tokens decoded by one forward pass (one per sequence); 0: pp
    int n_tokens;
    double mean_tps;
    double stdev_tps;
    std::vector<double> samples_tps;
};

Result summarize(std::string test, int tokens_per_pass, int n_tokens, std::vector<double> seconds) {
    Result r{std::move(test), tokens_per_pass, n_tokens, 0.0, 0.0, {}};
    for (double s : seconds) r.samples_tps.push_back(n_tokens / s);
    for (double t : r.samples_tps) r.mean_tps += t;
    r.mean_tps /= static_cast<double>(r.samples_tps.size());
    double var = 0.0;
    for (double t : r.samples_tps) var += (t - r.mean_tps) * (t - r.mean_tps);
    r.stdev_tps = r.samples_tps.size() > 1 ? std::sqrt(var / static_cast<double>(r.samples_tps.size() - 1)) : 0.0;
    return r;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The weight bytes one decoded token reads: every tensor but the token embeddings, of which it
// reads one row, unless the output projection is tied to them (no output.weight) and reads them
// whole. Dense models: a mixture of experts reads only its chosen experts.
uint64_t weights_read_per_token(const gguf::GgufFile& file) {
    const bool tied = file.find_tensor("output.weight") == nullptr;
    uint64_t bytes = 0;
    for (const auto& t : file.tensors()) {
        if (t.name != "token_embd.weight" || tied) bytes += t.n_bytes;
    }
    return bytes;
}

// The machine's read bandwidth over the model's mapped weights (ops::measure_read_bandwidth), and
// what one decoded token reads; none where weights stream from the file (layers, or experts into
// an expert cache: reading them through the mapping would break the budget) or run on a device,
// whose decode the host's memory does not bound.
struct Bandwidth {
    ops::ReadBandwidth measured;
    uint64_t bytes_per_token = 0;
    // The share of the bandwidth that tokens_per_pass tokens per forward pass at `tps` tokens/s use.
    double share(double tps, int tokens_per_pass) const {
        return measured.bytes_per_second > 0 ? bytes_per_token * (tps / tokens_per_pass) / measured.bytes_per_second
                                             : 0.0;
    }
};

std::optional<Bandwidth> measure_bandwidth(engine::Engine& e) {
    const engine::PlanParams& p = e.plan().params;
    if (p.n_streamed_layers > 0 || e.plan().n_expert_slots > 0 || (!p.device.empty() && p.n_gpu_layers != 0))
        return std::nullopt;
    std::vector<std::span<const std::byte>> ranges;
    for (const auto& t : e.file().tensors()) ranges.push_back(t.data);
    return Bandwidth{ops::measure_read_bandwidth(ranges, e.threads()), weights_read_per_token(e.file())};
}

}  // namespace

ArgParser bench_parser(BenchOptions& o) {
    ContextConfig& c = o.engine.context;
    c.n_batch = 512;
    ArgParser p(
        "fitllm bench -m MODEL [-p 512] [-n 128] [-t N] [-r 5] [-o md|json] [-ctk TYPE] [-ctv TYPE] "
        "[--no-kv-rotation] [-np N] [--mem SIZE] [--fit] [--mlock] [--stream-layers N]",
        "Measure prompt processing (pp) and token generation (tg) speed, like llama-bench:\n"
        "tokens/s, mean and standard deviation over repetitions. Token ids are random; each\n"
        "repetition starts from an empty KV cache. -p 0 or -n 0 skips that test.");
    p.option("-m, --model", "MODEL", "the GGUF model", &o.engine.load.model_path);
    p.option("-p, --n-prompt", "N", "prompt tokens for the pp test (default 512)", &o.n_prompt);
    p.option("-n, --n-gen", "N", "tokens to generate for the tg test (default 128)", &o.n_gen);
    add_threads_option(p, c);
    p.option("-b, --batch-size", "N", "prompt tokens per forward pass (default 512)", &c.n_batch);
    p.option("-r, --repetitions", "N", "repetitions of each test (default 5)", &o.repetitions);
    p.option("-o, --output", "md|json", "output format (default md)", &o.output);
    p.option("-np, --parallel", "N",
             "also a tg test of N sequences decoded together (one token of each per pass; default 1: none)", &c.n_seq);
    add_kv_options(p, c);
    add_memory_options(p, o.engine);
    return p;
}

void validate(const BenchOptions& o) {
    const ContextConfig& c = o.engine.context;
    if (c.n_seq < 1 || c.n_seq > kv::kMaxSequences) {
        throw UsageError("-np: " + std::to_string(c.n_seq) + " must be in 1.." + std::to_string(kv::kMaxSequences));
    }
    if (o.engine.load.model_path.empty()) throw UsageError("missing -m MODEL (see --help)");
    if (o.n_prompt < 0 || o.n_gen < 0 || o.repetitions < 1 || c.n_batch < 1)
        throw UsageError("-p, -n must be >= 0; -r, -b >= 1");
    if (o.output != "md" && o.output != "json") throw UsageError("-o: expected md or json, got '" + o.output + "'");
}

namespace {

// The pp and tg tests' session: one sequence of the prompt and the generated tokens.
ContextConfig session_context(const ContextConfig& planned, const BenchOptions& o) {
    ContextConfig c = planned;
    c.n_seq = 1;
    c.n_outputs = 0;
    c.n_ctx = std::max(1, o.n_prompt + o.n_gen + 1);
    return c;
}

// The -np test's context: n_seq sequences of n_gen tokens each.
ContextConfig parallel_context(const ContextConfig& planned, const BenchOptions& o) {
    ContextConfig c = planned;
    c.n_ctx = c.n_seq * o.n_gen;
    c.n_outputs = c.n_seq;
    return c;
}

int measure(engine::Engine& e, const BenchOptions& o) {
    const int n_prompt = o.n_prompt, n_gen = o.n_gen, repetitions = o.repetitions;
    const int n_parallel = e.context().n_seq;
    model::Model* model = &e.model();
    ops::ThreadPool& pool = e.threads();
    auto session = std::make_unique<engine::Session>(e.model(), session_context(e.context(), o), pool, &e.host());
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> token(0, model->n_vocab() - 1);

    std::vector<Result> results;
    if (n_prompt > 0) {
        std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
        std::vector<double> seconds;
        for (int r = -1; r < repetitions; ++r) {  // r = -1: warm-up, not counted
            for (auto& t : prompt) t = token(rng);
            session->reset();
            const auto t0 = std::chrono::steady_clock::now();
            session->feed(prompt);
            if (r >= 0) seconds.push_back(seconds_since(t0));
        }
        results.push_back(summarize("pp" + std::to_string(n_prompt), 0, n_prompt, seconds));
    }
    if (n_gen > 0) {
        std::vector<double> seconds;
        for (int r = -1; r < repetitions; ++r) {
            session->reset();
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < n_gen; ++i) {
                const int32_t t = token(rng);
                session->feed(std::span<const int32_t>(&t, 1));
            }
            if (r >= 0) seconds.push_back(seconds_since(t0));
        }
        results.push_back(summarize("tg" + std::to_string(n_gen), 1, n_gen, seconds));
    }
    session.reset();  // its cache and logits go back to the budget before the -np test's
    if (n_gen > 0 && n_parallel > 1) {
        // tgN x P: P sequences decoded together, one token of each per forward pass (tokens/s of
        // all of them), in a cache of P sequences.
        kv::ModelCache cache = e.make_cache(parallel_context(e.context(), o));
        std::vector<int32_t> tokens(static_cast<size_t>(n_parallel)), pos(static_cast<size_t>(n_parallel));
        std::vector<kv::SeqId> seq(static_cast<size_t>(n_parallel));
        for (int s = 0; s < n_parallel; ++s) seq[static_cast<size_t>(s)] = s;
        memory::PoolBuffer<float> logits = e.make_logits(n_parallel);
        std::vector<double> seconds;
        for (int r = -1; r < repetitions; ++r) {
            cache.clear();
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < n_gen; ++i) {
                for (auto& t : tokens) t = token(rng);
                std::fill(pos.begin(), pos.end(), i);
                model->forward({.tokens = tokens, .positions = pos, .seq_ids = seq, .all_logits = true}, cache,
                               logits.data(), pool);
            }
            if (r >= 0) seconds.push_back(seconds_since(t0));
        }
        results.push_back(summarize("tg" + std::to_string(n_gen) + " x" + std::to_string(n_parallel), n_parallel,
                                    n_gen * n_parallel, seconds));
    }

    const std::optional<Bandwidth> bandwidth = n_gen > 0 ? measure_bandwidth(e) : std::nullopt;

    const gguf::GgufFile& file = e.file();
    const std::string& model_path = o.engine.load.model_path;
    const std::string& output = o.output;
    const std::string arch(file.get<std::string_view>("general.architecture"));
    std::string ftype = "?";
    if (const auto* v = file.find("general.file_type"); v && !v->is_array() && v->type() != gguf::ValueType::STRING) {
        ftype = quant::file_type_name(static_cast<uint32_t>(v->to_int())).value_or("?");
    }
    std::fprintf(stderr, "peak RSS %.1f MiB | %s\n", peak_rss_kib() / 1024.0, e.peak_summary().c_str());
    uint64_t weight_bytes = 0;
    for (const auto& t : file.tensors()) weight_bytes += t.n_bytes;
    if (output == "json") {
        nlohmann::ordered_json j = nlohmann::ordered_json::array();
        for (const Result& r : results) {
            nlohmann::ordered_json row = {{"model", model_path},
                                          {"arch", arch},
                                          {"file_type", ftype},
                                          {"weight_bytes", weight_bytes},
                                          {"threads", pool.size()},
                                          {"kv_cache", engine::describe_kv(e.context())},
                                          {"test", r.test},
                                          {"n_tokens", r.n_tokens},
                                          {"avg_ts", r.mean_tps},
                                          {"stddev_ts", r.stdev_tps},
                                          {"samples_ts", r.samples_tps}};
            if (bandwidth) {
                row["read_bandwidth_bps"] = bandwidth->measured.bytes_per_second;
                if (r.tokens_per_pass > 0) {
                    row["weights_read_per_token"] = bandwidth->bytes_per_token;
                    row["bandwidth_share"] = bandwidth->share(r.mean_tps, r.tokens_per_pass);
                }
            }
            j.push_back(std::move(row));
        }
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("KV cache: %s\n\n", engine::describe_kv(e.context()).c_str());
    if (bandwidth) {
        std::printf(
            "read bandwidth: %.1f GB/s (best of %d passes over %s of weights, %d threads); "
            "a token reads %s of weights\n\n",
            bandwidth->measured.bytes_per_second / 1e9, bandwidth->measured.passes,
            util::human_bytes(bandwidth->measured.bytes).c_str(), pool.size(),
            util::human_bytes(bandwidth->bytes_per_token).c_str());
    }
    std::printf("| model | size | threads | test | t/s | of bandwidth |\n|---|---:|---:|---:|---:|---:|\n");
    for (const Result& r : results) {
        std::string share;
        if (bandwidth && r.tokens_per_pass > 0) {
            share =
                std::to_string(static_cast<int>(std::lround(100.0 * bandwidth->share(r.mean_tps, r.tokens_per_pass)))) +
                "%";
        }
        std::printf("| %s %s | %s | %d | %s | %.2f ± %.2f | %s |\n", arch.c_str(), ftype.c_str(),
                    util::human_bytes(weight_bytes).c_str(), pool.size(), r.test.c_str(), r.mean_tps, r.stdev_tps,
                    share.c_str());
    }
    return 0;
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
    return parse_and_run(args, bench_parser, [](const BenchOptions& o) {
        // Planned for the larger of the two contexts it makes one after the other: the pp / tg tests'
        // session, and the -np test's sequences. Measuring a shorter context than asked would change
        // what is measured: --fit may not shorten it.
        EngineOptions eo = o.engine;
        eo.context.n_ctx = std::max(session_context(eo.context, o).n_ctx,
                                    eo.context.n_seq > 1 ? parallel_context(eo.context, o).n_ctx : 0);
        eo.context.n_outputs = eo.context.n_seq;
        eo.load.fit_may_shorten_context = false;
        return with_engine("bench", eo, [&](engine::Engine& e) { return measure(e, o); });
    });
}

}  // namespace fitllm::cli
