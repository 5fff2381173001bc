#pragma once
// Continuous batching for one model (no HTTP here): requests are sequences in one shared
// kv::ModelCache; one thread runs forward passes that mix them. Every step decodes one token of
// each sequence that is generating and feeds the next chunk of the prompts still coming in (up to
// n_batch tokens per step in all), so a long prompt does not stall the others. A request joins the
// running batch at the next step; a cancelled one leaves it (its cells freed) at the next step.
//
// KV pressure: a request is admitted only when the cache's free cells cover its tokens on top of
// what the running prompts still need. When a step does not fit anyway (decoding sequences grow),
// the youngest sequence is preempted: its cells are freed, its tokens (prompt and generated) kept,
// and it waits first in line to be fed again (recomputed) when room returns, then goes on where
// it stopped (its sampler state kept).
//
// Prompt cache (ContextConfig::n_cached_prompts > 0; engine/prompt_cache.h): a request that ends
// (finished, cancelled or preempted) leaves the cells of the tokens it fed under a sequence id of
// its own, with the token list they hold. A request admitted later starts from the longest prefix
// it shares with one of them, or with what a running request has fed so far: the cells are shared
// (kv::KvCache::seq_cp, copy on write), and only the rest of its prompt is computed. A preempted
// request so finds its own cells again when they were not needed. Kept prompts give their cells
// back, least recently used first, whenever a request needs room; they never hold more than the
// cache, so the KV budget is unchanged. With ContextConfig::prompt_cache_ram and
// prompt_cache_disk, what the KV cache evicts goes to host memory and then to files, and comes back
// bit for bit instead of being computed.
//
//   Scheduler sched(model, tokenizer, {.n_ctx = 4096, .n_seq = 4, .n_batch = 256}, {.max_queue = 64}, compute, &host);
//   std::shared_ptr<Job> job = sched.submit(prompt_ids, {.max_tokens = 64, .sampling = sp});
//   Job::Update u = job->wait_all();
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/drafter.h"
#include "engine/job.h"
#include "engine/lookup.h"
#include "engine/prompt_cache.h"
#include "engine/resources.h"
#include "fitllm/config.h"
#include "kv/cache.h"
#include "memory/pool.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "quant/ggml_type.h"
#include "sampling/sampling_params.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::engine {

struct SchedulerOptions {
    int max_queue = 64;  // requests that may wait for a slot; more get QueueFullError
    // The model file's identity (engine::model_file_identity()): with ContextConfig's
    // prompt_cache_disk and prompt_cache_dir, the prompt cache's files outlive the scheduler and a
    // later one of the same model file and KV layout takes them up (engine/prompt_cache.h).
    // 0: the files go with the scheduler.
    uint64_t prompt_cache_model = 0;
    // Speculative decoding by prompt lookup (engine/lookup.h; serve --lookup): each decoding
    // sequence drafts up to n_draft tokens from its own tokens, fed after its last token in the
    // step's batch with a row of logits each, and keeps what the model agrees with
    // (Sampler::sample_draft): the same text when greedy, the same distribution when sampling.
    // The rejected drafts' cells are taken back. Drafts take rows of logits beyond one a slot
    // (ContextConfig::n_outputs) and tokens of the batch; without either there are none.
    std::optional<LookupParams> lookup;
    // Speculative decoding with a draft model (serve -md; engine/drafter.h), not with lookup: each
    // slot has a ModelDrafter of its own (draft_context: the draft engine's context, one sequence;
    // its KV cache and row of logits charged to the device, Plan::draft_slots) that its decoding
    // sequence drafts with, greedily, before each step; the drafts are checked as lookup's are.
    // A sequence that leaves its slot (finished, cancelled, preempted) clears the slot's draft
    // cells; the next one there feeds the draft model what it lacks (a prefix the prompt cache
    // gave the model is computed again by the draft). nullptr: none. The draft model must have
    // the model's vocabulary (check_same_vocab) and outlive the scheduler.
    model::Model* draft_model = nullptr;
    ContextConfig draft_context;
    DraftParams draft;
    // Requests that come close together share the step that computes their prompts. When a
    // request comes to an idle scheduler (nothing is decoding, so no running request waits), the
    // previous busy spell (from idle to idle) decoded requests together, and slots are free for
    // more, the scheduler waits for the next request up to gather_gap after each one that comes,
    // gather_max in all, and stops waiting as soon as the slots are taken. Clients of a chat each
    // send their next turn a few milliseconds after their answers end together; without the wait
    // the first turn's prompt is computed alone and the others wait for that whole step before
    // theirs. Requests one at a time never wait (after the first, which follows requests that
    // came together). gather_gap 0: no waiting.
    std::chrono::milliseconds gather_gap{8};
    std::chrono::milliseconds gather_max{20};
};

