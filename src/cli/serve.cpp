// fitllm serve [-m MODEL | --models-dir DIR] [--host H] [--port P] [-np N] [-c N] [--mem SIZE] [--fit] [--ttl S]
//              [--api-key KEY]
// The OpenAI-compatible HTTP server (src/server/): continuous batching over one KV cache per
// model, models loaded on demand under one memory budget.
#include <pthread.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/generation_options.h"
#include "cli/run_budget.h"
#include "memory/budget.h"
#include "server/http_server.h"
#include "server/model_registry.h"

namespace fitllm::cli {

int run_serve(const std::vector<std::string>& args) {
    std::string model_path, models_dir, host = "127.0.0.1", mem, api_key;
    int port = 8080;
    int n_threads = 0;
    int ttl = 300;
    bool fit = false;
    server::SchedulerOptions so{.n_slots = 4, .n_ctx = 4096, .n_batch = 256, .max_queue = 64};
    runtime::SessionParams kv;  // -ctk / -ctv
    ArgParser p(
        "fitllm serve [-m MODEL | --models-dir DIR] [--host H] [--port P] [-np N] [-c N] [-b N] [-t N] "
        "[--mem SIZE] [--fit] [--ttl SECONDS] [--api-key KEY] [--max-queue N] [-ctk TYPE] [-ctv TYPE] "
        "[--device NAME] [-ngl N] [--vram SIZE] [--no-kv-offload]",
        "Serve models over HTTP with an OpenAI-compatible API: POST /v1/chat/completions and\n"
        "/v1/completions (streamed as server-sent events with \"stream\": true), GET /v1/models,\n"
        "POST /tokenize and /detokenize, GET /health, /metrics (Prometheus), /v1/memory, and a chat\n"
        "page at /. Requests share one KV cache per model (-c cells for -np sequences decoded\n"
        "together); with --models-dir each DIR/NAME.gguf is the model NAME, loaded when a request\n"
        "names it and unloaded after --ttl idle seconds, all within the --mem budget.");
    p.option("-m, --model", "MODEL", "serve this GGUF model (loaded at start)", &model_path);
    p.option("--models-dir", "DIR", "serve every *.gguf in DIR, each loaded on first use", &models_dir);
    p.option("--host", "HOST", "address to listen on (default 127.0.0.1)", &host);
    p.option("--port", "PORT", "port to listen on; 0 picks a free one (default 8080)", &port);
    p.option("-np, --parallel", "N", "sequences decoded together per model (default 4)", &so.n_slots);
    p.option("-c, --ctx-size", "N",
             "KV cache cells per model, shared by its sequences; also the most one request may use (default 4096)",
             &so.n_ctx);
    p.option("-b, --batch-size", "N",
             "tokens per forward pass: one per decoding sequence, the rest prompt chunks (default 256)", &so.n_batch);
    p.option("-t, --threads", "N", "threads (default: the physical cores)", &n_threads);
    p.option("--mem", "SIZE", "memory budget for all models, e.g. 2G (default: what the system offers less a margin)",
             &mem);
    p.flag("--fit", &fit,
           "a model whose plan does not fit --mem gets a quantized KV cache, streamed layers or a shorter context "
           "(in that order) instead of a refusal; what changed is printed");
    p.option("--ttl", "SECONDS", "unload a --models-dir model after this many idle seconds; 0: never (default 300)",
             &ttl);
    p.option("--api-key", "KEY", "require 'Authorization: Bearer KEY' on every endpoint but / and /health", &api_key);
    p.option("--max-queue", "N", "requests that may wait for a slot per model; more get HTTP 429 (default 64)",
             &so.max_queue);
    add_kv_options(p, kv);
    // The HTTP side: request and connection limits, web safety (server::HttpOptions).
    server::HttpOptions http_options;
    auto positive = [](const char* name, const std::string& v, int* out) {
        const long long n = parse_integer(name, v);
        if (n < 1 || n > 1'000'000) throw UsageError(std::string(name) + ": " + v + " must be in 1..1000000");
        *out = static_cast<int>(n);
    };
    auto list = [](const std::string& v, std::vector<std::string>* out) {
        for (size_t begin = 0; begin <= v.size();) {
            const size_t end = std::min(v.find(',', begin), v.size());
            if (end > begin) out->push_back(v.substr(begin, end - begin));
            begin = end + 1;
        }
    };
    p.option("--max-body", "SIZE",
             "the largest request body, e.g. 4M; larger ones get HTTP 413 before they are read (default: 256 bytes "
             "per context token, at least 1M)",
             [&](const std::string& v) {
                 try {
                     http_options.max_body = memory::parse_size(v);
                 } catch (const memory::SizeError& e) {
                     throw UsageError(std::string("--max-body: ") + e.what());
                 }
                 if (http_options.max_body == 0) throw UsageError("--max-body: must be positive");
             });
    p.option("--request-timeout", "SECONDS",
             "a request's headers and body must arrive within this many seconds, or the connection closes "
             "(default 30)",
             [&](const std::string& v) { positive("--request-timeout", v, &http_options.request_timeout); });
    p.option("--max-connections", "N",
             "open connections at most; one more closes the oldest still waiting for its request, or gets HTTP 503 "
             "(default 1024)",
             [&](const std::string& v) { positive("--max-connections", v, &http_options.max_connections); });
    p.option("--max-connections-per-client", "N", "open connections at most per client address (default 256)",
             [&](const std::string& v) {
                 positive("--max-connections-per-client", v, &http_options.max_connections_per_client);
             });
    p.option("--allowed-hosts", "NAMES",
             "comma-separated names that the Host header may carry besides the addresses served (a web page whose "
             "name was re-resolved to this machine is refused); '*': any",
             [&](const std::string& v) { list(v, &http_options.allowed_hosts); });
    p.option("--cors-origin", "ORIGINS",
             "comma-separated web origins (http://host:port) whose pages may call the API, answered with CORS "
             "headers; other origins get HTTP 403; '*': any",
             [&](const std::string& v) { list(v, &http_options.cors_origins); });
    MemoryOptions offload_options;
    add_offload_options(p, offload_options);
    if (!p.parse(args)) return 0;

    if (model_path.empty() == models_dir.empty()) throw UsageError("give one of -m MODEL and --models-dir DIR");
    if (port < 0 || port > 65535) throw UsageError("--port: " + std::to_string(port) + " is not a port (0..65535)");
    if (so.n_slots < 1 || so.n_slots > kv::kMaxSequences)
        throw UsageError("-np: " + std::to_string(so.n_slots) + " must be in 1.." + std::to_string(kv::kMaxSequences));
    if (so.n_ctx < 1) throw UsageError("-c: " + std::to_string(so.n_ctx) + " must be positive");
    if (so.n_batch < 1) throw UsageError("-b: " + std::to_string(so.n_batch) + " must be positive");
    if (so.max_queue < 0) throw UsageError("--max-queue: " + std::to_string(so.max_queue) + " must not be negative");
    if (ttl < 0) throw UsageError("--ttl: " + std::to_string(ttl) + " must not be negative");
    so.type_k = kv.type_k;
    so.type_v = kv.type_v;

    uint64_t budget = 0;
    std::string budget_source;
    if (!mem.empty()) {
        try {
            budget = memory::parse_size(mem);
        } catch (const memory::SizeError& e) {
            throw UsageError(std::string("--mem: ") + e.what());
        }
        budget_source = "--mem";
    } else {
        const memory::HostBudget hb = memory::host_budget();
        budget = hb.budget;
        budget_source = hb.source + " less a margin";
    }

    // SIGINT / SIGTERM are waited for by this thread (sigwait), blocked everywhere else; a client
    // that goes away must not kill the server with SIGPIPE.
    std::signal(SIGPIPE, SIG_IGN);
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    // The offload device, shared by the models (each plans its share against the room left).
    memory::PlanParams offload_params;
    // (A unified one is opened by the registry, on its host budget.)
    const std::unique_ptr<backend::Backend> offload_device =
        apply_offload_options(offload_options, offload_params, /*host=*/nullptr);
    server::ModelRegistry registry({.model_path = model_path,
                                    .models_dir = models_dir,
                                    .budget = budget,
                                    .ttl_seconds = static_cast<double>(ttl),
                                    .scheduler = so,
                                    .n_threads = n_threads,
                                    .fit = fit,
                                    .offload = {.device = offload_device.get(),
                                                .unified_device = offload_params.unified ? offload_params.device : "",
                                                .n_gpu_layers = offload_params.n_gpu_layers,
                                                .kv_offload = offload_params.kv_offload}});
    http_options.api_key = api_key;
    server::HttpServer http(registry, http_options);
    if (!http.bind(host, port)) {
        throw Error("cannot listen on " + host + ":" + std::to_string(port) + " (in use, or not an address here)");
    }
    std::fprintf(
        stderr, "fitllm serve: listening on http://%s:%d (memory budget %s from %s; %d slots, %d KV cells per model)\n",
        host.c_str(), http.bound_port(), memory::format_size(budget).c_str(), budget_source.c_str(), so.n_slots,
        so.n_ctx);
    std::fflush(stderr);
    std::thread listener([&] { http.listen_after_bind(); });

    int status = 0;
    if (!model_path.empty()) {
        try {
            registry.load_startup_model();
            const auto models = registry.models();
            std::fprintf(stderr, "fitllm serve: model '%s' loaded in %.2f s; ready\n", models[0].id.c_str(),
                         models[0].model ? models[0].model->load_seconds() : 0.0);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "fitllm serve: error: %s\n", e.what());
            status = 1;
        }
    } else {
        std::fprintf(stderr, "fitllm serve: %zu models in %s, loaded on first use; ready\n", registry.models().size(),
                     models_dir.c_str());
    }
    std::fflush(stderr);
    if (status == 0) {
        int sig = 0;
        sigwait(&signals, &sig);
        std::fprintf(stderr, "fitllm serve: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    }
    registry.shutdown();  // running requests end (cancelled), so the HTTP workers can finish
    // cpp-httplib's stop() does nothing before its listen loop runs, which a model that fails to
    // load at once can beat: wait for it (bounded) so the process ends instead of serving on.
    for (int i = 0; i < 5000 && !http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    http.stop();
    listener.join();
    return status;
}

}  // namespace fitllm::cli
