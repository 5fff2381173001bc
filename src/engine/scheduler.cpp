#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>

#include "engine/context.h"
#include "engine/text_stream.h"
#include "fitllm/error.h"
#include "sampling/grammar.h"
#include "sampling/sampler.h"
#include "tokenizer/detokenizer.h"

namespace fitllm::engine {

struct Scheduler::Sequence {
    Sequence(std::shared_ptr<Job> job_, std::vector<int32_t> prompt, GenerationParams params,
             const tokenizer::Tokenizer& tokenizer, int n_vocab)
        : job(std::move(job_)),
          tokens(std::move(prompt)),
          n_prompt(static_cast<int>(tokens.size())),
          max_tokens(params.max_tokens),
          top_logprobs(params.top_logprobs),
          sampler(params.sampling, n_vocab),
          text(tokenizer, std::move(params.stop)),
          draft_max(params.draft_max),
          draft_min(params.draft_min),
          draft_p_min(params.draft_p_min) {
        if (params.penalize_prompt) {
            for (const int32_t id : tokens) sampler.accept(id);
        }
    }

    std::shared_ptr<Job> job;
    std::vector<int32_t> tokens;  // prompt, then every sampled token; the cache holds the first n_fed
    int n_prompt = 0;
    int n_fed = 0;
    int n_generated = 0;
    int max_tokens = 0;
    int top_logprobs = -1;
    sampling::Sampler sampler;
    TextStream text;     // what is not sent yet may be the start of a stop string
    uint64_t order = 0;  // admission order: lower is older and keeps its slot longer
    kv::SeqId seq = -1;
    bool finished = false;
    bool admitted = false;  // once: the prompt cache's share of the prompt is reported then
    // submit_group(): the order of the group's first (a request alone: its own); a sibling (not
    // the first) is first admitted once an admitted one of its group has fed the prompt, and
    // shares its cells.
    uint64_t group = 0;
    bool sibling = false;
    // Speculative decoding (SchedulerOptions::lookup): GenerationParams::draft_max and draft_min,
    // and this step's drafts, fed after the last token in its batch.
    int draft_max = -1;
    int draft_min = 0;
    float draft_p_min = -1.0f;
    std::vector<int32_t> draft;

