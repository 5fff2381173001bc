#include "server/http_server.h"

#include <malloc.h>

#include <algorithm>
#include <optional>
#include <string_view>

#include "fitllm/version.h"
#include "server/api_error.h"
#include "server/endpoints.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/request_memory.h"
#include "server/web_page.h"
#include "server/web_safety.h"

namespace fitllm::server {
namespace {

using nlohmann::json;

enum class Route {
    page,
    health,
    models,
    memory,
    metrics,
    tokenize,
    detokenize,
    chat,
    completions,
    ollama_version,
    ollama_tags,
    ollama_chat,
    ollama_generate,
    ollama_show,
    ollama_ps,
    ollama_copy,
    ollama_delete,
    ollama_create,
    ollama_pull,
    ollama_push,
    ollama_embed,
};

struct RouteInfo {
    Route route;
    const char* method;
    const char* path;
    bool open;   // answered without the API key
    bool quick;  // answered on the I/O thread, even while every worker is busy
};

constexpr RouteInfo kRoutes[] = {
    {Route::page, "GET", "/", true, true},
    {Route::health, "GET", "/health", true, true},
    {Route::models, "GET", "/v1/models", false, false},
    {Route::memory, "GET", "/v1/memory", false, false},
    {Route::metrics, "GET", "/metrics", false, false},
    {Route::tokenize, "POST", "/tokenize", false, false},
    {Route::detokenize, "POST", "/detokenize", false, false},
    {Route::chat, "POST", "/v1/chat/completions", false, false},
    {Route::completions, "POST", "/v1/completions", false, false},
    {Route::ollama_version, "GET", "/api/version", false, true},
    {Route::ollama_tags, "GET", "/api/tags", false, false},
    {Route::ollama_chat, "POST", "/api/chat", false, false},
    {Route::ollama_generate, "POST", "/api/generate", false, false},
    {Route::ollama_show, "POST", "/api/show", false, false},
    {Route::ollama_ps, "GET", "/api/ps", false, false},
    {Route::ollama_copy, "POST", "/api/copy", false, false},
    {Route::ollama_delete, "DELETE", "/api/delete", false, false},
    {Route::ollama_create, "POST", "/api/create", false, false},
    {Route::ollama_pull, "POST", "/api/pull", false, false},
    {Route::ollama_push, "POST", "/api/push", false, false},
    {Route::ollama_embed, "POST", "/api/embed", false, true},
    {Route::ollama_embed, "POST", "/api/embeddings", false, true},
};

// Ollama's endpoints answer errors as Ollama does: {"error": "message"}.
bool is_ollama(const std::string& path) {
    return path.rfind("/api/", 0) == 0;
}

const RouteInfo* find_route(std::string_view path) {
    for (const RouteInfo& r : kRoutes) {
        if (path == r.path) return &r;
    }
    return nullptr;
}

// The metrics' endpoint label: the route, or "other" (unknown paths must not grow the labels).
std::string endpoint_label(const HttpRequest* req) {
    const RouteInfo* r = req ? find_route(req->path) : nullptr;
    return r ? r->path : "other";
}

const char* error_type(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 403:
            return "permission_error";
        case 429:
        case 503:
            return "server_busy";
        default:
            return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

}  // namespace

uint64_t default_max_body(int n_ctx) {
    return std::max<uint64_t>(uint64_t{1} << 20, static_cast<uint64_t>(std::max(n_ctx, 0)) * 256);
}

class HttpServer::Handler : public HttpHandler {
public:
    Handler(ModelRegistry& registry, HttpOptions options)
        : registry_(registry), options_(std::move(options)), endpoints_(registry_, metrics_) {}

    bool bind(const std::string& host, int port) {
        safety_ = std::make_unique<WebSafety>(WebSafetyOptions{
            .bind_host = host, .allowed_hosts = options_.allowed_hosts, .cors_origins = options_.cors_origins});
        const RegistryOptions& ro = registry_.options();
        const int n_workers = options_.n_threads > 0
                                  ? options_.n_threads
                                  : std::clamp(ro.context.n_seq + ro.scheduler.max_queue + 8, 16, 512);
        const TransportLimits limits{
            .max_body = options_.max_body > 0 ? options_.max_body : default_max_body(ro.context.n_ctx),
            .request_timeout = std::chrono::seconds(std::max(1, options_.request_timeout)),
            .max_connections = std::max(1, options_.max_connections),
            .max_connections_per_client = std::max(1, options_.max_connections_per_client),
            .n_workers = n_workers,
            .max_waiting = n_workers,
        };
        transport_ = std::make_unique<HttpTransport>(*this, limits, &registry_.device().pool(kRequestPool));
        return transport_->bind(host, port);
    }

