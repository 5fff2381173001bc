#pragma once
// The HTTP API of `fitllm serve`, on cpp-httplib: OpenAI-compatible completions (whole or as
// server-sent events), models, tokenize/detokenize, health, Prometheus metrics, the memory report
// and the web page. Every error is an OpenAI-style JSON body ({"error": {message, type, code}})
// with a 4xx/5xx status; the server keeps serving.
//
//   HttpServer server(registry, {.api_key = "secret"});
//   server.listen("127.0.0.1", 8080);  // blocks until stop() (from another thread or a signal)
#include <memory>
#include <string>

#include "server/metrics.h"
#include "server/model_registry.h"

namespace httplib {
class Server;
}

namespace fitllm::server {

struct HttpOptions {
    std::string api_key;  // non-empty: every endpoint but / and /health wants "Authorization: Bearer KEY"
    int n_threads = 0;    // HTTP worker threads (each streaming client holds one); 0: enough for slots + queue
};

class HttpServer {
public:
    HttpServer(ModelRegistry& registry, HttpOptions options);
    ~HttpServer();

    // Binds and serves until stop(). port 0 picks a free port (bound_port() tells which once
    // is_running()). Returns false when the address cannot be bound.
    bool listen(const std::string& host, int port);
    bool bind(const std::string& host, int port);  // bind only; then listen_after_bind()
    bool listen_after_bind();
    int bound_port() const { return port_; }
    void stop();
    bool is_running() const;

private:
    void routes();
    ModelRegistry& registry_;
    HttpOptions options_;
    Metrics metrics_;
    std::unique_ptr<httplib::Server> http_;
    int port_ = 0;
};

}  // namespace fitllm::server
