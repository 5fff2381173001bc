// fitllm chat -m MODEL [-c CTX] [-t N] [sampling options] [KV options] [--system TEXT] [-n N]
// An interactive conversation through the model's chat template. Each turn renders the whole
// conversation and feeds only the tokens the KV cache does not already hold. With
// --context-shift, a full context drops its oldest tokens (after --keep) and the conversation goes
// on; the tokens fed stay the record of what the conversation holds.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generation_options.h"
#include "cli/run_budget.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "runtime/session.h"
#include "sampling/sampler.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::cli {
namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int /*signal*/) {
    g_interrupted.store(true);
}

// Installs the SIGINT handler for the lifetime of the object, without SA_RESTART so that a
// Ctrl-C at the prompt interrupts the blocking read; restores the previous one after.
class SigintGuard {
public:
    SigintGuard() {
        struct sigaction action {};
        action.sa_handler = on_sigint;
        sigemptyset(&action.sa_mask);
        action.sa_flags = 0;
        installed_ = sigaction(SIGINT, &action, &previous_) == 0;
    }
    ~SigintGuard() {
        if (installed_) sigaction(SIGINT, &previous_, nullptr);
    }
    SigintGuard(const SigintGuard&) = delete;
    SigintGuard& operator=(const SigintGuard&) = delete;

private:
    struct sigaction previous_ {};
    bool installed_ = false;
};

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

void context_full(int n_ctx) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "\nfitllm chat: the context is full (%d tokens); the conversation ends here. "
                 "Use -c to allow a longer one, or --context-shift to drop the oldest tokens.\n",
                 n_ctx);
}

}  // namespace