    HttpTransport* transport() { return transport_.get(); }

    bool admit(const HttpRequest& head, HttpResponse& res) override {
        const RouteInfo* route = find_route(head.path);
        const std::string* host = head.header("Host");
        std::optional<ApiError> refusal;
        if (!safety_->host_allowed(host)) {
            refusal = ApiError(403, error_type(403), "host_not_allowed",
                               "the Host '" + (host ? *host : std::string()) +
                                   "' is not an address this server serves (a web page whose name was re-resolved "
                                   "to this machine sends its own name); to accept it, start the server with "
                                   "--allowed-hosts NAME");
        } else if (const std::string* origin = head.header("Origin");
                   safety_->check_origin(origin, host) == OriginVerdict::refused) {
            refusal = ApiError(403, error_type(403), "origin_not_allowed",
                               "requests from the web origin '" + *origin +
                                   "' are refused; to allow a page there to use this server, start it with "
                                   "--cors-origin " +
                                   *origin);
        } else if (!route) {
            refusal = ApiError(404, error_type(404), "not_found", "no endpoint " + head.method + " " + head.path);
        } else if (head.method == "OPTIONS") {
            return true;  // a CORS preflight, answered by handle()
        } else if (head.method != route->method) {
            refusal = ApiError(405, error_type(405), "method_not_allowed",
                               head.method + " " + head.path + ": this endpoint takes " + route->method);
            res.headers.emplace_back("Allow", std::string(route->method) + ", OPTIONS");
        } else if (!route->open && !options_.api_key.empty() &&
                   !bearer_matches(head.header("Authorization"), options_.api_key)) {
            refusal = ApiError(401, error_type(401), "invalid_api_key",
                               head.header("Authorization") ? "invalid API key"
                                                            : "missing API key: send the header 'Authorization: "
                                                              "Bearer KEY'");
        }
        if (!refusal) return true;
        answer_error(head, res, *refusal);
        metrics_.count_request(endpoint_label(&head), res.status);
        metrics_.count_rejection(refusal->code());
        return false;
    }

    bool needs_worker(const HttpRequest& req) const override {
        const RouteInfo* route = find_route(req.path);
        return !(req.method == "OPTIONS" || (route && route->quick));
    }

    void handle(HttpRequest& req, HttpResponse& res) override {
        const RouteInfo* route = find_route(req.path);
        try {
            if (req.method == "OPTIONS") {
                preflight(req, res);
            } else {
                dispatch(route->route, req, res);
            }
        } catch (const ApiError& e) {
            if (e.status() == 429) metrics_.count_rejection("queue_full");
            if (e.status() == 503 || e.status() == 507) metrics_.count_rejection(e.code());
            if (e.status() == 413) metrics_.count_rejection(e.code());
            res = HttpResponse{};
            answer_error(req, res, e);
        } catch (const std::exception& e) {
            res = HttpResponse{};
            answer_error(req, res,
                         ApiError(500, "server_error", "internal_error", std::string("internal error: ") + e.what()));
        }
        add_cors(req, res);
        metrics_.count_request(endpoint_label(&req), res.status);
    }

    void refused(const HttpRequest* head, int status, std::string_view code) override {
        metrics_.count_request(endpoint_label(head), status);
        metrics_.count_rejection(std::string(code));
    }

    std::string error_body(int status, std::string_view code, const std::string& message) override {
        return dump_json(server::error_body(message, error_type(status), std::string(code)));
    }

private:
    void answer_error(const HttpRequest& req, HttpResponse& res, const ApiError& e) {
        set_json(res, e.status(), is_ollama(req.path) ? json{{"error", e.what()}} : e.body());
        if (e.status() == 429 || e.status() == 503) res.headers.emplace_back("Retry-After", "1");
        add_cors(req, res);
    }

    // An allowed cross-origin request's answer carries the CORS headers.
    void add_cors(const HttpRequest& req, HttpResponse& res) const {
        const std::string* origin = req.header("Origin");
        if (safety_->check_origin(origin, req.header("Host")) != OriginVerdict::cross_origin) return;
        for (auto& h : safety_->cors_headers(*origin)) {
            if (std::none_of(res.headers.begin(), res.headers.end(),
                             [&](const auto& x) { return x.first == h.first; })) {
                res.headers.push_back(std::move(h));
            }
        }
    }

