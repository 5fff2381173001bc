#pragma once
// The flags the subcommands share, declared once each, writing into the engine's configs
// (fitllm/config.h) and nothing else: a flag a subcommand accepts reaches the engine.
//
//   EngineOptions eo;                 // LoadConfig + ContextConfig
//   add_context_size_option(p, eo.context, "...help...");
//   add_kv_options(p, eo.context);
//   add_memory_options(p, eo);
//   ...parse...
//   int status = with_engine("run", eo, [&](engine::Engine& e) { ... });  // DoesNotFitError: exit 3
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/args.h"
#include "engine/drafter.h"
#include "engine/engine.h"
#include "engine/lookup.h"
#include "fitllm/config.h"
#include "sampling/sampling_params.h"

namespace fitllm::cli {

// The exit status of a command whose plan does not fit its budget (as `fitllm plan`).
inline constexpr int kExitDoesNotFit = 3;

// How to load the model and the context it runs in, as the flags set them.
struct EngineOptions {
    LoadConfig load;
    ContextConfig context;
    std::string mem_label;         // "--mem 1G" when --mem was given (the plan names its budget so)
    std::string draft_model_path;  // -md: a draft model loaded with the model (engine::Engine::load)
};

// Parses a number for option `name`, with a UsageError naming it on bad input.
float parse_float(const std::string& name, const std::string& text);
// A size ("900M", "1.5G") for option `name`, with a UsageError naming it on bad input.
uint64_t parse_size_option(const std::string& name, const std::string& text);

// --temp, --top-k, --top-p, --min-p, --seed and --repeat-penalty.
void add_sampling_options(ArgParser& parser, sampling::SamplingParams& sp);
// Structured output for `run`: --grammar (GBNF) or -j/--json-schema (sampling/json_schema.h),
// parsed at once into sp.grammar (UsageError naming the option and the grammar's line and column
// or the schema keyword's path).
void add_grammar_options(ArgParser& parser, sampling::SamplingParams& sp);
// Throws UsageError when a sampling parameter is out of range.
void validate_sampling_options(const sampling::SamplingParams& sp);

// -t / --threads N (context.n_threads).
void add_threads_option(ArgParser& parser, ContextConfig& context);
// -ctk / --cache-type-k TYPE, -ctv / --cache-type-v TYPE, --no-kv-rotation, --kv-spill-dir DIR,
// --kv-resident SIZE.
void add_kv_options(ArgParser& parser, ContextConfig& context);
// --cache-prompts N and --cache-ram SIZE (the server's prompt cache; `plan` plans it as serve
// does). kCachedPromptsAsSlots in n_cached_prompts stands for serve's default, as many as -np
// (resolve_cached_prompts).
inline constexpr int kCachedPromptsAsSlots = -1;
void add_prompt_cache_options(ArgParser& parser, ContextConfig& context);
// The context with kCachedPromptsAsSlots replaced by as many as -np, within the 64 sequence ids.
ContextConfig resolve_cached_prompts(ContextConfig context);
// --context-shift, --keep N.
void add_context_shift_options(ArgParser& parser, ContextConfig& context);
// Speculative decoding by prompt lookup (engine/lookup.h), as `run` and `chat` take it.
// Or by a draft model (-md, engine/drafter.h): its file is EngineOptions::draft_model_path too.
struct LookupOptions {
    bool enabled = false;  // --lookup
    engine::LookupParams params;
    std::string draft_model;  // -md
    engine::DraftParams draft;
    // The flags given that only one drafter reads, checked by validate_lookup_options: one given
    // without its drafter is refused rather than ignored.
    std::vector<std::string> lookup_only_flags;  // --lookup-ngram-min/max
    std::vector<std::string> draft_only_flags;   // --draft-min, --draft-p-min, --draft-vocab
    bool draft_max_given = false;                // --draft-max (either drafter)
};
// --lookup, --draft-max N (both drafters), --lookup-ngram-min N, --lookup-ngram-max N.
void add_lookup_options(ArgParser& parser, LookupOptions& lookup);
// -md / --model-draft FILE (into lookup and engine), --draft-min N, --draft-p-min P.
void add_draft_model_options(ArgParser& parser, LookupOptions& lookup, EngineOptions& engine);
// Throws UsageError for parameters out of range (whether --lookup or -md is on or not), for
// --lookup with -md, and for a drafter's flag given without that drafter.
void validate_lookup_options(const LookupOptions& lookup);
// With --lookup or -md: the rows of logits a forward pass returns (drafts + 1), set in the
// context before it is planned, so that the plan charges them.
void apply_lookup_options(const LookupOptions& lookup, ContextConfig& context);
// The drafter the options ask for: the loaded draft model of e (-md), prompt lookup (--lookup), or
// nullptr for neither.
std::unique_ptr<engine::Drafter> make_drafter(engine::Engine& e, const LookupOptions& lookup);

// A count for option `name` (0..1000000), with a UsageError naming it on bad input.
int parse_count(const std::string& name, const std::string& text);

// --mem SIZE, --fit, --stream-layers N and the offload options: what `fitllm plan` plans.
void add_budget_options(ArgParser& parser, EngineOptions& options);
// add_budget_options and --mlock: what the commands that load a model take.
void add_memory_options(ArgParser& parser, EngineOptions& options);
// --device NAME, -ngl N, --vram SIZE, --no-kv-offload, --unified.
void add_offload_options(ArgParser& parser, OffloadConfig& offload);

// Loads the engine of `options` and runs `body` on it. A plan that does not fit (DoesNotFitError)
// prints why, the plan's table and a hint to stderr and returns kExitDoesNotFit; what --fit changed
// is printed before loading (and, with --mlock, what was locked). Other errors propagate (the
// command's caller prints them); ConfigError becomes a UsageError.
int with_engine(const char* command, const EngineOptions& options, const std::function<int(engine::Engine&)>& body);

// The process's peak resident set (VmHWM) in KiB, or -1 where /proc does not tell.
long peak_rss_kib();

// A subcommand's run: parses args into fresh options with make_parser (false: --help printed, 0),
// checks them with validate(options) and returns run(options).
template <class Options, class Run>
int parse_and_run(const std::vector<std::string>& args, ArgParser (*make_parser)(Options&), Run&& run) {
    Options options;
    ArgParser parser = make_parser(options);
    if (!parser.parse(args)) return 0;
    validate(options);
    return run(options);
}

}  // namespace fitllm::cli
