#pragma once
// The endpoints that do the work, private to server/ (http_server.cpp routes to them): each
// reads an HttpRequest and fills an HttpResponse, or throws ApiError. What a request makes the
// server hold is bounded before it is built and charged to the registry's host device:
// the parsed JSON (json_body.h), the prompt (refused by its size before it is tokenized whole,
// prompt_bounds.h) and the tokenizer's work (request_memory.h).
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/model_registry.h"

namespace fitllm::server {

struct Answer;
struct Completion;
struct CompletionRequest;
class RequestMemory;

// The longest token of each loaded model's vocabulary (prompt_bounds.h), found once per load.
class LongestTokens {
public:
    size_t of(const std::shared_ptr<LoadedModel>& model);

private:
    std::mutex mutex_;
    std::map<std::string, std::pair<std::weak_ptr<LoadedModel>, size_t>> known_;
};

class Endpoints {
public:
    Endpoints(ModelRegistry& registry, Metrics& metrics) : registry_(registry), metrics_(metrics) {}

    void tokenize(HttpRequest& req, HttpResponse& res);
    void detokenize(HttpRequest& req, HttpResponse& res);
    // POST /v1/chat/completions (chat) and /v1/completions, whole or streamed.
    void completion(bool chat, HttpRequest& req, HttpResponse& res);
    // Ollama's POST /api/chat (chat) and /api/generate, whole or streamed as NDJSON (a request's
    // keep_alive sets its model's idle time: ModelRegistry::set_keep_alive), and GET /api/tags.
    void ollama(bool chat, HttpRequest& req, HttpResponse& res);
    void ollama_tags(HttpResponse& res);
    // Ollama's POST /api/show: a model's details, metadata (model_info, arrays as null) and chat
    // template, read from its file's header (the model need not be loaded).
    void ollama_show(HttpRequest& req, HttpResponse& res);
    // Ollama's GET /api/ps: the loaded models, their planned size (size_vram: the offload
    // device's share) and when they unload if idle.
    void ollama_ps(HttpResponse& res);
    // Ollama's model management on a --models-dir server (ModelRegistry::put_model,
    // remove_model): POST /api/copy {source, destination} (the new name a hard link to the file,
    // or a symbolic link where the file system has none), DELETE /api/delete {model}, POST
    // /api/create {model, from, system, parameters, license} (from: a model here or a GGUF file
    // the server can read; status lines streamed unless stream is false). A created model's
    // system and parameters are the defaults of its requests, Ollama's and OpenAI's
    // (server/model_settings.h).
    void ollama_copy(HttpRequest& req, HttpResponse& res);
    void ollama_delete(HttpRequest& req, HttpResponse& res);
    void ollama_create(HttpRequest& req, HttpResponse& res);
    // POST /api/pull and /api/push: fitllm downloads and uploads nothing. A pull of a model it has
    // answers success (up to date, as Ollama answers); any other is 404 saying how to add one. A
    // push is 501.
    void ollama_pull(bool push, HttpRequest& req, HttpResponse& res);

private:
    memory::Pool* request_pool();
    // Renders or tokenizes the request's prompt for c.model (refused by its size first) and
    // submits its jobs: request.n choices of one prompt, computed once (Scheduler::submit_group).
    void submit(Completion& c, CompletionRequest& request, RequestMemory& memory);
    // Waits for every choice's whole answer; std::nullopt when the client went away (the jobs
    // cancelled). Throws ApiError when generation failed or the texts are over budget.
    std::optional<std::vector<Answer>> wait_whole(Completion& c, HttpRequest& req);
    // wait_whole(), then the answer as `render` writes it (200), or 499 when the client went away.
    void send_whole(Completion& c, HttpRequest& req, HttpResponse& res,
                    nlohmann::json (*render)(const Completion&, const std::vector<Answer>&));
    // A choice ended: the model touched, its tokens counted (the prompt with the first choice only).
    void finished(const Completion& c, const Job::Update& u, bool first = true);

    ModelRegistry& registry_;
    Metrics& metrics_;
    LongestTokens longest_;
};

// JSON text the way every answer writes it (invalid UTF-8 replaced, never thrown on).
std::string dump_json(const nlohmann::json& j);
void set_json(HttpResponse& res, int status, const nlohmann::json& body);

}  // namespace fitllm::server