    void preflight(const HttpRequest& req, HttpResponse& res) const {
        res.status = 204;
        res.content_type.clear();
        const std::string* origin = req.header("Origin");
        if (safety_->check_origin(origin, req.header("Host")) == OriginVerdict::cross_origin) {
            res.headers = safety_->preflight_headers(*origin, req.header("Access-Control-Request-Headers"));
        }
        res.headers.emplace_back("Allow", std::string(find_route(req.path)->method) + ", OPTIONS");
    }

    void dispatch(Route route, HttpRequest& req, HttpResponse& res) {
        switch (route) {
            case Route::page: {
                const std::string_view page = web_page();
                res.status = 200;
                res.content_type = "text/html; charset=utf-8";
                res.body.assign(page.data(), page.size());
                return;
            }
            case Route::health:
                if (registry_.loading()) {
                    set_json(res, 503, server::error_body("loading the model", "unavailable_error", "loading"));
                } else {
                    set_json(res, 200, {{"status", "ok"}});
                }
                return;
            case Route::models: {
                json data = json::array();
                for (const ModelInfo& m : registry_.models()) {
                    data.push_back({{"id", m.id},
                                    {"object", "model"},
                                    {"created", 0},
                                    {"owned_by", "fitllm"},
                                    {"loaded", m.loaded}});
                }
                set_json(res, 200, {{"object", "list"}, {"data", data}});
                return;
            }
            case Route::memory:
                set_json(res, 200, memory_report(registry_));
                return;
            case Route::metrics:
                res.status = 200;
                res.content_type = "text/plain; version=0.0.4";
                res.body = metrics_.prometheus_text(registry_, transport_->stats());
                return;
            case Route::tokenize:
                return endpoints_.tokenize(req, res);
            case Route::detokenize:
                return endpoints_.detokenize(req, res);
            case Route::chat:
                return endpoints_.completion(true, req, res);
            case Route::completions:
                return endpoints_.completion(false, req, res);
            case Route::ollama_version:
                set_json(res, 200, {{"version", kVersion}});
                return;
            case Route::ollama_tags:
                return endpoints_.ollama_tags(res);
            case Route::ollama_chat:
                return endpoints_.ollama(true, req, res);
            case Route::ollama_generate:
                return endpoints_.ollama(false, req, res);
            case Route::ollama_show:
                return endpoints_.ollama_show(req, res);
            case Route::ollama_ps:
                return endpoints_.ollama_ps(res);
            case Route::ollama_copy:
                return endpoints_.ollama_copy(req, res);
            case Route::ollama_delete:
                return endpoints_.ollama_delete(req, res);
            case Route::ollama_create:
                return endpoints_.ollama_create(req, res);
            case Route::ollama_pull:
                return endpoints_.ollama_pull(false, req, res);
            case Route::ollama_push:
                return endpoints_.ollama_pull(true, req, res);
            case Route::ollama_embed:
                throw ApiError(501, "invalid_request_error", "not_implemented",
                               req.path + ": fitllm computes no embeddings (no embedding endpoint is implemented)");
        }
    }

    ModelRegistry& registry_;
    HttpOptions options_;
    Metrics metrics_;
    Endpoints endpoints_;
    std::unique_ptr<WebSafety> safety_;
    std::unique_ptr<HttpTransport> transport_;
};

HttpServer::HttpServer(ModelRegistry& registry, HttpOptions options)
    : handler_(std::make_unique<Handler>(registry, std::move(options))) {
    // Requests come and go, and what one allocated must not stay resident after it (a 30 MB body
    // left 60 MB behind). glibc raises its mmap threshold after each large free (so the next large
    // block comes from a heap) and keeps up to twice that free at the top of a thread's heap,
    // which malloc_trim does not give back: fixed thresholds turn both off. Blocks of 256 KiB and
    // more are mapped and unmapped on their own; a heap's free top over 1 MiB is given back.
    mallopt(M_MMAP_THRESHOLD, 256 << 10);
    mallopt(M_TRIM_THRESHOLD, 1 << 20);
}

HttpServer::~HttpServer() {
    stop();
}

bool HttpServer::bind(const std::string& host, int port) {
    return handler_->bind(host, port);
}

bool HttpServer::listen_after_bind() {
    HttpTransport* t = handler_->transport();
    if (!t) return false;
    t->run();
    return true;
}

bool HttpServer::listen(const std::string& host, int port) {
    return bind(host, port) && listen_after_bind();
}

int HttpServer::bound_port() const {
    const HttpTransport* t = handler_->transport();
    return t ? t->port() : 0;
}

void HttpServer::stop() {
    if (HttpTransport* t = handler_->transport()) t->stop();
}

bool HttpServer::is_running() const {
    const HttpTransport* t = handler_->transport();
    return t && t->running();
}

}  // namespace fitllm::server
