// The public C++ API (fitllm/fitllm.h) over the engine (src/engine/).
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/parallel.h"
#include "engine/perplexity.h"
#include "engine/plan_report.h"
#include "engine/session.h"
#include "engine/text_stream.h"
#include "fitllm/fitllm.h"
#include "sampling/sampler.h"
#include "tokenizer/detokenizer.h"

namespace fitllm {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs f, turning the std::invalid_argument of an inner layer into the ConfigError the API
// promises (every other error already derives from fitllm::Error).
template <class F>
auto guarded(F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const std::invalid_argument& e) {
        throw ConfigError(e.what());
    }
}

sampling::SamplingParams sampling_params(const SamplingOptions& o) {
    sampling::SamplingParams p;
    p.temperature = o.temperature;
    p.top_k = o.top_k;
    p.top_p = o.top_p;
    p.min_p = o.min_p;
    p.repeat_penalty = o.repeat_penalty;
    p.frequency_penalty = o.frequency_penalty;
    p.presence_penalty = o.presence_penalty;
    p.penalty_last_n = o.penalty_last_n;
    p.seed = o.seed.value_or(sampling::kRandomSeed);
    return p;
}

PlanReport report(const engine::Plan& plan, const std::string& budget_source) {
    PlanReport r;
    r.total = plan.total();
    r.budget = plan.params.budget;
    r.fits = plan.fits();
    r.weights = plan.weights();
    r.kv = plan.kv;
    r.scratch = plan.scratch;
    r.logits = plan.logits;
    r.overhead = plan.overhead;
    r.n_ctx = plan.params.n_ctx;
    for (const engine::FitStep& s : plan.fit_steps) r.fit_steps.push_back(s.change + " (why: " + s.reason + ")");
    r.text = engine::plan_text(plan, budget_source);
    r.json = engine::plan_json(plan, budget_source).dump(2);
    return r;
}

DeviceUsage usage(const memory::Device& d) {
    DeviceUsage u{d.name(), d.capacity(), d.live(), d.peak(), {}};
    for (const memory::PoolStats& p : d.pools()) u.pools.push_back({p.name, p.live, p.peak});
    return u;
}

uint64_t peak_rss() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    }
    return 0;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

}  // namespace

std::string_view finish_reason_name(FinishReason reason) {
    switch (reason) {
        case FinishReason::stop:
            return "stop";
        case FinishReason::length:
            return "length";
        case FinishReason::context_full:
            return "context_full";
        case FinishReason::cancelled:
            return "cancelled";
    }
    return "?";
}

struct Engine::Impl {
    std::unique_ptr<engine::Engine> engine;
    // One sequence kept from call to call: its cache holds `fed`, which the next prompt reuses as
    // far as it starts with it.
    std::unique_ptr<engine::Session> session;
    std::vector<int32_t> fed;
    bool busy = false;

    engine::Session& fresh_session() {
        if (!session) {
            session = std::make_unique<engine::Session>(engine->model(), engine->context(), engine->threads(),
                                                        &engine->host());
        }
        return *session;
    }
    // The session's memory goes back to the budget (for a context of another shape).
    void drop_session() {
        session.reset();
        fed.clear();
    }
    void check_idle() const {
        if (busy) throw Error("this Engine is generating already: it runs one generation at a time");
    }
};

struct Generation::State {
    Engine::Impl* impl = nullptr;
    GenerateOptions options;
    std::unique_ptr<sampling::Sampler> sampler;
    std::unique_ptr<engine::TextStream> text;
    std::span<const float> logits;
    Completion result;
    bool done = false;
    std::chrono::steady_clock::time_point start;

    ~State() {
        if (impl) impl->busy = false;
    }

    // Ends the generation: the text held back is the last piece (not when cancelled).
    std::string end(FinishReason reason) {
        done = true;
        result.finish_reason = reason;
        result.generate_seconds = seconds_since(start);
        std::string rest = reason == FinishReason::cancelled ? std::string() : text->finish();
        result.text += rest;
        impl->busy = false;
        impl = nullptr;
        return rest;
    }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

Engine Engine::load(const LoadConfig& load, const ContextConfig& context) {
    return guarded([&] {
        auto impl = std::make_unique<Impl>();
        impl->engine = engine::Engine::load(load, context);
        return Engine(std::move(impl));
    });
}

PlanReport Engine::plan(const LoadConfig& load, const ContextConfig& context) {
    return guarded([&] {
        const engine::PlanOnly p = engine::plan_only(load, context);
        return report(p.plan, p.budget_source);
    });
}

PlanReport Engine::plan() const {
    return report(impl_->engine->plan(), impl_->engine->resources().budget_source());
}

ContextConfig Engine::context() const {
    return impl_->engine->context();
}

std::string Engine::architecture() const {
    return impl_->engine->model().hparams().arch;
}

int Engine::n_vocab() const {
    return impl_->engine->model().n_vocab();
}

int Engine::n_ctx_train() const {
    return impl_->engine->model().hparams().n_ctx_train;
}

std::string Engine::chat_template_source() const {
    return impl_->engine->chat_template().source_description;
}

std::vector<int32_t> Engine::tokenize(std::string_view text, bool add_special, bool parse_special) const {
    return impl_->engine->tokenizer().tokenize(text, add_special, parse_special);
}

std::string Engine::detokenize(std::span<const int32_t> tokens) const {
    tokenizer::Detokenizer detok(impl_->engine->tokenizer(), /*remove_special=*/false, /*unparse_special=*/false);
    std::string out;
    for (const int32_t id : tokens) out += detok.feed(id);
    return out + detok.flush();
}

std::string Engine::apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    nlohmann::ordered_json json = nlohmann::ordered_json::array();
    for (const ChatMessage& m : messages) json.push_back({{"role", m.role}, {"content", m.content}});
    chat::RenderOptions options = impl_->engine->render_options();
    options.add_generation_prompt = add_generation_prompt;
    return impl_->engine->chat_template().tmpl.render(json, options);
}

