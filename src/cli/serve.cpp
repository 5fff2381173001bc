// fitllm serve [-m MODEL | --models-dir DIR] [--host H] [--port P] [-np N] [-c N] [--mem SIZE] [--fit] [--ttl S]
//              [--api-key KEY]
// The OpenAI-compatible HTTP server (src/server/): continuous batching over one KV cache per
// model, models loaded on demand under one memory budget.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "kv/cache.h"
#include "memory/budget.h"
#include "server/http_server.h"
#include "server/model_registry.h"

namespace fitllm::cli {
namespace {

// The HTTP side: request and connection limits, web safety (server::HttpOptions).
void add_http_options(ArgParser& p, server::HttpOptions& http) {
    const auto positive = [](const char* name, const std::string& v, int* out) {
        const long long n = parse_integer(name, v);
        if (n < 1 || n > 1'000'000) throw UsageError(std::string(name) + ": " + v + " must be in 1..1000000");
        *out = static_cast<int>(n);
    };
    const auto list = [](const std::string& v, std::vector<std::string>* out) {
        for (size_t begin = 0; begin <= v.size();) {
            const size_t end = std::min(v.find(',', begin), v.size());
            if (end > begin) out->push_back(v.substr(begin, end - begin));
            begin = end + 1;
        }
    };
    p.option("--api-key", "KEY", "require 'Authorization: Bearer KEY' on every endpoint but / and /health",
             &http.api_key);
    p.option("--max-body", "SIZE",
             "the largest request body, e.g. 4M; larger ones get HTTP 413 before they are read (default: 256 bytes "
             "per context token, at least 1M)",
             [&http](const std::string& v) {
                 http.max_body = parse_size_option("--max-body", v);
                 if (http.max_body == 0) throw UsageError("--max-body: must be positive");
             });
    p.option("--request-timeout", "SECONDS",
             "a request's headers and body must arrive within this many seconds, or the connection closes "
             "(default 30)",
             [&http, positive](const std::string& v) { positive("--request-timeout", v, &http.request_timeout); });
    p.option("--max-connections", "N",
             "open connections at most; one more closes the oldest still waiting for its request, or gets HTTP 503 "
             "(default 1024)",
             [&http, positive](const std::string& v) { positive("--max-connections", v, &http.max_connections); });
    p.option("--max-connections-per-client", "N", "open connections at most per client address (default 256)",
             [&http, positive](const std::string& v) {
                 positive("--max-connections-per-client", v, &http.max_connections_per_client);
             });
    p.option("--allowed-hosts", "NAMES",
             "comma-separated names that the Host header may carry besides the addresses served (a web page whose "
             "name was re-resolved to this machine is refused); '*': any",
             [&http, list](const std::string& v) { list(v, &http.allowed_hosts); });
    p.option("--cors-origin", "ORIGINS",
             "comma-separated web origins (http://host:port) whose pages may call the API, answered with CORS "
             "headers; other origins get HTTP 403; '*': any; 'none': no other origin (default: pages on this "
             "machine, http or https on localhost, 127.0.0.1 or [::1], any port)",
             [&http, list](const std::string& v) {
                 list(v, &http.cors_origins);
                 if (http.cors_origins.empty()) throw UsageError("--cors-origin: no origin given");
                 if (http.cors_origins.size() > 1 &&
                     std::find(http.cors_origins.begin(), http.cors_origins.end(), "none") != http.cors_origins.end()) {
                     throw UsageError("--cors-origin: 'none' cannot be listed with origins");
                 }
             });
}

}  // namespace

ArgParser serve_parser(ServeOptions& o) {
    ContextConfig& c = o.engine.context;
    c.n_seq = 4;
    c.n_ctx = 4096;
    c.n_batch = 256;
    c.n_cached_prompts = kCachedPromptsAsSlots;
    ArgParser p(
        "fitllm serve [-m MODEL | --models-dir DIR] [--alias NAME] [--strict-model-names] [--host H] [--port P] [-np "
        "N] [-c N] [-b N] [-t N] "
        "[--mem SIZE] [--fit] [--mlock] [--stream-layers N] [--ttl SECONDS] [--api-key KEY] [--max-queue N] "
        "[-ctk TYPE] [-ctv TYPE] [--no-kv-rotation] [--kv-spill-dir DIR] [--kv-resident SIZE] [--device NAME] "
        "[-ngl N] [--vram SIZE] [--no-kv-offload] [--unified] [--max-body SIZE] [--request-timeout SECONDS] "
        "[--max-connections N] [--max-connections-per-client N] [--allowed-hosts NAMES] [--cors-origin ORIGINS] "
        "[--cache-prompts N] [--cache-ram SIZE] [--lookup | -md FILE] [--draft-max N] [--draft-min N] "
        "[--draft-p-min P] [--draft-vocab N]",
        "Serve models over HTTP with an OpenAI-compatible API: POST /v1/chat/completions and\n"
        "/v1/completions (streamed as server-sent events with \"stream\": true), GET /v1/models,\n"
        "POST /tokenize and /detokenize, GET /health, /metrics (Prometheus), /v1/memory, a chat\n"
        "page at /, and Ollama's POST /api/chat and /api/generate (NDJSON) and GET /api/tags.\n"
        "Requests share one KV cache per model (-c tokens for -np sequences decoded together);\n"
        "with --models-dir each DIR/NAME.gguf is the model NAME, loaded when a request names it\n"
        "and unloaded after --ttl idle seconds, all within the --mem budget.\n"
        "With --lookup, each decoding sequence drafts tokens by prompt lookup and the model\n"
        "checks them in the batch's forward pass (speculative decoding): the same text (greedy)\n"
        "or distribution (sampling), sooner when the answer repeats the prompt. With -md FILE\n"
        "(-m only), a smaller model with the same vocabulary drafts them instead, with a KV cache\n"
        "of its own for each slot, planned within --mem.");
    p.option("-m, --model", "MODEL", "serve this GGUF model (loaded at start)", &o.engine.load.model_path);
    p.option("--models-dir", "DIR", "serve every *.gguf in DIR, each loaded on first use", &o.models_dir);
    p.option("--alias", "NAME", "the -m model's id in /v1/models and answers (default: its file name without .gguf)",
             &o.alias);
    p.flag("--strict-model-names", &o.strict_model_names,
           "with -m, answer HTTP 404 to a request naming another model (default: the one model answers to any "
           "name, as clients send their own default)");
    p.option("--host", "HOST", "address to listen on (default 127.0.0.1)", &o.host);
    p.option("--port", "PORT", "port to listen on; 0 picks a free one (default 8080)", &o.port);
    p.option("-np, --parallel", "N", "sequences decoded together per model (default 4)", &c.n_seq);
    p.option("-c, --ctx-size", "N",
             "KV cache tokens per model, shared by its sequences; also the most one request may use (default 4096)",
             &c.n_ctx);
    p.option("-b, --batch-size", "N",
             "tokens per forward pass: one per decoding sequence, the rest prompt chunks (default 256)", &c.n_batch);
    add_threads_option(p, c);
    add_prompt_cache_options(p, c);
    p.option("--ttl", "SECONDS", "unload a --models-dir model after this many idle seconds; 0: never (default 300)",
             &o.ttl);
    p.option("--max-queue", "N", "requests that may wait for a slot per model; more get HTTP 429 (default 64)",
             &o.max_queue);
    add_kv_options(p, c);
    add_memory_options(p, o.engine);
    add_http_options(p, o.http);
    add_lookup_options(p, o.lookup);
    add_draft_model_options(p, o.lookup, o.engine);
    return p;
}

void validate(const ServeOptions& o) {
    const ContextConfig c = resolve_cached_prompts(o.engine.context);
    if (o.engine.load.model_path.empty() == o.models_dir.empty()) {
        throw UsageError("give one of -m MODEL and --models-dir DIR");
    }
    if (o.port < 0 || o.port > 65535)
        throw UsageError("--port: " + std::to_string(o.port) + " is not a port (0..65535)");
    if (c.n_seq < 1 || c.n_seq > kv::kMaxSequences) {
        throw UsageError("-np: " + std::to_string(c.n_seq) + " must be in 1.." + std::to_string(kv::kMaxSequences));
    }
    if (c.n_ctx < 1) throw UsageError("-c: " + std::to_string(c.n_ctx) + " must be positive");
    if (c.n_batch < 1) throw UsageError("-b: " + std::to_string(c.n_batch) + " must be positive");
    if (o.engine.context.n_cached_prompts < kCachedPromptsAsSlots) {
        throw UsageError("--cache-prompts: " + std::to_string(o.engine.context.n_cached_prompts) +
                         " must not be negative");
    }
    if (o.max_queue < 0) throw UsageError("--max-queue: " + std::to_string(o.max_queue) + " must not be negative");
    if (o.ttl < 0) throw UsageError("--ttl: " + std::to_string(o.ttl) + " must not be negative");
    validate_lookup_options(o.lookup);
    if (!o.lookup.draft_model.empty() && !o.models_dir.empty()) {
        throw UsageError("-md FILE drafts for one model: use it with -m MODEL, not --models-dir");
    }
    if (!o.alias.empty() && !o.models_dir.empty()) {
        throw UsageError("--alias names the -m model; with --models-dir each file's name is its id");
    }
    try {
        engine::check(c);
    } catch (const ConfigError& e) {
        throw UsageError(e.what());
    }
}

server::RegistryOptions registry_options(const ServeOptions& o) {
    ContextConfig context = resolve_cached_prompts(o.engine.context);
    engine::SchedulerOptions scheduler{.max_queue = o.max_queue, .lookup = std::nullopt};
    if (o.lookup.enabled) {
        // A row of logits for each slot's token and its drafts (within the batch): in the plan.
        scheduler.lookup = o.lookup.params;
        const int rows = context.n_seq * (o.lookup.params.n_draft + 1);
        context.n_outputs = std::max(context.n_outputs, std::min(rows, std::max(context.n_batch, context.n_seq)));
    }
    if (!o.lookup.draft_model.empty()) {
        // -md: the same rows; the draft model is loaded with the model (RegistryOptions::draft_model_path).
        scheduler.draft = o.lookup.draft;
        const int rows = context.n_seq * (o.lookup.draft.n_draft + 1);
        context.n_outputs = std::max(context.n_outputs, std::min(rows, std::max(context.n_batch, context.n_seq)));
    }
    return {.model_path = o.engine.load.model_path,
            .models_dir = o.models_dir,
            .ttl_seconds = static_cast<double>(o.ttl),
            .load = o.engine.load,
            .context = context,
            .scheduler = scheduler,
            .mem_label = o.engine.mem_label,
            .alias = o.alias,
            .strict_model_names = o.strict_model_names,
            .draft_model_path = o.lookup.draft_model};
}

namespace {

int serve(const ServeOptions& o) {
    // SIGINT / SIGTERM are waited for by this thread (sigwait), blocked everywhere else; a client
    // that goes away must not kill the server with SIGPIPE.
    std::signal(SIGPIPE, SIG_IGN);
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    std::unique_ptr<server::ModelRegistry> registry_ptr;
    try {
        registry_ptr = std::make_unique<server::ModelRegistry>(registry_options(o));
    } catch (const ConfigError& e) {
        throw UsageError(e.what());
    }
    server::ModelRegistry& registry = *registry_ptr;
    server::HttpServer http(registry, o.http);
    if (!http.bind(o.host, o.port)) {
        throw Error("cannot listen on " + o.host + ":" + std::to_string(o.port) + " (in use, or not an address here)");
    }
    const memory::Device& budget = registry.device();
    std::fprintf(stderr,
                 "fitllm serve: listening on http://%s:%d (memory budget %s from %s; %d slots, %d KV tokens per "
                 "model)\n",
                 o.host.c_str(), http.bound_port(), memory::format_size(budget.capacity()).c_str(),
                 registry.budget_source().c_str(), o.engine.context.n_seq, o.engine.context.n_ctx);
    std::fflush(stderr);
    std::thread listener([&] { http.listen_after_bind(); });

    int status = 0;
    if (!o.engine.load.model_path.empty()) {
        try {
            registry.load_startup_model();
            const auto models = registry.models();
            if (models[0].model && models[0].model->engine().draft()) {
                const engine::Plan& d = models[0].model->engine().draft()->plan();
                std::fprintf(stderr, "fitllm serve: draft model %s (-md): %s planned, its KV cache %s for %d slots\n",
                             o.lookup.draft_model.c_str(), memory::format_size(d.total()).c_str(),
                             memory::format_size(d.kv).c_str(), d.draft_slots);
            }
            std::fprintf(stderr, "fitllm serve: model '%s' loaded in %.2f s; ready\n", models[0].id.c_str(),
                         models[0].model ? models[0].model->load_seconds() : 0.0);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "fitllm serve: error: %s\n", e.what());
            status = 1;
        }
    } else {
        std::fprintf(stderr, "fitllm serve: %zu models in %s, loaded on first use; ready\n", registry.models().size(),
                     o.models_dir.c_str());
    }
    std::fflush(stderr);
    if (status == 0) {
        int sig = 0;
        sigwait(&signals, &sig);
        std::fprintf(stderr, "fitllm serve: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    }
    registry.shutdown();  // running requests end (cancelled), so the HTTP workers can finish
    http.stop();
    listener.join();
    return status;
}

}  // namespace

int run_serve(const std::vector<std::string>& args) {
    return parse_and_run(args, serve_parser, serve);
}

}  // namespace fitllm::cli
