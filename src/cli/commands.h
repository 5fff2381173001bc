#pragma once
// The subcommands of the fitllm executable; one file each. Each returns the process exit status;
// args exclude "fitllm" and the subcommand name.
//
// The subcommands that load a model declare their flags into an options struct whose engine part
// is the engine's LoadConfig and ContextConfig (cli/engine_options.h): X_parser(o) declares every
// flag of `fitllm X` writing into o (tests/cli/flags_test.cpp walks them), validate(o) checks what
// the engine does not, and run_X parses, validates and runs.
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/engine_options.h"
#include "sampling/sampling_params.h"
#include "server/http_server.h"
#include "server/model_registry.h"

namespace fitllm::cli {

int run_inspect(const std::vector<std::string>& args);
int run_tokenize(const std::vector<std::string>& args);
int run_template(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_run(const std::vector<std::string>& args);
int run_chat(const std::vector<std::string>& args);
int run_perplexity(const std::vector<std::string>& args);
int run_plan(const std::vector<std::string>& args);
int run_serve(const std::vector<std::string>& args);
int run_quantize(const std::vector<std::string>& args);

struct RunOptions {
    EngineOptions engine;
    std::string prompt;
    int n_predict = 64;
    sampling::SamplingParams sampling;
    LookupOptions lookup;
};
ArgParser run_parser(RunOptions& o);
void validate(const RunOptions& o);

struct ChatOptions {
    EngineOptions engine;
    std::string system_prompt;
    int n_predict = 512;
    sampling::SamplingParams sampling;
    LookupOptions lookup;
};
ArgParser chat_parser(ChatOptions& o);
void validate(const ChatOptions& o);

struct BenchOptions {
    EngineOptions engine;  // context: the pp / tg tests' session; n_seq: the -np test's sequences
    int n_prompt = 512;
    int n_gen = 128;
    int repetitions = 5;
    std::string output = "md";
};
ArgParser bench_parser(BenchOptions& o);
void validate(const BenchOptions& o);

struct PerplexityOptions {
    EngineOptions engine;  // context: its K/V settings and threads; the rest from the fields below
    std::string text_path;
    int n_ctx = 512;    // tokens per chunk (-c)
    int n_chunks = -1;  // --chunks; < 0: all
    int n_seq = 1;      // chunks at once (-np)
    std::string kl_base_path;
    bool kl_compare = false;
};
ArgParser perplexity_parser(PerplexityOptions& o);
void validate(const PerplexityOptions& o);

struct PlanOptions {
    EngineOptions engine;
    bool as_json = false;
    int draft_max = 8;  // with -md: the rows of logits a pass checks (drafts + 1)
};
ArgParser plan_parser(PlanOptions& o);
void validate(const PlanOptions& o);

struct ServeOptions {
    EngineOptions engine;  // every model's load (model_path: -m) and context (-c, -np, -b, ...)
    std::string models_dir;
    std::string host = "127.0.0.1";
    int port = 8080;
    int ttl = 300;
    int max_queue = 64;
    std::string alias;                // --alias: the -m model's id
    bool strict_model_names = false;  // --strict-model-names
    server::HttpOptions http;         // the API key, request and connection limits, web safety
    LookupOptions lookup;             // --lookup, --draft-max, --lookup-ngram-min/max (no -md)
};
ArgParser serve_parser(ServeOptions& o);
void validate(const ServeOptions& o);
// What the registry of `fitllm serve` is made with: the engine options as they are, with the
// cached prompts resolved.
server::RegistryOptions registry_options(const ServeOptions& o);

}  // namespace fitllm::cli
