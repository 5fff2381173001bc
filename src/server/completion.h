#pragma once
// What the completion endpoints share, private to server/ (endpoints.cpp for the OpenAI ones,
// ollama_endpoints.cpp for Ollama's): a completion ready to run, how often a running request
// looks at its client, and a request's body read as JSON with its memory charged.
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/job.h"
#include "memory/pool.h"
#include "server/chat_output.h"
#include "server/http_transport.h"
#include "server/model_registry.h"

namespace fitllm::server {

class RequestMemory;

// One choice's whole answer (Endpoints::wait_whole): its last update (finish reason, counts),
// its text and its log probabilities.
struct Answer {
    Job::Update end;
    std::string text;
    std::vector<engine::TokenLogprob> logprobs;
};

// A chat or text completion, ready to run: the model and the jobs, one per choice (n).
struct Completion {
    std::shared_ptr<LoadedModel> model;
    bool chat = false;
    bool stream = false;
    bool include_usage = false;
    bool ollama_chat = false;                // Ollama's /api/chat (its answers carry a message, not a response)
    std::vector<std::shared_ptr<Job>> jobs;  // the choices in order (Ollama's: one)
    std::string id;
    int64_t created = 0;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    std::optional<std::chrono::steady_clock::time_point> first_text;  // when its first text came
    int top_logprobs = -1;                                            // >= 0: log probabilities asked for
    std::optional<OutputOptions> output;  // chat: reasoning and tool calls split out (chat_output.h)
    memory::Charge grammar;               // structured output: its matchers' memory, while they run

    void cancel() const {
        for (const auto& job : jobs) job->cancel();
    }
};

// How often a running request looks whether its client is still there.
inline constexpr std::chrono::milliseconds kPoll{100};

// The body of a request as JSON, its memory charged to `memory` while `charge` lives.
nlohmann::json parse_charged(const HttpRequest& req, RequestMemory& memory, memory::Charge& charge);

}  // namespace fitllm::server