struct GenerationParams {
    int max_tokens = 0;  // > 0
    sampling::SamplingParams sampling;
    std::vector<std::string> stop;  // generation ends before the first of these (not sent)
    // >= 0: each sampled token's log probability and this many alternatives go with the text
    // (Job::Update::logprobs); -1: none.
    int top_logprobs = -1;
    // The prompt's tokens count for the penalties (llama.cpp's repeat penalty); false: only the
    // generated ones (OpenAI's presence and frequency penalties, "the text so far").
    bool penalize_prompt = true;
    // With SchedulerOptions::lookup: the most tokens drafted per step for this request
    // (llama-server's speculative.n_max; -1: the scheduler's, 0: none, above it: the scheduler's),
    // and the fewest worth checking (speculative.n_min: a shorter draft is not fed).
    int draft_max = -1;
    int draft_min = 0;
    // With SchedulerOptions::draft_model: its drafting stops at a token it gives less than this
    // (llama-server's speculative.p_min; < 0: the scheduler's DraftParams::p_min).
    float draft_p_min = -1.0f;
};

// submit() when max_queue requests already wait.
class QueueFullError : public Error {
public:
    using Error::Error;
};

struct SchedulerStats {
    int n_active = 0;  // sequences holding a slot
    int n_queued = 0;  // waiting for a slot (new and preempted)
    int kv_cells_used = 0;
    int kv_cells_total = 0;
    uint64_t n_prompt_tokens = 0;     // prompt tokens fed (recomputed ones included)
    uint64_t n_generated_tokens = 0;  // tokens sampled
    uint64_t n_preemptions = 0;
    uint64_t n_prompt_tokens_cached = 0;  // prompt tokens taken from the prompt cache, not computed
    uint64_t n_cache_hits = 0;            // requests (and resumptions) that took a cached prefix
    uint64_t n_cache_evictions = 0;       // kept prompts dropped for room
    uint64_t n_cache_restores = 0;        // of the hits: prompts copied back from host memory
    int draft_cells_used = 0;             // the draft model's KV cells in use, all slots (-md)
    int n_saved_prompts = 0;              // kept prompts in host memory (--cache-ram)
    uint64_t saved_prompt_bytes = 0;      // their rows
    int n_disk_prompts = 0;               // kept prompts in files (--cache-disk)
    uint64_t disk_prompt_bytes = 0;       // their rows
    uint64_t n_disk_reads = 0;            // read back into host memory
    uint64_t n_disk_failures = 0;         // writes or reads that failed (the prompt dropped)
    uint64_t n_disk_loaded = 0;           // files of an earlier run taken up at the start
    uint64_t n_disk_foreign = 0;          // files there of another model, KV layout or version (skipped)
    uint64_t n_disk_bad = 0;              // files there truncated or corrupt (skipped)
    int n_cached_prompts = 0;             // prompts kept now
    int cached_prompt_tokens = 0;         // their tokens, summed (a prefix two of them share counts twice)
    uint64_t n_steps = 0;
    uint64_t n_drafted = 0;          // speculative decoding: tokens drafted and checked
    uint64_t n_draft_accepted = 0;   // of them, those the model agreed with (tokens without a pass)
    double busy_seconds = 0.0;       // in forward passes
    double tokens_per_second = 0.0;  // tokens sampled per second over the last few seconds
};

class Scheduler {
public:
    // The context's slots (n_seq sequences) share one cache of n_ctx tokens (engine/context.h),
    // which is also the most one request may hold; a forward pass holds at most n_batch tokens:
    // one per decoding sequence, the rest prompt chunks. The cache and the logits are made here,
    // charged to device's pools (nullptr: uncharged). model, tokenizer, compute and the device must
    // outlive the scheduler. Runs one forward pass of a full batch first, so that a model loaded with
    // a device charges its largest working memory now. Throws ConfigError for a context check()
    // refuses (or n_ctx 0), std::invalid_argument for bad options, memory::BudgetError when the
    // cache or the working memory does not fit the device (and what kv::ModelCache throws).
    Scheduler(model::Model& model, const tokenizer::Tokenizer& tokenizer, const ContextConfig& context,
              SchedulerOptions options, Compute& compute, memory::Device* device = nullptr);
    ~Scheduler();  // shutdown()
    // Stops the thread and finishes every request as cancelled; submit() then throws
    // QueueFullError. Idempotent.
    void shutdown();
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Queues a request. Throws std::invalid_argument for an empty prompt, a prompt plus
    // max_tokens over n_ctx (the message has the numbers), sampling::SamplingError for bad
    // sampling parameters, QueueFullError when the queue is full.
    std::shared_ptr<Job> submit(std::vector<int32_t> prompt, GenerationParams params);
    // Queues n requests of one prompt (an API request's n choices), params[i] the i-th's (its
    // seed, say), a sequence each: the prompt is computed once. The first is admitted as any
    // request; the others wait until it has fed all but the prompt's last token, then take
    // those cells from it (kv::KvCache::seq_cp, copy on write), with or without the prompt cache,
    // and compute only the last token (its logits give their first token). Throws as submit(),
    // and QueueFullError unless all of them fit the queue (none is queued then).
    std::vector<std::shared_ptr<Job>> submit_group(std::vector<int32_t> prompt, std::vector<GenerationParams> params);