int run_chat(const std::vector<std::string>& args) {
    std::string model_path;
    std::string system_prompt;
    int n_predict = 512;
    int n_threads = 0;
    sampling::SamplingParams sp;
    runtime::SessionParams session_params{.n_ctx = 4096, .n_batch = 512};
    int& n_ctx = session_params.n_ctx;
    ArgParser p(
        "fitllm chat -m MODEL [-c CTX] [-t N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] "
        "[-ctk TYPE] [-ctv TYPE] [--no-kv-rotation] [--context-shift] [--keep N] [--system TEXT] [-n N] [--mem SIZE] "
        "[--fit] [--mlock] [--stream-layers N]",
        "Talk with a model: each line read from stdin is a user message; the reply, rendered through\n"
        "the model's chat template, streams to stdout. /exit, Ctrl-D or Ctrl-C at the prompt ends\n"
        "the conversation; Ctrl-C during a reply stops that reply.");
    p.option("-m, --model", "MODEL", "the GGUF model to talk with", &model_path);
    p.option("-c, --ctx-size", "N", "context size in tokens, the whole conversation (default 4096)", &n_ctx);
    p.option("-t, --threads", "N", "threads (default: the physical cores)", &n_threads);
    p.option("-n, --n-predict", "N", "tokens per reply at most (default 512)", &n_predict);
    p.option("--system", "TEXT", "a system message opening the conversation", &system_prompt);
    add_sampling_options(p, sp);
    add_kv_options(p, session_params);
    add_context_shift_options(p, session_params);
    MemoryOptions memory_options;
    add_memory_options(p, memory_options);
    if (!p.parse(args)) return 0;

    if (model_path.empty()) throw UsageError("-m MODEL is required");
    if (n_predict <= 0) throw UsageError("-n: " + std::to_string(n_predict) + " must be positive");
    if (n_ctx <= 0) throw UsageError("-c: " + std::to_string(n_ctx) + " must be positive");
    validate_sampling_options(sp);
    validate_context_shift_options(session_params);
    const bool shift = session_params.context_shift;

    gguf::GgufFile file = gguf::GgufFile::open(model_path);
    const int extra_cells = shift ? 2 * kv::CacheParams{}.block_size : 0;  // as runtime::Session
    memory::PlanParams planned = session_plan_params(session_params, n_threads);
    planned.n_ctx = n_ctx + extra_cells;
    planned.n_batch = session_params.n_batch;
    std::optional<RunBudget> budget = RunBudget::prepare("chat", file, planned, memory_options, ContextMayShrink::yes);
    if (!budget) return kExitDoesNotFit;
    n_ctx = budget->plan().params.n_ctx - extra_cells;
    session_params.type_k = budget->plan().params.type_k;
    session_params.type_v = budget->plan().params.type_v;
    session_params.device = &budget->device();
    const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::from_gguf(file);
    const tokenizer::Vocab& vocab = tokenizer.vocab();
    const chat::ResolvedTemplate resolved = chat::template_for_model(file);
    chat::RenderOptions options;
    options.add_generation_prompt = true;
    if (vocab.valid(vocab.special().bos)) options.bos_token = vocab.text(vocab.special().bos);
    if (vocab.valid(vocab.special().eos)) options.eos_token = vocab.text(vocab.special().eos);
    const auto model = budget->load_model(file);

    ops::ThreadPool pool(n_threads);
    runtime::Session session(*model, session_params, pool);
    sampling::Sampler sampler(sp, model->n_vocab());
    tokenizer::Detokenizer detok(tokenizer, /*remove_special=*/false, /*unparse_special=*/false);

    std::fprintf(stderr, "template: %s\n", resolved.source_description.c_str());
    std::fprintf(stderr, "context: %d tokens, KV cache %s%s\n", n_ctx, describe_kv(session_params).c_str(),
                 shift ? ", context shift on" : "");
    std::fprintf(stderr, "/exit or Ctrl-D to quit; Ctrl-C stops a reply\n");

    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", system_prompt}});
    std::vector<int32_t> fed;  // the tokens the KV cache holds, in order

    const SigintGuard guard;
    g_interrupted.store(false);
    while (true) {
        std::fputs("> ", stdout);
        std::fflush(stdout);
        std::string line;
        if (!std::getline(std::cin, line)) {  // EOF, or Ctrl-C interrupting the read
            std::fputs("\n", stdout);
            break;
        }
        if (g_interrupted.load()) {
            std::fputs("\n", stdout);
            break;
        }
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line == "/exit") break;
        if (line.empty()) continue;
        messages.push_back({{"role", "user"}, {"content", line}});

        const std::string prompt = resolved.tmpl.render(messages, options);
        const std::vector<int32_t> ids = tokenizer.tokenize(prompt, /*add_special=*/false, /*parse_special=*/true);
        size_t keep = common_prefix(fed, ids);
        if (keep < fed.size() || keep == ids.size()) {
            // The cache holds something the new rendering does not start with (or nothing new
            // would be fed to get logits from): start over.
            session.reset();
            fed.clear();
            keep = 0;
        }
        const std::span<const int32_t> suffix(ids.data() + keep, ids.size() - keep);
        if (!shift && session.n_past() + static_cast<int>(suffix.size()) >= n_ctx) {
            context_full(n_ctx);
            return 0;
        }
        std::span<const float> logits = session.feed(suffix);
        fed.insert(fed.end(), suffix.begin(), suffix.end());
        for (const int32_t id : suffix) sampler.accept(id);

        std::string reply;
        bool full = false;
        for (int i = 0; i < n_predict && !g_interrupted.load(); ++i) {
            const int32_t next = sampler.sample(logits);
            sampler.accept(next);
            if (vocab.is_eog(next)) break;
            const std::string text = detok.feed(next);
            reply += text;
            std::fputs(text.c_str(), stdout);
            std::fflush(stdout);
            if (i + 1 == n_predict) break;
            if (!shift && session.n_past() + 1 >= n_ctx) {
                full = true;
                break;
            }
            try {
                logits = session.feed(std::span<const int32_t>(&next, 1));
            } catch (const kv::KvCacheError&) {
                full = true;
                break;
            }
            fed.push_back(next);
        }
        const std::string rest = detok.flush();
        reply += rest;
        std::fputs(rest.c_str(), stdout);
        std::fputs("\n", stdout);
        std::fflush(stdout);
        if (full) {
            context_full(n_ctx);
            return 0;
        }
        if (g_interrupted.exchange(false)) std::fprintf(stderr, "(reply stopped)\n");
        messages.push_back({{"role", "assistant"}, {"content", reply}});
    }
    return 0;
}

}  // namespace fitllm::cli