    int unfed() const { return static_cast<int>(tokens.size()) - n_fed; }
};

namespace {

// The log-softmax of the logits at id, and the top n tokens' (best first).
TokenLogprob logprob_of(std::span<const float> logits, int32_t id, int n) {
    float max = -std::numeric_limits<float>::infinity();
    for (const float l : logits) max = std::max(max, l);
    double sum = 0.0;
    for (const float l : logits) sum += std::exp(static_cast<double>(l - max));
    const float log_sum = max + static_cast<float>(std::log(sum));
    TokenLogprob out{.id = id, .logprob = logits[static_cast<size_t>(id)] - log_sum, .top = {}};
    // The n best, kept sorted in a small vector (n is at most a few dozen).
    const auto better = [](const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
        return a.second > b.second || (a.second == b.second && a.first < b.first);
    };
    for (size_t t = 0; t < logits.size() && n > 0; ++t) {
        const std::pair<int32_t, float> c{static_cast<int32_t>(t), logits[t]};
        if (out.top.size() == static_cast<size_t>(n) && !better(c, out.top.back())) continue;
        out.top.insert(std::upper_bound(out.top.begin(), out.top.end(), c, better), c);
        if (out.top.size() > static_cast<size_t>(n)) out.top.pop_back();
    }
    for (auto& [t, l] : out.top) l -= log_sum;
    return out;
}

ContextConfig checked(ContextConfig c, const SchedulerOptions& o) {
    check(c);
    if (c.n_ctx < 1) throw ConfigError("scheduler: a context of " + std::to_string(c.n_ctx) + " tokens");
    if (c.context_shift) throw ConfigError("scheduler: a context shift (--context-shift) is not supported");
    if (o.max_queue < 0) {
        throw std::invalid_argument("scheduler: max_queue " + std::to_string(o.max_queue) + " (>= 0)");
    }
    c.n_batch = std::max(c.n_batch, c.n_seq);
    return c;
}

// The rows of logits a step returns at most: one per slot, or context.n_outputs (within the
// batch) for the drafts of speculative decoding.
int logit_rows(const ContextConfig& c) {
    return std::max(c.n_seq, std::min(c.n_outputs, c.n_batch));
}

}  // namespace

Scheduler::Scheduler(model::Model& model, const tokenizer::Tokenizer& tokenizer, const ContextConfig& context,
                     SchedulerOptions options, Compute& compute, memory::Device* device)
    : model_(model),
      tokenizer_(tokenizer),
      context_(checked(context, options)),
      options_(options),
      compute_(compute),
      cache_(make_cache(model, context_, device)),
      prompts_(cache_, context_, pool_of(device, memory::pool_names::kPromptCache), options.prompt_cache_model),
      logits_(make_logits(model, logit_rows(context_), device)),
      overhead_pool_(&pool_of(device, memory::pool_names::kOverhead)) {
    kv_bytes_ = cache_.bytes();
    for (int s = context_.n_seq - 1; s >= 0; --s) free_ids_.push_back(s);
    stats_.kv_cells_total = context_.n_ctx;
    n_rows_ = logit_rows(context_);
    warm_up();
    if (options_.lookup && options_.draft_model) {
        throw std::invalid_argument("scheduler: prompt lookup and a draft model are two drafters; use one of them");
    }
    if (options_.draft_model) {
        check(options_.draft);
        for (int s = 0; s < context_.n_seq; ++s) {
            drafters_.push_back(std::make_unique<ModelDrafter>(*options_.draft_model, options_.draft_context,
                                                               compute_.pool, options_.draft, device));
        }
    }
    if (options_.lookup || options_.draft_model) {
        if (options_.lookup) check(*options_.lookup);
        const int n_draft = options_.lookup ? options_.lookup->n_draft : options_.draft.n_draft;
        // A draft pass holds the last token and the drafts; rejected ones are taken back, so the
        // sliding-window pools keep that many positions more (kv::ModelCache::set_window_slack),
        // within the spare block a sequence has there.
        max_draft_ = std::min({n_draft, n_rows_ - 1, (context_.n_batch - 1) / 2});
        for (int p = 0; p < cache_.n_pools(); ++p) {
            if (cache_.pool(p).params().window > 0)
                max_draft_ = std::min(max_draft_, cache_.pool(p).params().block_size / 2);
        }
        max_draft_ = std::max(max_draft_, 0);
        cache_.set_window_slack(max_draft_);
    }
    thread_ = std::thread([this] { loop(); });
}

void Scheduler::warm_up() {
    // One pass of the largest batch a step makes: n_batch tokens over the slots, each slot's last
    // token wanting logits. The model's working memory grows to its largest now, charged to the
    // budget (memory::BudgetError here, at load, rather than in the middle of serving).
    // (A step never holds more tokens than the cache: n_ctx bounds them.)
    const int n_tokens = std::min(context_.n_batch, context_.n_ctx);
    const int per_slot = n_tokens / context_.n_seq;
    const int rows = std::max(1, n_rows_ / context_.n_seq);  // each slot's last tokens want logits
    for (int s = 0; s < context_.n_seq; ++s) {
        const int n = per_slot + (s < n_tokens % context_.n_seq ? 1 : 0);
        if (n == 0) continue;
        for (int t = 0; t < n; ++t) {
            batch_tokens_.push_back(0);
            batch_pos_.push_back(t);
            batch_seq_.push_back(s);
            batch_output_.push_back(t + rows >= n ? 1 : 0);
        }
    }
    std::lock_guard lock(compute_.mutex);
    model_.forward({.tokens = batch_tokens_, .positions = batch_pos_, .seq_ids = batch_seq_, .output = batch_output_},
                   cache_, logits_.data(), compute_.pool);
    cache_.clear();
    // A quantized K's transform is fitted from the first keys a layer stores: the requests' keys,
    // not these of token 0.
    for (int p = 0; p < cache_.n_pools(); ++p) cache_.pool(p).forget_fitted_key_transforms();
}

Scheduler::~Scheduler() {
    shutdown();
}

void Scheduler::shutdown() {
    {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
        stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    for (auto& s : active_) s->job->finish(FinishReason::cancelled);
    for (auto& s : preempted_) s->job->finish(FinishReason::cancelled);
    for (auto& s : queue_) s->job->finish(FinishReason::cancelled);
    active_.clear();
    preempted_.clear();
    queue_.clear();
}

std::shared_ptr<const sampling::GrammarVocab> Scheduler::grammar_vocab() const {
    std::call_once(grammar_vocab_once_, [this] {
        auto vocab = sampling::GrammarVocab::from_tokenizer(tokenizer_);
        grammar_vocab_charge_ = memory::Charge(*overhead_pool_, vocab->memory_bytes(), "the grammar vocabulary");
        grammar_vocab_ = std::move(vocab);
    });
    return grammar_vocab_;
}

std::shared_ptr<Job> Scheduler::submit(std::vector<int32_t> prompt, GenerationParams params) {
    std::vector<GenerationParams> one;
    one.push_back(std::move(params));
    return submit_group(std::move(prompt), std::move(one)).front();
}

std::vector<std::shared_ptr<Job>> Scheduler::submit_group(std::vector<int32_t> prompt,
                                                          std::vector<GenerationParams> group) {
    if (group.empty()) throw std::invalid_argument("no requests to submit");
    const int n_prompt = static_cast<int>(prompt.size());
    if (n_prompt == 0) throw std::invalid_argument("the prompt has no tokens");
    for (GenerationParams& params : group) {
        if (params.max_tokens < 1) throw std::invalid_argument("max_tokens must be at least 1");
        if (static_cast<int64_t>(n_prompt) + params.max_tokens > context_.n_ctx) {
            throw std::invalid_argument(
                "this model's context is " + std::to_string(context_.n_ctx) + " tokens; the request asks for " +
                std::to_string(static_cast<int64_t>(n_prompt) + params.max_tokens) + " (" + std::to_string(n_prompt) +
                " in the prompt, " + std::to_string(params.max_tokens) + " to generate)");
        }
        for (const std::string& s : params.stop) {
            if (s.empty()) throw std::invalid_argument("stop: an empty stop string");
        }
        if (params.sampling.grammar && !params.sampling.grammar_vocab) params.sampling.grammar_vocab = grammar_vocab();
    }
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (size_t i = 0; i < group.size(); ++i) {
        jobs.push_back(std::make_shared<Job>(n_prompt));
        std::vector<int32_t> tokens = i + 1 < group.size() ? prompt : std::move(prompt);  // the last takes it
        seqs.push_back(std::make_unique<Sequence>(jobs.back(), std::move(tokens), std::move(group[i]), tokenizer_,
                                                  model_.n_vocab()));
    }
    {
        std::lock_guard lock(mutex_);
        if (stopping_) throw QueueFullError("the server is stopping");
        const int n_waiting = static_cast<int>(queue_.size()) + n_waiting_;
        if (n_waiting + static_cast<int>(seqs.size()) > options_.max_queue) {
            throw QueueFullError("the request queue is full (" + std::to_string(n_waiting) +
                                 " requests wait for a slot, at most " + std::to_string(options_.max_queue) +
                                 (seqs.size() > 1 ? "; this one asks for " + std::to_string(seqs.size()) : "") +
                                 "); try again later");
        }
        const uint64_t first = next_order_;
        for (size_t i = 0; i < seqs.size(); ++i) {
            seqs[i]->order = next_order_++;
            seqs[i]->group = first;
            seqs[i]->sibling = i > 0;
            queue_.push_back(std::move(seqs[i]));
            ++n_unfinished_;
        }
        stats_.n_queued = static_cast<int>(queue_.size() + preempted_.size());
    }
    cv_.notify_all();
    return jobs;
}

SchedulerStats Scheduler::stats() const {
    SchedulerStats s;
    {
        std::lock_guard lock(mutex_);
        s = stats_;
    }
    const PromptCache::Counters c = prompts_.counters();
    s.n_cache_evictions = c.n_evictions;
    s.n_cache_restores = c.n_restores;
    s.n_disk_reads = c.n_disk_reads;
    s.n_disk_failures = c.n_disk_failures;
    s.n_disk_loaded = c.n_disk_loaded;
    s.n_disk_foreign = c.n_disk_foreign;
    s.n_disk_bad = c.n_disk_bad;
    return s;
}

bool Scheduler::idle() const {
    std::lock_guard lock(mutex_);
    return n_unfinished_ == 0;
}

void Scheduler::loop() {
    while (true) {
        {
            std::unique_lock lock(mutex_);
            const bool work = cv_.wait_for(lock, std::chrono::seconds(1), [&] {
                return stopping_ || !queue_.empty() || !active_.empty() || !preempted_.empty();
            });
            if (stopping_) return;
            if (!work) {
                lock.unlock();
                publish_stats();  // the throughput window moves on while idle
                continue;
            }
            gather(lock);
            if (stopping_) return;
        }
        admit();
        if (!step()) {
            // Nothing could run (everything waits for room that only a finishing request frees,
            // which cannot happen): should not occur; avoid spinning.
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        publish_stats();
    }
}

void Scheduler::gather(std::unique_lock<std::mutex>& lock) {
    if (!active_.empty()) return;
    // Nothing running: a new busy spell starts.
    const bool last_spell_shared = spell_shared_;
    spell_shared_ = false;
    if (options_.gather_gap.count() <= 0 || !last_spell_shared) return;
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + options_.gather_max;
    size_t seen = queue_.size();
    auto last = start;
    while (queue_.size() + preempted_.size() < free_ids_.size()) {
        const auto deadline = std::min(until, last + options_.gather_gap);
        if (!cv_.wait_until(lock, deadline, [&] { return stopping_ || queue_.size() != seen; })) return;
        if (stopping_) return;
        seen = queue_.size();
        last = std::chrono::steady_clock::now();
    }
}

void Scheduler::finish(Sequence& s, FinishReason reason, std::string error) {
    if (reason != FinishReason::cancelled) {
        const std::string rest = s.text.finish();
        if (!rest.empty()) s.job->append(rest, s.n_generated);
    }
    s.finished = true;
    {
        std::lock_guard lock(mutex_);
        --n_unfinished_;
    }
    s.job->finish(reason, std::move(error));
}

void Scheduler::admit() {
    // New requests, oldest first, behind the preempted ones (which are older still).
    {
        std::lock_guard lock(mutex_);
        while (!queue_.empty()) {
            preempted_.push_back(std::move(queue_.front()));
            queue_.pop_front();
            ++n_waiting_;
        }
    }
    std::stable_sort(preempted_.begin(), preempted_.end(),
                     [](const auto& a, const auto& b) { return a->order < b->order; });
    // Drop the cancelled ones while they wait.
    for (auto it = preempted_.begin(); it != preempted_.end();) {
        if ((*it)->job->cancelled()) {
            finish(**it, FinishReason::cancelled);
            it = preempted_.erase(it);
            std::lock_guard lock(mutex_);
            --n_waiting_;
        } else {
            ++it;
        }
    }
    // Admission: a free slot, and free cells for all of the request's tokens on top of what the
    // running prompts still need and a block per sequence for partly used blocks.
    // Kept prompts give their cells back (least recently used first) when they are needed.
    const int block = cache_.pool(0).params().block_size;
    while (!preempted_.empty() && !free_ids_.empty()) {
        Sequence& s = *preempted_.front();
        if (s.sibling && !s.admitted && sibling_feeding(s)) break;  // its prompt's cells come next step
        s.seq = free_ids_.back();
        const int reused = reuse_prompt(s);
        int reserved = 0;
        for (const auto& a : active_) reserved += a->unfed() + block;
        const int need = static_cast<int>(s.tokens.size()) - reused + block;
        while (need + reserved > cache_.pool(0).free_cells() && prompts_.evict()) {
        }
        if (!active_.empty() && need + reserved > cache_.pool(0).free_cells()) {
            cache_.seq_rm(s.seq, -1, -1);
            s.seq = -1;
            break;
        }
        free_ids_.pop_back();
        s.n_fed = reused;
        if (!s.admitted) s.job->note_cached(std::min(reused, s.n_prompt));
        s.admitted = true;
        if (reused > 0) {
            std::lock_guard lock(mutex_);
            stats_.n_prompt_tokens_cached += static_cast<uint64_t>(reused);
            ++stats_.n_cache_hits;
        }
        active_.push_back(std::move(preempted_.front()));
        preempted_.pop_front();
        std::lock_guard lock(mutex_);
        --n_waiting_;
    }
}

void Scheduler::preempt(size_t i) {
    std::unique_ptr<Sequence> s = std::move(active_[i]);
    active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
    keep_prompt(*s);  // it finds its cells again if nobody needs them before it resumes
    free_slot(s->seq);
    s->seq = -1;
    s->n_fed = 0;
    s->sampler.release_workspace();  // only the slots' samplers hold candidate lists (the plan's)
    s->job->note_preempted();
    {
        std::lock_guard lock(mutex_);
        ++stats_.n_preemptions;
        ++n_waiting_;
    }
    preempted_.push_front(std::move(s));
}

void Scheduler::accept_token(Sequence& s, int32_t id) {
    s.tokens.push_back(id);
    ++s.n_generated;
    if (tokenizer_.vocab().is_eog(id)) {
        finish(s, FinishReason::stop);
        return;
    }
    const std::string ready = s.text.feed(id);
    if (!ready.empty()) s.job->append(ready, s.n_generated);
    if (s.text.stopped()) {
        finish(s, FinishReason::stop);
    } else if (s.n_generated >= s.max_tokens || static_cast<int>(s.tokens.size()) >= context_.n_ctx) {
        finish(s, FinishReason::length);
    }
}

void Scheduler::make_drafts() {
    // Every decoding sequence (its last token not yet fed) drafts by prompt lookup over its
    // tokens (or with its slot's draft model), as many as its request, the rows of logits and the batch leave (a row
    // and a token of each active sequence come first), and never past max_tokens or the context.
    int rows_left = n_rows_ - static_cast<int>(active_.size());
    int tokens_left = context_.n_batch - static_cast<int>(active_.size());
    for (const auto& a : active_) {
        Sequence& s = *a;
        s.draft.clear();
        if (s.unfed() != 1 || s.draft_max == 0) continue;
        const int asked = s.draft_max < 0 ? max_draft_ : std::min(s.draft_max, max_draft_);
        const int most = std::min({asked, context_.n_ctx - static_cast<int>(s.tokens.size()),
                                   s.max_tokens - s.n_generated - 1, rows_left, tokens_left});
        if (most < std::max(1, s.draft_min)) continue;
        if (options_.lookup) {
            lookup_draft(s.tokens, *options_.lookup, most, s.draft);
        } else {
            draft_with_model(s, most);
        }
        if (static_cast<int>(s.draft.size()) < s.draft_min) s.draft.clear();
        rows_left -= static_cast<int>(s.draft.size());
        tokens_left -= static_cast<int>(s.draft.size());
    }
}

void Scheduler::draft_with_model(Sequence& s, int most) {
    ModelDrafter& drafter = *drafters_[static_cast<size_t>(s.seq)];
    try {
        std::lock_guard lock(compute_.mutex);
        drafter.draft(s.tokens, most, s.draft, s.draft_p_min);
    } catch (const std::exception&) {
        // The draft pass failed (its working memory over budget, ...): no draft this step, the
        // next starts over; the model's own pass decides the token either way.
        s.draft.clear();
        drafter.reset();
    }
}

void Scheduler::free_slot(kv::SeqId seq) {
    cache_.seq_rm(seq, -1, -1);
    free_ids_.push_back(seq);
    if (!drafters_.empty()) drafters_[static_cast<size_t>(seq)]->reset();  // its draft cells too
}

bool Scheduler::drop_drafts() {
    bool any = false;
    for (const auto& a : active_) {
        any = any || !a->draft.empty();
        a->draft.clear();
    }
    return any;
}

int Scheduler::check_drafts(Sequence& s, const float* rows, std::vector<Sampled>& sampled, uint64_t& n_accepted) {
    // Row j holds the logits after the last token and the first j drafts. Each draft is kept while
    // the model agrees (Sampler::sample_draft: greedy, when it is the best token; sampling, with the
    // probability the model gives it, else a token drawn from the rest, so the tokens have the
    // model's distribution); the first one it rejects is replaced by its token, and when all are
    // kept the last row gives one more. The sampler sees each token before the next row.
    const auto n_vocab = static_cast<size_t>(model_.n_vocab());
    const auto n_draft = static_cast<int>(s.draft.size());
    int emitted = 0;
    try {
        for (int j = 0; j <= n_draft; ++j) {
            const std::span<const float> logits(rows + static_cast<size_t>(j) * n_vocab, n_vocab);
            int32_t id = 0;
            bool kept = false;
            if (j == n_draft) {
                id = s.sampler.sample(logits);
            } else {
                const sampling::Sampler::DraftVerdict v =
                    s.sampler.sample_draft(logits, s.draft[static_cast<size_t>(j)]);
                id = v.token;
                kept = v.accepted;
            }
            s.sampler.accept(id);
            sampled.push_back({&s, id, {}});
            ++emitted;
            const bool eog = tokenizer_.vocab().is_eog(id);
            if (s.top_logprobs >= 0 && !eog) sampled.back().logprob = logprob_of(logits, id, s.top_logprobs);
            if (kept) ++n_accepted;
            // What ends the request ends the pass's tokens too (a stop string: accept_token).
            const bool ends = eog || s.n_generated + emitted >= s.max_tokens ||
                              static_cast<int>(s.tokens.size()) + emitted >= context_.n_ctx;
            if (!kept || ends) break;
        }
    } catch (const std::exception& e) {
        finish(s, FinishReason::error, e.what());
    }
    return emitted;
}

bool Scheduler::step() {
    // Cancelled requests leave first: their cells are free for this step.
    for (size_t i = 0; i < active_.size();) {
        if (active_[i]->job->cancelled()) {
            keep_prompt(*active_[i]);
            free_slot(active_[i]->seq);
            finish(*active_[i], FinishReason::cancelled);
            active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
            ++i;
        }
    }
    if (active_.empty()) return !preempted_.empty() ? false : true;
    std::sort(active_.begin(), active_.end(), [](const auto& a, const auto& b) { return a->order < b->order; });
    if (max_draft_ > 0) make_drafts();

    // The batch: one token of each decoding sequence, then prompt chunks, oldest first, up to
    // n_batch tokens. When the cache cannot hold it, the youngest sequence gives its cells back.
    std::vector<int> take(active_.size());
    while (true) {
        batch_tokens_.clear();
        batch_pos_.clear();
        batch_seq_.clear();
        batch_output_.clear();
        int budget = context_.n_batch;
        batch_order_.clear();
        for (size_t i = 0; i < active_.size(); ++i) {
            take[i] = active_[i]->unfed() == 1 ? 1 + static_cast<int>(active_[i]->draft.size()) : 0;
        }
        for (const int t : take) budget -= t;
        for (size_t i = 0; i < active_.size() && budget > 0; ++i) {
            if (take[i] != 0) continue;
            // A resumed sequence feeds its prompt in chunks, then the tokens it had generated one
            // a step, as it first did: the kernels' arithmetic depends on how many rows of a
            // sequence a pass holds, so only that gives back the logits, and the text, it had.
            const Sequence& s = *active_[i];
            const int limit = s.n_fed < s.n_prompt ? s.n_prompt - s.n_fed : 1;
            take[i] = std::min({s.unfed(), budget, limit});
            budget -= take[i];
        }
        for (size_t i = 0; i < active_.size(); ++i) {
            Sequence& s = *active_[i];
            const auto n_tokens = static_cast<int>(s.tokens.size());
            for (int t = 0; t < take[i]; ++t) {
                const int p = s.n_fed + t;  // past the tokens: a draft
                batch_tokens_.push_back(p < n_tokens ? s.tokens[static_cast<size_t>(p)]
                                                     : s.draft[static_cast<size_t>(p - n_tokens)]);
                batch_pos_.push_back(p);
                batch_seq_.push_back(s.seq);
                batch_output_.push_back(p + 1 >= n_tokens ? 1 : 0);
                batch_order_.push_back(s.draft.empty() ? 0 : 1);
            }
        }
        if (cache_.has_room(batch_seq_)) break;
        if (drop_drafts()) continue;  // before anything is evicted or preempted for them
        if (prompts_.evict()) continue;
        if (active_.size() == 1) {
            // Alone and still no room: its tokens outgrew the cache (n_ctx bounds prompt + max_tokens,
            // so only the window pools' rounding could do this).
            Sequence& s = *active_[0];
            free_slot(s.seq);
            finish(s, FinishReason::length);
            active_.clear();
            return true;
        }
        preempt(active_.size() - 1);
        take.resize(active_.size());
    }
    if (batch_tokens_.empty()) return false;
    // Draft passes in the one-token arithmetic (model::Batch::token_order_rows): each row's logits
    // are those decoding the tokens one a step gives, so greedy text does not change with drafts.
    const bool drafts = std::find(batch_order_.begin(), batch_order_.end(), uint8_t{1}) != batch_order_.end();

    const auto start = std::chrono::steady_clock::now();
    if (std::count_if(take.begin(), take.end(), [](int t) { return t > 0; }) > 1) spell_shared_ = true;
    try {
        std::lock_guard lock(compute_.mutex);
        model_.forward(
            {.tokens = batch_tokens_,
             .positions = batch_pos_,
             .seq_ids = batch_seq_,
             .output = batch_output_,
             .token_order_rows = drafts ? std::span<const uint8_t>(batch_order_) : std::span<const uint8_t>()},
            cache_, logits_.data(), compute_.pool);
    } catch (const std::exception& e) {
        // The pass failed (working memory over budget, ...): the batch's requests get the error,
        // the server goes on.
        for (size_t i = 0; i < active_.size(); ++i) {
            if (take[i] > 0) finish(*active_[i], FinishReason::error, e.what());
        }
        release_finished();
        return true;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    // Sample every sequence whose last token was fed (counted first, so that a request's end is
    // never seen before its tokens are counted); then pass the tokens on and drop the finished.
    const auto n_vocab = static_cast<size_t>(model_.n_vocab());
    size_t row = 0;
    uint64_t n_prompt_fed = 0, n_sampled = 0, n_drafted = 0, n_accepted = 0;
    std::vector<Sampled> sampled;
    std::vector<Sequence*> checked;  // sequences whose drafts this step checked
    for (size_t i = 0; i < active_.size(); ++i) {
        Sequence& s = *active_[i];
        if (take[i] == 0) continue;
        if (s.n_fed < s.n_prompt) n_prompt_fed += static_cast<uint64_t>(std::min(take[i], s.n_prompt - s.n_fed));
        if (!s.draft.empty()) {
            const int emitted = check_drafts(s, logits_.data() + row * n_vocab, sampled, n_accepted);
            row += s.draft.size() + 1;
            n_sampled += static_cast<uint64_t>(emitted);
            n_drafted += s.draft.size();
            // The cells of the last token and the drafts kept stay; the rejected ones go.
            s.n_fed += emitted;
            cache_.seq_rm(s.seq, s.n_fed, -1);
            s.draft.clear();
            checked.push_back(&s);
            continue;
        }
        s.n_fed += take[i];
        if (s.unfed() != 0) continue;
        const std::span<const float> logits(logits_.data() + row * n_vocab, n_vocab);
        ++row;
        try {
            const int32_t id = s.sampler.sample(logits);
            s.sampler.accept(id);
            sampled.push_back({&s, id, {}});
            ++n_sampled;
            if (s.top_logprobs >= 0 && !tokenizer_.vocab().is_eog(id)) {
                sampled.back().logprob = logprob_of(logits, id, s.top_logprobs);
            }
        } catch (const std::exception& e) {
            finish(s, FinishReason::error, e.what());
        }
    }
    recent_.emplace_back(std::chrono::steady_clock::now(), static_cast<int>(n_sampled));
    {
        std::lock_guard lock(mutex_);
        stats_.n_prompt_tokens += n_prompt_fed;
        stats_.n_generated_tokens += n_sampled;
        ++stats_.n_steps;
        stats_.busy_seconds += seconds;
        stats_.n_drafted += n_drafted;
        stats_.n_draft_accepted += n_accepted;
    }
    for (Sampled& e : sampled) {
        if (e.seq->finished) continue;  // a stop string (or an error) ended it before this token
        if (e.logprob) e.seq->job->add_logprob(std::move(*e.logprob));
        accept_token(*e.seq, e.id);
    }
    for (Sequence* s : checked) {
        // Ended before all it sampled was taken: its cells hold no more than its tokens.
        const auto n_tokens = static_cast<int>(s->tokens.size());
        if (s->n_fed > n_tokens) {
            s->n_fed = n_tokens;
            cache_.seq_rm(s->seq, s->n_fed, -1);
        }
    }
    release_finished();
    return true;
}

void Scheduler::release_finished() {
    for (size_t i = 0; i < active_.size();) {
        if (active_[i]->finished) {
            keep_prompt(*active_[i]);
            free_slot(active_[i]->seq);
            active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
            ++i;
        }
    }
}

void Scheduler::keep_prompt(const Sequence& s) {
    prompts_.keep(s.seq, std::span<const int32_t>(s.tokens).first(static_cast<size_t>(s.n_fed)));
}

bool Scheduler::sibling_feeding(const Sequence& s) const {
    // An admitted one of its group that has not fed the prompt's cells s takes (all but its
    // last token) yet; none: s is admitted as any request (the first finished, or was preempted).
    return std::any_of(active_.begin(), active_.end(),
                       [&](const auto& a) { return a->group == s.group && a->n_fed < s.n_prompt - 1; });
}

int Scheduler::reuse_prompt(Sequence& s) {
    // Without the prompt cache, only the requests of one submit_group() share their prompt.
    if (context_.n_cached_prompts == 0 && !s.sibling) return 0;
    // At least the last token is computed again: its logits give the next token.
    const size_t most = s.tokens.size() - 1;
    PromptCache::Prefix best = prompts_.longest_kept(s.tokens, most);
    // Requests still running share what they have fed too (the same system prompt, or a request
    // sent again while the first still generates).
    for (const auto& a : active_) {
        if (context_.n_cached_prompts == 0 && a->group != s.group) continue;
        prompts_.consider(best, a->seq, std::span<const int32_t>(a->tokens).first(static_cast<size_t>(a->n_fed)),
                          s.tokens, most);
    }
    return prompts_.take(s.seq, s.tokens, most, best);
}

void Scheduler::publish_stats() {
    // Throughput over the last kWindow seconds (0 when nothing ran in them).
    constexpr double kWindow = 5.0;
    const auto now = std::chrono::steady_clock::now();
    while (!recent_.empty() && std::chrono::duration<double>(now - recent_.front().first).count() > kWindow)
        recent_.pop_front();
    int n_recent = 0;
    for (const auto& r : recent_) n_recent += r.second;
    std::lock_guard lock(mutex_);
    stats_.tokens_per_second = n_recent / kWindow;
    stats_.n_active = static_cast<int>(active_.size());
    stats_.n_queued = static_cast<int>(queue_.size() + preempted_.size());
    stats_.kv_cells_used = cache_.pool(0).used_cells();
    stats_.draft_cells_used = 0;
    for (const auto& d : drafters_) stats_.draft_cells_used += d->cells_used();
    const PromptCache::Holdings h = prompts_.holdings();
    stats_.n_cached_prompts = h.n_kept;
    stats_.cached_prompt_tokens = h.kept_tokens;
    stats_.n_saved_prompts = h.n_saved;
    stats_.saved_prompt_bytes = h.saved_bytes;
    stats_.n_disk_prompts = h.n_disk;
    stats_.disk_prompt_bytes = h.disk_bytes;
}

}  // namespace fitllm::engine