    SchedulerStats stats() const;
    bool idle() const;  // nothing running or waiting
    const ContextConfig& context() const { return context_; }
    // The KV cache every request shares (its bookkeeping belongs to the scheduler thread).
    const kv::ModelCache& cache() const { return cache_; }
    // The prompt cache (its notes(), persistent(); the rest belongs to the scheduler thread).
    const PromptCache& prompt_cache() const { return prompts_; }
    int n_ctx() const { return context_.n_ctx; }
    size_t kv_bytes() const { return kv_bytes_; }
    // The vocabulary as a grammar sees it (sampling/grammar.h), built on first use and kept (a few
    // MiB for a large vocabulary), charged to the budget's "overhead" pool while the scheduler
    // lives. submit() gives it to a request with a grammar. Throws memory::BudgetError when the
    // budget has no room for it (a later call tries again).
    std::shared_ptr<const sampling::GrammarVocab> grammar_vocab() const;

private:
    struct Sequence;
    void keep_prompt(const Sequence& s);
    // A sequence left slot seq: its cells (and its draft model's) freed, the id free again.
    void free_slot(kv::SeqId seq);
    int reuse_prompt(Sequence& s);  // the tokens of s now in the cache (cells shared with a kept prompt)
    bool sibling_feeding(const Sequence& s) const;  // an admitted one of s's group still feeds the prompt
    void warm_up();
    void loop();
    // In loop(), the lock held: waits for requests coming together (SchedulerOptions::gather_gap).
    void gather(std::unique_lock<std::mutex>& lock);
    void admit();
    bool step();
    void finish(Sequence& s, FinishReason reason, std::string error = {});
    void preempt(size_t active_index);
    void release_finished();                     // finished sequences leave their slots and cells
    void accept_token(Sequence& s, int32_t id);  // the sampler has seen it
    // Speculative decoding: a token sampled in a step, taken after every sequence sampled.
    struct Sampled {
        Sequence* seq;
        int32_t id;
        std::optional<TokenLogprob> logprob;
    };
    void make_drafts();                            // each decoding sequence's drafts for this step
    void draft_with_model(Sequence& s, int most);  // s's drafts from its slot's ModelDrafter
    bool drop_drafts();                            // false when there were none
    // The tokens of s's draft pass (rows: its 1 + draft.size() rows of logits), into sampled;
    // returns how many (the drafts kept, and the model's token after them).
    int check_drafts(Sequence& s, const float* rows, std::vector<Sampled>& sampled, uint64_t& n_accepted);
    void publish_stats();

    model::Model& model_;
    const tokenizer::Tokenizer& tokenizer_;
    ContextConfig context_;  // n_batch at least n_seq
    SchedulerOptions options_;
    Compute& compute_;
    kv::ModelCache cache_;
    size_t kv_bytes_ = 0;
    PromptCache prompts_;  // kept prompts' cells, host memory and files (scheduler thread)

    // Only the scheduler thread touches these.
    std::vector<std::unique_ptr<Sequence>> active_;    // holding a sequence id
    std::deque<std::unique_ptr<Sequence>> preempted_;  // oldest first
    std::vector<kv::SeqId> free_ids_;
    memory::PoolBuffer<float> logits_;  // n_rows_ rows: one per slot, more for drafts
    int n_rows_ = 1;
    int max_draft_ = 0;  // drafts per sequence and step at most (0: no speculative decoding)
    std::vector<std::unique_ptr<ModelDrafter>> drafters_;  // SchedulerOptions::draft_model: one per slot
    std::vector<uint8_t> batch_order_;  // the rows of drafting sequences (model::Batch::token_order_rows)
    std::vector<int32_t> batch_tokens_, batch_pos_;
    std::vector<kv::SeqId> batch_seq_;
    std::vector<uint8_t> batch_output_;
    std::deque<std::pair<std::chrono::steady_clock::time_point, int>> recent_;  // (step end, tokens sampled)
    // gather(): this busy spell (since the scheduler was last idle) had a step of two sequences or
    // more.
    bool spell_shared_ = false;

    mutable std::mutex mutex_;  // guards the fields below
    std::condition_variable cv_;
    std::deque<std::unique_ptr<Sequence>> queue_;  // new requests
    int n_waiting_ = 0;  // requests in preempted_ (the scheduler's waiting line), for the queue bound
    // Requests submitted and not yet finished: dropped before a job's client hears of its end, so
    // that idle() is true once the last client has its answer (the stats catch up a pass later).
    int n_unfinished_ = 0;
    bool stopping_ = false;
    uint64_t next_order_ = 0;
    SchedulerStats stats_;
    std::thread thread_;
    mutable std::once_flag grammar_vocab_once_;
    mutable std::shared_ptr<const sampling::GrammarVocab> grammar_vocab_;
    memory::Pool* overhead_pool_ = nullptr;
    mutable memory::Charge grammar_vocab_charge_;
};

}  // namespace fitllm::engine
