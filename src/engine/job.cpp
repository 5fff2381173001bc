#include "engine/job.h"

namespace fitllm::engine {

const char* finish_reason_name(FinishReason reason) {
    switch (reason) {
        case FinishReason::none:
            return "none";
        case FinishReason::stop:
            return "stop";
        case FinishReason::length:
            return "length";
        case FinishReason::cancelled:
            return "cancelled";
        case FinishReason::error:
            return "error";
    }
    return "?";
}

Job::Update Job::take_locked() {
    Update u;
    u.pieces.swap(pending_);
    u.logprobs.swap(pending_logprobs_);
    for (const std::string& p : u.pieces) u.text += p;
    u.finished = finished_;
    u.reason = reason_;
    u.error = error_;
    u.n_prompt = n_prompt_;
    u.n_generated = n_generated_;
    u.n_preemptions = n_preemptions_;
    u.n_cached = n_cached_;
    return u;
}

Job::Update Job::wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return finished_ || !pending_.empty(); });
    return take_locked();
}

Job::Update Job::wait_all() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return finished_; });
    return take_locked();
}

void Job::cancel() {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
}

bool Job::cancelled() const {
    std::lock_guard lock(mutex_);
    return cancelled_;
}

void Job::append(std::string_view text, int n_generated) {
    {
        std::lock_guard lock(mutex_);
        if (!text.empty()) pending_.emplace_back(text);
        n_generated_ = n_generated;
    }
    cv_.notify_all();
}

void Job::add_logprob(TokenLogprob logprob) {
    std::lock_guard lock(mutex_);
    pending_logprobs_.push_back(std::move(logprob));
}

void Job::note_preempted() {
    std::lock_guard lock(mutex_);
    ++n_preemptions_;
}

void Job::note_cached(int n_tokens) {
    std::lock_guard lock(mutex_);
    n_cached_ = n_tokens;
}

void Job::finish(FinishReason reason, std::string error) {
    {
        std::lock_guard lock(mutex_);
        if (finished_) return;
        finished_ = true;
        reason_ = reason;
        error_ = std::move(error);
    }
    cv_.notify_all();
}

}  // namespace fitllm::engine
