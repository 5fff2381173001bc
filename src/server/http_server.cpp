#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <random>

#include "chat/template_error.h"
#include "server/api_error.h"
#include "server/request.h"
#include "server/web_page.h"

namespace fitllm::server {
namespace {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
    if (e.status() == 429 || e.status() == 503) res.set_header("Retry-After", "1");
    send_json(res, e.status(), e.body());
}

json parse_body(const httplib::Request& req) {
    try {
        return json::parse(req.body);
    } catch (const json::parse_error& e) {
        throw ApiError::invalid(std::string("the request body is not valid JSON: ") + e.what(), "invalid_json");
    }
}

std::string random_id(const char* prefix) {
    static std::atomic<uint64_t> counter{0};
    thread_local std::mt19937_64 rng(std::random_device{}());
    char buf[40];
    std::snprintf(buf, sizeof buf, "%s%012llx%04llx", prefix,
                  static_cast<unsigned long long>(rng() & 0xffffffffffffULL),
                  static_cast<unsigned long long>(counter.fetch_add(1) & 0xffff));
    return buf;
}

// A chat or text completion, ready to run: the model and the job.
struct Completion {
    std::shared_ptr<LoadedModel> model;
    CompletionRequest request;
    std::shared_ptr<Job> job;
    std::string id;
    int64_t created = 0;
};

json usage_json(const Job::Update& u) {
    return {{"prompt_tokens", u.n_prompt},
            {"completion_tokens", u.n_generated},
            {"total_tokens", u.n_prompt + u.n_generated}};
}

json finish_reason_json(FinishReason r) {
    if (r == FinishReason::stop || r == FinishReason::length) return finish_reason_name(r);
    return nullptr;
}

// One event of a stream: the text so far in this update, or the end.
json stream_chunk(const Completion& c, const std::string& text, bool first, const json& finish) {
    json choice = {{"index", 0}, {"finish_reason", finish}};
    if (c.request.chat) {
        json delta = json::object();
        if (first) delta["role"] = "assistant";
        if (!text.empty() || (first && finish.is_null())) delta["content"] = text;
        choice["delta"] = delta;
    } else {
        choice["text"] = text;
        choice["logprobs"] = nullptr;
    }
    return {{"id", c.id},
            {"object", c.request.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", c.created},
            {"model", c.model->id()},
            {"choices", json::array({choice})}};
}

std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse(const json& event) {
    return "data: " + dump(event) + "\n\n";
}

// How often a whole (not streamed) answer's connection is written to while its job runs: a
// write is how a client that went away shows.
constexpr std::chrono::milliseconds kKeepAlive{100};

// The body of a whole answer: the completion, or an error body when the job did not finish well.
json whole_answer(const Completion& c, const Job::Update& u, const std::string& text) {
    if (u.reason == FinishReason::error) {
        return error_body("generation failed: " + u.error, "server_error", "generation_failed");
    }
    if (u.reason == FinishReason::cancelled) {
        return error_body("the request was cancelled (server stopping)", "server_error", "cancelled");
    }
    json choice = {{"index", 0}, {"finish_reason", finish_reason_json(u.reason)}};
    if (c.request.chat) {
        choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
        choice["text"] = text;
        choice["logprobs"] = nullptr;
    }
    return {{"id", c.id},
            {"object", c.request.chat ? "chat.completion" : "text_completion"},
            {"created", c.created},
            {"model", c.model->id()},
            {"choices", json::array({choice})},
            {"usage", usage_json(u)}};
}

}  // namespace

HttpServer::HttpServer(ModelRegistry& registry, HttpOptions options)
    : registry_(registry), options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
    const RegistryOptions& ro = registry_.options();
    const int n_threads = options_.n_threads > 0 ? options_.n_threads
                                                 : std::clamp(ro.context.n_seq + ro.scheduler.max_queue + 8, 16, 512);
    http_->new_task_queue = [n_threads] { return new httplib::ThreadPool(static_cast<size_t>(n_threads)); };
    http_->set_payload_max_length(uint64_t{32} << 20);
    http_->set_read_timeout(30);
    http_->set_write_timeout(30);
    routes();
}

HttpServer::~HttpServer() {
    stop();
}

