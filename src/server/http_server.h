#pragma once
// The HTTP API of `fitllm serve`: OpenAI-compatible completions (whole or as server-sent
// events), models, tokenize/detokenize, health, Prometheus metrics, the memory report and the web
// page, and Ollama's chat, generate (whole or NDJSON), tags and version, over
// server/http_transport.h. Every error is an OpenAI-style JSON body
// ({"error": {message, type, code}}) with a 4xx/5xx status; the server keeps serving.
// Before a request's body is read, its Host and Origin are checked (server/web_safety.h), then
// the API key; its memory is charged to the registry's host device (server/request_memory.h).
//
//   HttpServer server(registry, {.api_key = "secret"});
//   server.listen("127.0.0.1", 8080);  // blocks until stop() (from another thread or a signal)
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/model_registry.h"

namespace fitllm::server {

// The flags of `fitllm serve` that shape the HTTP side.
struct HttpOptions {
    std::string api_key;         // non-empty: every endpoint but / and /health wants "Authorization: Bearer KEY"
    int n_threads = 0;           // worker threads (each running request holds one); 0: enough for slots + queue
    uint64_t max_body = 0;       // --max-body: the largest request body; 0: default_max_body(n_ctx)
    int request_timeout = 30;    // --request-timeout: seconds for a whole request (headers and body) to arrive
    int max_connections = 1024;  // --max-connections
    int max_connections_per_client = 256;    // --max-connections-per-client (per client address)
    std::vector<std::string> allowed_hosts;  // --allowed-hosts: Host names besides the served addresses; "*" any
    std::vector<std::string> cors_origins;   // --cors-origin: "*" any, "none"; empty: this machine's pages
};

// The default body limit for a context of n_ctx tokens: 256 bytes of JSON per token (the longest
// token pieces, escaped), at least 1 MiB.
uint64_t default_max_body(int n_ctx);

class HttpServer {
public:
    HttpServer(ModelRegistry& registry, HttpOptions options);
    ~HttpServer();

    // Binds and serves until stop(). port 0 picks a free port (bound_port() tells which once
    // is_running()). Returns false when the address cannot be bound.
    bool listen(const std::string& host, int port);
    bool bind(const std::string& host, int port);  // bind only; then listen_after_bind()
    bool listen_after_bind();
    int bound_port() const;
    void stop();
    bool is_running() const;

private:
    class Handler;
    std::unique_ptr<Handler> handler_;
};

}  // namespace fitllm::server
