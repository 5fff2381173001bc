// fitllm chat -m MODEL [-c CTX] [-t N] [sampling options] [--grammar GBNF | -j SCHEMA] [KV options]
//             [--system TEXT] [-n N]
// An interactive conversation through the model's chat template. Each turn renders the whole
// conversation and feeds only the tokens the KV cache does not already hold. With
// --context-shift, a full context drops its oldest tokens (after --keep) and the conversation goes
// on; the tokens fed stay the record of what the conversation holds.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "engine/drafter.h"
#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "sampling/grammar.h"
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

ArgParser chat_parser(ChatOptions& o) {
    o.engine.context.n_ctx = 4096;
    o.engine.context.n_batch = 512;
    ContextConfig& c = o.engine.context;
    ArgParser p(
        "fitllm chat -m MODEL [-c CTX] [-t N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] "
        "[-ctk TYPE] [-ctv TYPE] [--no-kv-rotation] [--context-shift] [--keep N] [--system TEXT] [-n N] "
        "[--lookup | -md FILE] [--draft-max N] [--mem SIZE] [--fit] [--mlock] [--stream-layers N]",
        "Talk with a model: each line read from stdin is a user message; the reply, rendered through\n"
        "the model's chat template, streams to stdout. /exit, Ctrl-D or Ctrl-C at the prompt ends\n"
        "the conversation; Ctrl-C during a reply stops that reply.");
    p.option("-m, --model", "MODEL", "the GGUF model to talk with", &o.engine.load.model_path);
    p.option("-c, --ctx-size", "N", "context size in tokens, the whole conversation (default 4096)", &c.n_ctx);
    p.option("-b, --batch-size", "N", "prompt tokens per forward pass (default 512)", &c.n_batch);
    add_threads_option(p, c);
    p.option("-n, --n-predict", "N", "tokens per reply at most (default 512)", &o.n_predict);
    p.option("--system", "TEXT", "a system message opening the conversation", &o.system_prompt);
    add_sampling_options(p, o.sampling);
    add_grammar_options(p, o.sampling);
    add_kv_options(p, c);
    add_context_shift_options(p, c);
    add_lookup_options(p, o.lookup);
    add_draft_model_options(p, o.lookup, o.engine);
    add_memory_options(p, o.engine);
    return p;
}

void validate(const ChatOptions& o) {
    const ContextConfig& c = o.engine.context;
    if (o.engine.load.model_path.empty()) throw UsageError("-m MODEL is required");
    if (o.n_predict <= 0) throw UsageError("-n: " + std::to_string(o.n_predict) + " must be positive");
    if (c.n_ctx <= 0) throw UsageError("-c: " + std::to_string(c.n_ctx) + " must be positive");
    if (c.n_batch <= 0) throw UsageError("-b: " + std::to_string(c.n_batch) + " must be positive");
    validate_sampling_options(o.sampling);
    validate_lookup_options(o.lookup);
}

namespace {

// --lookup or -md: the reply through Session::generate_speculative (the turn's new tokens are
// its prompt; drafts follow the whole conversation). Returns whether the context filled up; `fed`
// gets what the cache now holds (every token but the last one generated).
bool reply_with_drafter(engine::Session& session, std::span<const int32_t> suffix, const ChatOptions& o,
                        engine::Drafter& drafter, sampling::Sampler& sampler, const tokenizer::Vocab& vocab,
                        tokenizer::Detokenizer& detok, std::string& reply, std::vector<int32_t>& fed) {
    std::vector<int32_t> generated;
    const engine::GenerationStats stats = session.generate_speculative(
        suffix, o.n_predict, sampler, drafter, [&](int32_t id) { return vocab.is_eog(id); },
        [&](int32_t id) {
            generated.push_back(id);
            if (vocab.is_eog(id)) return true;
            const std::string text = detok.feed(id);
            reply += text;
            std::fputs(text.c_str(), stdout);
            std::fflush(stdout);
            return !g_interrupted.load();
        });
    fed.insert(fed.end(), suffix.begin(), suffix.end());
    if (!generated.empty()) fed.insert(fed.end(), generated.begin(), generated.end() - 1);
    return stats.context_full;
}

int converse(engine::Engine& e, const ChatOptions& o) {
    const ContextConfig& context = e.context();
    const int n_ctx = context.n_ctx;
    const int n_predict = o.n_predict;
    const bool shift = context.context_shift;
    const tokenizer::Tokenizer& tokenizer = e.tokenizer();
    const tokenizer::Vocab& vocab = tokenizer.vocab();
    const chat::ResolvedTemplate& resolved = e.chat_template();
    const chat::RenderOptions& options = e.render_options();
    engine::Session session(e.model(), context, e.threads(), &e.host());
    sampling::SamplingParams params = o.sampling;
    if (params.grammar) params.grammar_vocab = sampling::GrammarVocab::from_tokenizer(tokenizer);
    sampling::Sampler sampler(params, e.model().n_vocab());  // with --grammar / -j: each reply follows it
    tokenizer::Detokenizer detok(tokenizer, /*remove_special=*/false, /*unparse_special=*/false);
    const std::unique_ptr<engine::Drafter> drafter = make_drafter(e, o.lookup);

    std::fprintf(stderr, "template: %s\n", resolved.source_description.c_str());
    std::fprintf(stderr, "context: %d tokens, KV cache %s%s\n", n_ctx, engine::describe_kv(context).c_str(),
                 shift ? ", context shift on" : "");
    std::fprintf(stderr, "/exit or Ctrl-D to quit; Ctrl-C stops a reply\n");

    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!o.system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", o.system_prompt}});
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
        std::string reply;
        bool full = false;
        std::span<const float> logits;
        sampler.restart_grammar();
        if (drafter) {
            full = reply_with_drafter(session, suffix, o, *drafter, sampler, vocab, detok, reply, fed);
        } else {
            logits = session.feed(suffix);
            fed.insert(fed.end(), suffix.begin(), suffix.end());
            for (const int32_t id : suffix) sampler.accept(id);
        }
        for (int i = 0; i < n_predict && !drafter && !g_interrupted.load(); ++i) {
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

}  // namespace

int run_chat(const std::vector<std::string>& args) {
    return parse_and_run(args, chat_parser, [](const ChatOptions& options) {
        ChatOptions o = options;
        apply_lookup_options(o.lookup, o.engine.context);
        return with_engine("chat", o.engine, [&](engine::Engine& e) { return converse(e, o); });
    });
}

}  // namespace fitllm::cli
