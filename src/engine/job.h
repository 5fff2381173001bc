#pragma once
// One request's channel between the scheduler thread (which produces its text) and the HTTP
// handler (which waits for it). Thread-safe.
//
//   std::shared_ptr<Job> job = scheduler.submit(...);
//   while (true) {
//       Job::Update u = job->wait(std::chrono::milliseconds(100));
//       send(u.text);
//       if (u.finished) break;
//   }
//   job->cancel();  // the client went away: the scheduler frees its slot before its next step
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fitllm::engine {

enum class FinishReason {
    none,       // still running
    stop,       // an end-of-generation token or a stop string
    length,     // max_tokens, or the context is full
    cancelled,  // cancel() or the server stopping
    error,      // see Update::error
};
// "stop", "length", ... as OpenAI's finish_reason (cancelled and error have no OpenAI name).
const char* finish_reason_name(FinishReason reason);

// A sampled token's log probability under the model's distribution (the log-softmax of its
// logits, before any sampling step), with the most likely tokens' (best first), when asked for.
struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top;
};

class Job {
public:
    struct Update {
        std::string text;                 // new text since the previous wait()
        std::vector<std::string> pieces;  // the same, as the scheduler appended it (a token's text each)
        bool finished = false;
        FinishReason reason = FinishReason::none;
        std::string error;  // with FinishReason::error
        int n_prompt = 0;   // tokens of the prompt
        int n_generated = 0;
        int n_preemptions = 0;               // times the scheduler took the sequence's KV cells back
        int n_cached = 0;                    // prompt tokens taken from the prompt cache (not computed)
        std::vector<TokenLogprob> logprobs;  // of the tokens sampled since the previous wait(), when asked for
    };

    explicit Job(int n_prompt) : n_prompt_(n_prompt) {}

    // --- the consumer -------------------------------------------------------------------------
    // Waits until there is new text or the job finished (or the timeout passed) and takes it.
    Update wait(std::chrono::milliseconds timeout);
    // Everything at once: waits until the job finished.
    Update wait_all();
    void cancel();
    bool cancelled() const;

    // --- the scheduler ------------------------------------------------------------------------
    void append(std::string_view text, int n_generated);
    void add_logprob(TokenLogprob logprob);  // before the token's append()
    void note_preempted();
    void note_cached(int n_tokens);
    void finish(FinishReason reason, std::string error = {});

private:
    Update take_locked();

    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<std::string> pending_;
    std::vector<TokenLogprob> pending_logprobs_;
    bool finished_ = false;
    bool cancelled_ = false;
    FinishReason reason_ = FinishReason::none;
    std::string error_;
    int n_prompt_ = 0;
    int n_generated_ = 0;
    int n_preemptions_ = 0;
    int n_cached_ = 0;
};

}  // namespace fitllm::engine
