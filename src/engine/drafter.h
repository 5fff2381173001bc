#pragma once
// The drafters of speculative decoding (Session::generate_speculative): what proposes the tokens
// one forward pass of the target model checks. Two of them: prompt lookup (engine/lookup.h), and
// a draft model, a smaller model with the same vocabulary that proposes greedily from a KV cache
// of its own (ModelDrafter). The target keeps what it agrees with (sampling::Sampler::sample_draft),
// so the output is what Session::generate gives either way: the same tokens when greedy, the same
// distribution when sampling; a better drafter only makes it sooner.
//
//   engine::ModelDrafter drafter(draft.model(), engine::draft_context(context), draft.threads(),
//                                {.n_draft = 8}, &draft.host());
//   session.generate_speculative(prompt, 64, sampler, drafter, is_eog, on_token);
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/lookup.h"
#include "engine/session.h"
#include "fitllm/config.h"
#include "memory/device.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "tokenizer/vocab.h"

namespace fitllm::engine {

class Drafter {
public:
    virtual ~Drafter() = default;
    // The tokens drafted per forward pass at most (--draft-max).
    virtual int n_draft() const = 0;
    // history: every token of the target's context so far, the last one not yet fed to it.
    // Writes up to max_tokens tokens that may follow to out and returns how many (0: nothing to
    // propose; the target then decodes one token).
    virtual int draft(std::span<const int32_t> history, int max_tokens, std::vector<int32_t>& out) = 0;
};

// Prompt lookup (lookup_draft) behind the Drafter interface.
class LookupDrafter final : public Drafter {
public:
    explicit LookupDrafter(const LookupParams& params) : params_(params) { check(params_); }
    int n_draft() const override { return params_.n_draft; }
    int draft(std::span<const int32_t> history, int max_tokens, std::vector<int32_t>& out) override {
        return lookup_draft(history, params_, max_tokens, out);
    }

private:
    LookupParams params_;
};

struct DraftParams {
    int n_draft = 8;      // tokens drafted per forward pass at most (--draft-max)
    int n_min = 0;        // a draft of fewer tokens is not checked: one token is decoded instead (--draft-min)
    float p_min = 0.75f;  // drafting stops at a token the draft model gives less (--draft-p-min)
    // > 0: the draft model scores only the first n_vocab tokens of the vocabulary (--draft-vocab):
    // its output layer costs n_vocab / vocabulary size as much, and it drafts no other token (on
    // vocabularies ordered by merge rank or score, the first tokens are the common ones). 0: all.
    int n_vocab = 0;
};
// Throws ConfigError naming the option: n_draft < 1, n_min outside 0..n_draft, p_min outside 0..1,
// n_vocab < 0.
void check(const DraftParams& params);

// The draft model's context for a target's: one sequence, the same n_ctx (resolved first), batch
// size, threads and K/V settings, one row of logits, no context shift, no spill, no prompt cache.
ContextConfig draft_context(const ContextConfig& target);

// Throws ConfigError naming both files when the vocabularies differ (size, or the first token
// whose text differs): drafts are token ids, so the draft model must spell them as the target.
void check_same_vocab(const tokenizer::Vocab& target, const std::string& target_path, const tokenizer::Vocab& draft,
                      const std::string& draft_path);

// A draft model proposing greedily: its most likely token, then the next after it, up to the
// tokens asked for, stopping early at a token whose probability is below p_min. It keeps a
// Session of its own in step with the target: before each draft it takes back what the history
// no longer has (the rejected drafts, or a context the target shifted: then it starts over) and
// feeds what it lacks. A history longer than its context gets no draft. The session's cache and
// logits are charged to device (nullptr: uncharged).
class ModelDrafter final : public Drafter {
public:
    ModelDrafter(model::Model& model, const ContextConfig& context, ops::ThreadPool& pool, const DraftParams& params,
                 memory::Device* device = nullptr);
    int n_draft() const override { return params_.n_draft; }
    int draft(std::span<const int32_t> history, int max_tokens, std::vector<int32_t>& out) override {
        return draft(history, max_tokens, out, params_.p_min);
    }
    // draft() stopping at a token whose probability is below p_min instead (< 0: params' p_min).
    int draft(std::span<const int32_t> history, int max_tokens, std::vector<int32_t>& out, float p_min);

    // Tokens the draft model fed to catch up with the history, and drafted (fed or not).
    int64_t n_fed() const { return n_fed_; }
    int64_t n_proposed() const { return n_proposed_; }
    // Seconds spent in draft() (the draft model's forward passes and picking its tokens).
    double seconds() const { return seconds_; }
    // Forgets what the session holds (its cells freed): the next draft() feeds the whole history.
    void reset() { session_.reset(); }
    // The KV cells the session holds (its first pool's).
    int cells_used() const { return session_.cache().pool(0).used_cells(); }

private:
    DraftParams params_;
    Session session_;
    int slack_;  // the most drafts taken back at once: the window pools keep that many positions more
    int64_t n_fed_ = 0;
    int64_t n_proposed_ = 0;
    double seconds_ = 0.0;
};

}  // namespace fitllm::engine