Generation Engine::start(std::string_view prompt, const GenerateOptions& options) {
    Impl& impl = *impl_;
    impl.check_idle();
    if (options.max_tokens < 0) throw ConfigError("max_tokens " + std::to_string(options.max_tokens) + " is negative");
    return guarded([&] {
        engine::Engine& e = *impl.engine;
        const std::vector<int32_t> ids = e.tokenizer().tokenize(prompt, options.add_special, options.parse_special);
        if (ids.empty()) throw ConfigError("the prompt has no tokens");
        const ContextConfig& context = e.context();
        if (!context.context_shift && static_cast<int>(ids.size()) >= context.n_ctx) {
            throw ConfigError("the prompt has " + std::to_string(ids.size()) + " tokens; the context of " +
                              std::to_string(context.n_ctx) + " leaves no room to generate");
        }
        auto state = std::make_unique<Generation::State>();
        state->options = options;
        state->sampler = std::make_unique<sampling::Sampler>(sampling_params(options.sampling), e.model().n_vocab());
        state->text = std::make_unique<engine::TextStream>(e.tokenizer(), options.stop);
        engine::Session& session = impl.fresh_session();
        // Reuse what the cache holds as far as the prompt starts with it; at least the prompt's last
        // token is computed again for its logits.
        size_t keep = std::min(common_prefix(impl.fed, ids), ids.size() - 1);
        if (keep < impl.fed.size()) {
            session.truncate(static_cast<int>(keep));
            impl.fed.resize(keep);
        }
        const auto start = std::chrono::steady_clock::now();
        const std::span<const int32_t> suffix(ids.data() + keep, ids.size() - keep);
        const int shifts_before = session.n_shifts();
        state->logits = session.feed(suffix);
        impl.fed.insert(impl.fed.end(), suffix.begin(), suffix.end());
        if (session.n_shifts() != shifts_before) impl.fed.clear();  // the cache no longer holds them in order
        for (const int32_t id : ids) state->sampler->accept(id);
        state->result.n_prompt = static_cast<int>(ids.size());
        state->result.n_prompt_fed = static_cast<int>(suffix.size());
        state->result.prompt_seconds = seconds_since(start);
        state->start = std::chrono::steady_clock::now();
        state->impl = &impl;
        impl.busy = true;
        return Generation(std::move(state));
    });
}

Completion Engine::generate(std::string_view prompt, const GenerateOptions& options, const TextCallback& on_text) {
    Generation g = start(prompt, options);
    while (std::optional<std::string> piece = g.next()) {
        if (!piece->empty() && on_text && !on_text(*piece)) {
            g.cancel();
            break;
        }
    }
    return g.result();
}

Completion Engine::chat(const std::vector<ChatMessage>& messages, const GenerateOptions& options,
                        const TextCallback& on_text) {
    GenerateOptions o = options;
    o.add_special = false;  // the template writes BOS where the model wants it
    o.parse_special = true;
    return generate(apply_chat_template(messages), o, on_text);
}