bool HttpServer::bind(const std::string& host, int port) {
    // cpp-httplib 0.11.4 (compiled into Debian's library) listens with a backlog of 5, and bursts
    // of concurrent clients overflow it (connections reset). The socket-options hook sees the
    // listening socket before its listen(); listening again afterwards raises the backlog (Linux
    // allows listen() on a listening socket to change it).
    int listen_fd = -1;
    http_->set_socket_options([&listen_fd](socket_t sock) {
        httplib::default_socket_options(sock);
        listen_fd = sock;
    });
    bool ok = false;
    if (port == 0) {
        port_ = http_->bind_to_any_port(host);
        ok = port_ > 0;
    } else {
        port_ = port;
        ok = http_->bind_to_port(host, port);
    }
    if (ok && listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
    http_->set_socket_options(httplib::default_socket_options);
    return ok;
}

bool HttpServer::listen_after_bind() {
    return http_->listen_after_bind();
}

bool HttpServer::listen(const std::string& host, int port) {
    return bind(host, port) && listen_after_bind();
}

void HttpServer::stop() {
    if (http_) http_->stop();
}

bool HttpServer::is_running() const {
    return http_->is_running();
}

void HttpServer::routes() {
    httplib::Server& s = *http_;

    // The API key, for everything but the page and the health check.
    s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (options_.api_key.empty() || req.path == "/" || req.path == "/health" || req.method == "OPTIONS") {
            return httplib::Server::HandlerResponse::Unhandled;
        }
        const std::string auth = req.get_header_value("Authorization");
        if (auth == "Bearer " + options_.api_key) return httplib::Server::HandlerResponse::Unhandled;
        send_json(res, 401,
                  error_body(
                      auth.empty() ? "missing API key: send the header 'Authorization: Bearer KEY'" : "invalid API key",
                      "authentication_error", "invalid_api_key"));
        metrics_.count_request(req.path, 401);
        return httplib::Server::HandlerResponse::Handled;
    });
    // Unknown paths and methods get a JSON body too (handlers' own errors already have one).
    s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const std::string message = res.status == 404 ? "no endpoint " + req.method + " " + req.path
                                                      : "HTTP " + std::to_string(res.status) + " for " + req.path;
        send_json(res, res.status, error_body(message, "invalid_request_error", "not_found"));
        return httplib::Server::HandlerResponse::Handled;
    }));
    s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string message = "internal error";
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            message += std::string(": ") + e.what();
        } catch (...) {
        }
        send_json(res, 500, error_body(message, "server_error", "internal_error"));
    });

    // Wraps a handler: ApiError and other exceptions become error bodies; every request counted.
    auto handle = [this](const char* endpoint, auto fn) {
        return [this, endpoint, fn](const httplib::Request& req, httplib::Response& res) {
            try {
                fn(req, res);
            } catch (const ApiError& e) {
                if (e.status() == 429) metrics_.count_rejection("queue_full");
                if (e.status() == 503 || e.status() == 507) metrics_.count_rejection("over_budget");
                send_error(res, e);
            } catch (const std::exception& e) {
                send_json(res, 500, error_body(e.what(), "server_error", "internal_error"));
            }
            metrics_.count_request(endpoint, res.status);
        };
    };

    s.Get("/", [](const httplib::Request&, httplib::Response& res) {
        const std::string_view page = web_page();
        res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
    });

    s.Get("/health", handle("/health", [this](const httplib::Request&, httplib::Response& res) {
              if (registry_.loading()) {
                  send_json(res, 503, error_body("loading the model", "unavailable_error", "loading"));
              } else {
                  send_json(res, 200, {{"status", "ok"}});
              }
          }));

    s.Get(
        "/v1/models", handle("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
            json data = json::array();
            for (const ModelInfo& m : registry_.models()) {
                data.push_back(
                    {{"id", m.id}, {"object", "model"}, {"created", 0}, {"owned_by", "fitllm"}, {"loaded", m.loaded}});
            }
            send_json(res, 200, {{"object", "list"}, {"data", data}});
        }));

    s.Get("/v1/memory", handle("/v1/memory", [this](const httplib::Request&, httplib::Response& res) {
              send_json(res, 200, memory_report(registry_));
          }));

    s.Get("/metrics", handle("/metrics", [this](const httplib::Request&, httplib::Response& res) {
              res.set_content(metrics_.prometheus_text(registry_), "text/plain; version=0.0.4");
          }));

    s.Post("/tokenize", handle("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
               const json body = parse_body(req);
               if (!body.is_object())
                   throw ApiError::invalid("the request body: expected a JSON object", "invalid_type");
               const auto content = body.find("content");
               if (content == body.end() || !content->is_string()) {
                   throw ApiError::invalid("content: required, a string", "invalid_type");
               }
               auto boolean = [&](const char* name, bool fallback) {
                   const auto it = body.find(name);
                   if (it == body.end() || it->is_null()) return fallback;
                   if (!it->is_boolean())
                       throw ApiError::invalid(std::string(name) + ": expected a boolean", "invalid_type");
                   return it->get<bool>();
               };
               const bool add_special = boolean("add_special", false);
               const bool parse_special = boolean("parse_special", true);
               const std::shared_ptr<LoadedModel> m = registry_.acquire(model_field(body));
               const auto ids = m->tokenizer().tokenize(content->get<std::string>(), add_special, parse_special);
               send_json(res, 200, {{"tokens", ids}});
           }));

    s.Post("/detokenize", handle("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
               const json body = parse_body(req);
               if (!body.is_object())
                   throw ApiError::invalid("the request body: expected a JSON object", "invalid_type");
               const auto tokens = body.find("tokens");
               if (tokens == body.end() || !tokens->is_array()) {
                   throw ApiError::invalid("tokens: required, an array of token ids", "invalid_type");
               }
               const std::shared_ptr<LoadedModel> m = registry_.acquire(model_field(body));
               std::vector<int32_t> ids;
               const int n_vocab = m->model().n_vocab();
               for (size_t i = 0; i < tokens->size(); ++i) {
                   const json& t = (*tokens)[i];
                   if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab) {
                       throw ApiError::invalid("tokens[" + std::to_string(i) + "]: " + t.dump() +
                                                   " is not a token id of this model (0.." +
                                                   std::to_string(n_vocab - 1) + ")",
                                               "invalid_value");
                   }
                   ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
               }
               send_json(res, 200, {{"content", m->tokenizer().detokenize(ids, false, false)}});
           }));

    auto completion = [this](bool chat) {
        return [this, chat](const httplib::Request& req, httplib::Response& res) {
            auto c = std::make_shared<Completion>();
            c->request = parse_completion_request(parse_body(req), chat);
            c->model = registry_.acquire(c->request.model);
            c->id = random_id(chat ? "chatcmpl-" : "cmpl-");
            c->created = static_cast<int64_t>(std::time(nullptr));
            LoadedModel& m = *c->model;

            std::vector<int32_t> prompt;
            if (chat) {
                std::string text;
                try {
                    text = m.chat_template().tmpl.render(c->request.messages, m.render_options());
                } catch (const chat::TemplateError& e) {
                    throw ApiError::invalid(
                        std::string("messages: the model's chat template refused them: ") + e.what(), "template_error");
                }
                prompt = m.tokenizer().tokenize(text, /*add_special=*/false, /*parse_special=*/true);
            } else if (c->request.prompt_is_tokens) {
                prompt = c->request.prompt_tokens;
                for (const int32_t id : prompt) {
                    if (id >= m.model().n_vocab()) {
                        throw ApiError::invalid("prompt: token id " + std::to_string(id) +
                                                    " is outside the vocabulary (" +
                                                    std::to_string(m.model().n_vocab()) + " tokens)",
                                                "invalid_value");
                    }
                }
            } else {
                prompt = m.tokenizer().tokenize(c->request.prompt, /*add_special=*/true, /*parse_special=*/true);
            }
            if (prompt.empty()) throw ApiError::invalid("prompt: no tokens to start from", "invalid_value");
            const int n_ctx = m.scheduler().n_ctx();
            const int n_prompt = static_cast<int>(prompt.size());
            if (n_prompt >= n_ctx) {
                throw ApiError::invalid("the prompt has " + std::to_string(n_prompt) +
                                            " tokens; this model's context is " + std::to_string(n_ctx) +
                                            " tokens, which leaves no room to generate",
                                        "context_length_exceeded");
            }
            GenerationParams params = c->request.params;
            params.max_tokens = c->request.max_tokens.value_or(n_ctx - n_prompt);
            try {
                c->job = m.scheduler().submit(std::move(prompt), std::move(params));
            } catch (const QueueFullError& e) {
                throw ApiError(429, "server_busy", "queue_full", e.what());
            } catch (const std::invalid_argument& e) {
                throw ApiError::invalid(e.what(), "context_length_exceeded");
            } catch (const sampling::SamplingError& e) {
                throw ApiError::invalid(e.what(), "invalid_value");
            }

            if (!c->request.stream) {
                // cpp-httplib 0.11.4 tells a handler nothing of its client going away; only a write
                // to the closed connection fails. So the whole answer goes out through a chunked
                // provider too: while the job runs, a space (JSON allows whitespace before the
                // value) every kKeepAlive, and a failed write cancels the job, which frees its slot
                // before the scheduler's next step. The status leaves with the headers, before the
                // result is known: a job that fails after that (a generation error, the server
                // stopping) ends its 200 response with an error body instead of a 500 / 503.
                res.status = 200;
                auto text = std::make_shared<std::string>();
                auto last_write =
                    std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
                res.set_chunked_content_provider(
                    "application/json",
                    [this, c, text, last_write](size_t, httplib::DataSink& sink) {
                        const Job::Update u = c->job->wait(kKeepAlive);
                        *text += u.text;
                        if (!u.finished) {
                            const auto now = std::chrono::steady_clock::now();
                            if (now - *last_write < kKeepAlive) return true;
                            *last_write = now;
                            if (!sink.write(" ", 1)) {
                                c->job->cancel();
                                return false;
                            }
                            return true;
                        }
                        registry_.touch(c->model->id());
                        metrics_.count_tokens(static_cast<uint64_t>(u.n_prompt), static_cast<uint64_t>(u.n_generated));
                        const std::string body = dump(whole_answer(*c, u, *text));
                        if (!sink.write(body.data(), body.size())) return false;
                        sink.done();
                        return true;
                    },
                    [c](bool success) {
                        if (!success) c->job->cancel();
                    });
                return;
            }

            // Streaming: one event per piece of text as it comes; a client that goes away cancels
            // the job, which frees its slot before the scheduler's next step.
            res.status = 200;
            res.set_header("Cache-Control", "no-cache");
            auto first = std::make_shared<bool>(true);
            res.set_chunked_content_provider(
                "text/event-stream",
                [this, c, first](size_t, httplib::DataSink& sink) {
                    if (!sink.is_writable()) {
                        c->job->cancel();
                        return false;
                    }
                    Job::Update u = c->job->wait(std::chrono::milliseconds(200));
                    std::string out;
                    if (*first && u.pieces.empty()) u.pieces.emplace_back();  // the role comes first
                    for (const std::string& piece : u.pieces) {
                        out += sse(stream_chunk(*c, piece, *first, nullptr));
                        *first = false;
                    }
                    if (u.finished) {
                        registry_.touch(c->model->id());
                        metrics_.count_tokens(static_cast<uint64_t>(u.n_prompt), static_cast<uint64_t>(u.n_generated));
                        if (u.reason == FinishReason::error || u.reason == FinishReason::cancelled) {
                            out += sse(error_body("generation " + std::string(finish_reason_name(u.reason)) +
                                                      (u.error.empty() ? "" : ": " + u.error),
                                                  "server_error", "generation_failed"));
                        } else {
                            out += sse(stream_chunk(*c, "", false, finish_reason_json(u.reason)));
                        }
                        if (c->request.include_usage) {
                            json usage = stream_chunk(*c, "", false, nullptr);
                            usage["choices"] = json::array();
                            usage["usage"] = usage_json(u);
                            out += sse(usage);
                        }
                        out += "data: [DONE]\n\n";
                    }
                    if (!out.empty() && !sink.write(out.data(), out.size())) {
                        c->job->cancel();
                        return false;
                    }
                    if (u.finished) sink.done();
                    return true;
                },
                [c](bool success) {
                    if (!success) c->job->cancel();
                });
        };
    };
    s.Post("/v1/chat/completions", handle("/v1/chat/completions", completion(true)));
    s.Post("/v1/completions", handle("/v1/completions", completion(false)));
}

}  // namespace fitllm::server