std::vector<Completion> Engine::generate_parallel(std::string_view prompt, int n, const GenerateOptions& options) {
    Impl& impl = *impl_;
    impl.check_idle();
    return guarded([&] {
        engine::Engine& e = *impl.engine;
        if (n < 1 || n > kv::kMaxSequences) {
            throw ConfigError("generate_parallel: " + std::to_string(n) + " sequences (1.." +
                              std::to_string(kv::kMaxSequences) + ")");
        }
        const std::vector<int32_t> ids = e.tokenizer().tokenize(prompt, options.add_special, options.parse_special);
        if (ids.empty()) throw ConfigError("the prompt has no tokens");
        impl.drop_session();  // its cache's memory for the sequences' one
        const uint64_t seed = options.sampling.seed.value_or(std::random_device{}());
        std::vector<sampling::Sampler> samplers;
        for (int s = 0; s < n; ++s) {
            sampling::SamplingParams p = sampling_params(options.sampling);
            p.seed = seed + static_cast<uint64_t>(s);
            samplers.emplace_back(p, e.model().n_vocab());
        }
        ContextConfig context = e.context();
        context.n_seq = n;
        context.context_shift = false;
        const tokenizer::Vocab& vocab = e.tokenizer().vocab();
        const engine::ParallelResult r = engine::generate_parallel(
            e.model(), context, ids, options.max_tokens, samplers, [&](int32_t id) { return vocab.is_eog(id); },
            e.threads(), &e.host());
        std::vector<Completion> out;
        for (const std::vector<int32_t>& tokens : r.tokens) {
            Completion c;
            c.tokens = tokens;
            c.n_prompt = c.n_prompt_fed = static_cast<int>(ids.size());
            c.prompt_seconds = r.stats.prompt_seconds;
            c.generate_seconds = r.stats.generate_seconds;
            c.finish_reason = r.stats.context_full ? FinishReason::context_full : FinishReason::length;
            engine::TextStream text(e.tokenizer(), options.stop);
            for (const int32_t id : tokens) {
                if (vocab.is_eog(id)) {
                    c.finish_reason = FinishReason::stop;
                    break;
                }
                c.text += text.feed(id);
                if (text.stopped()) {
                    c.finish_reason = FinishReason::stop;
                    break;
                }
            }
            c.text += text.finish();
            out.push_back(std::move(c));
        }
        return out;
    });
}

PerplexityResult Engine::perplexity(std::string_view text, const PerplexityOptions& options) {
    Impl& impl = *impl_;
    impl.check_idle();
    return guarded([&] {
        engine::Engine& e = *impl.engine;
        impl.drop_session();
        const std::vector<int32_t> tokens = e.tokenizer().tokenize(text, /*add_special=*/true, false);
        engine::PerplexityParams p;
        p.n_ctx = options.n_ctx;
        p.n_chunks = options.n_chunks;
        p.n_batch = options.n_batch;
        p.n_seq = options.n_seq;
        const tokenizer::Vocab& vocab = e.tokenizer().vocab();
        if (vocab.add_bos() && vocab.valid(vocab.special().bos)) p.bos = vocab.special().bos;
        const engine::PerplexityResult r =
            engine::perplexity(e.model(), tokens, p, e.context(), e.threads(), &e.host());
        return PerplexityResult{r.ppl, r.ppl_error, r.n_chunks, r.n_scored};
    });
}

MemoryReport Engine::memory() const {
    engine::Engine& e = *impl_->engine;
    MemoryReport r;
    r.devices.push_back(usage(e.host()));
    if (backend::Backend* offload = e.resources().offload(); offload && !offload->unified()) {
        r.devices.push_back(usage(offload->memory()));
    }
    r.plan_total = e.plan().total();
    r.peak_rss = peak_rss();
    return r;
}

Generation::Generation(std::unique_ptr<State> state) : state_(std::move(state)) {}
Generation::Generation(Generation&&) noexcept = default;
Generation& Generation::operator=(Generation&&) noexcept = default;
Generation::~Generation() = default;

std::optional<std::string> Generation::next() {
    State& s = *state_;
    if (s.done) return std::nullopt;
    Engine::Impl& impl = *s.impl;
    return guarded([&]() -> std::optional<std::string> {
        engine::Engine& e = *impl.engine;
        const int max_tokens = s.options.max_tokens;
        if (static_cast<int>(s.result.tokens.size()) >= max_tokens) return s.end(FinishReason::length);
        const int32_t id = s.sampler->sample(s.logits);
        s.sampler->accept(id);
        s.result.tokens.push_back(id);
        if (e.tokenizer().vocab().is_eog(id)) return s.end(FinishReason::stop);
        std::string piece = s.text->feed(id);
        s.result.text += piece;
        if (s.text->stopped()) return piece + s.end(FinishReason::stop);
        if (static_cast<int>(s.result.tokens.size()) >= max_tokens) return piece + s.end(FinishReason::length);
        engine::Session& session = *impl.session;
        if (!e.context().context_shift && session.n_past() >= session.n_ctx()) {
            return piece + s.end(FinishReason::context_full);
        }
        const int shifts_before = session.n_shifts();
        s.logits = session.feed(std::span<const int32_t>(&id, 1));
        impl.fed.push_back(id);
        if (session.n_shifts() != shifts_before) impl.fed.clear();
        return piece;
    });
}

void Generation::cancel() {
    if (!state_->done) state_->end(FinishReason::cancelled);
}

bool Generation::done() const {
    return state_->done;
}

const Completion& Generation::result() const {
    return state_->result;
}

}  // namespace fitllm
