#include "cli/engine_options.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#include "cli/load_progress.h"
#include "engine/plan_report.h"
#include "fitllm/error.h"
#include "kv/cache.h"
#include "memory/budget.h"
#include "sampling/grammar.h"
#include "sampling/json_schema.h"
#include "sampling/sampler.h"
#include "util/text.h"

namespace fitllm::cli {
namespace {

int parse_int(const std::string& name, const std::string& text) {
    const long long n = parse_integer(name, text);
    if (n < INT_MIN || n > INT_MAX) throw UsageError(name + ": " + text + " is out of range");
    return static_cast<int>(n);
}

}  // namespace

float parse_float(const std::string& name, const std::string& text) {
    size_t used = 0;
    float v = 0.0f;
    try {
        v = std::stof(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != text.size()) throw UsageError(name + ": '" + text + "' is not a number");
    return v;
}

uint64_t parse_size_option(const std::string& name, const std::string& text) {
    try {
        return memory::parse_size(text);
    } catch (const memory::SizeError& e) {
        throw UsageError(name + ": " + e.what());
    }
}

void add_sampling_options(ArgParser& p, sampling::SamplingParams& sp) {
    p.option("--temp", "T", "temperature; 0 or less: greedy (default 0.8)",
             [&sp](const std::string& v) { sp.temperature = parse_float("--temp", v); });
    p.option("--top-k", "K", "keep the K most likely tokens; 0: off (default 40)",
             [&sp](const std::string& v) { sp.top_k = static_cast<int32_t>(parse_integer("--top-k", v)); });
    p.option("--top-p", "P", "nucleus sampling; 1: off (default 0.95)",
             [&sp](const std::string& v) { sp.top_p = parse_float("--top-p", v); });
    p.option("--min-p", "P", "drop tokens below P times the most likely; 0: off (default 0.05)",
             [&sp](const std::string& v) { sp.min_p = parse_float("--min-p", v); });
    p.option("--seed", "S", "random seed (default: random)", [&sp](const std::string& v) {
        const long long s = parse_integer("--seed", v);
        if (s < 0) throw UsageError("--seed: '" + v + "' must not be negative");
        sp.seed = static_cast<uint64_t>(s);
    });
    p.option("--repeat-penalty", "R", "penalize repeats of the last --repeat-last-n tokens; 1: off (default 1)",
             [&sp](const std::string& v) { sp.repeat_penalty = parse_float("--repeat-penalty", v); });
    p.option("--presence-penalty", "P",
             "subtract P from a token's logit once if it is among the last --repeat-last-n tokens; 0: off (default 0)",
             [&sp](const std::string& v) { sp.presence_penalty = parse_float("--presence-penalty", v); });
    p.option("--frequency-penalty", "F",
             "subtract F from a token's logit for each time it is among the last --repeat-last-n tokens; 0: off "
             "(default 0)",
             [&sp](const std::string& v) { sp.frequency_penalty = parse_float("--frequency-penalty", v); });
    p.option(
        "--repeat-last-n", "N", "the tokens the penalties look at; 0: none (default 64)",
        [&sp](const std::string& v) { sp.penalty_last_n = static_cast<int32_t>(parse_count("--repeat-last-n", v)); });
    p.option("--typical", "P", "locally typical sampling; 1: off (default 1)",
             [&sp](const std::string& v) { sp.typical_p = parse_float("--typical", v); });
}

void add_grammar_options(ArgParser& p, sampling::SamplingParams& sp) {
    const auto grammar = [&sp](const std::string& option, const std::string& gbnf) {
        if (sp.grammar) throw UsageError(option + ": one grammar or JSON schema at most");
        try {
            sp.grammar = sampling::Grammar::parse(gbnf);
        } catch (const sampling::GrammarError& e) {
            throw UsageError(option + ": " + e.what());
        }
    };
    const auto schema = [grammar](const std::string& option, const std::string& text) {
        std::string gbnf;
        try {
            gbnf = sampling::json_schema_to_gbnf(nlohmann::ordered_json::parse(text));
        } catch (const nlohmann::json::exception& e) {
            throw UsageError(option + ": not JSON: " + e.what());
        } catch (const sampling::JsonSchemaError& e) {
            throw UsageError(option + ": " + e.what());
        }
        grammar(option, gbnf);
    };
    p.option("--grammar", "GBNF",
             "constrain the output to a GBNF grammar (llama.cpp's syntax; from a file: \"$(cat FILE)\")",
             [grammar](const std::string& v) { grammar("--grammar", v); });
    p.option("-j, --json-schema", "SCHEMA", "constrain the output to JSON valid for a JSON schema",
             [schema](const std::string& v) { schema("--json-schema", v); });
}

void validate_sampling_options(const sampling::SamplingParams& sp) {
    try {
        sampling::validate_sampling_params(sp);
    } catch (const sampling::SamplingError& e) {
        throw UsageError(e.what());
    }
}

void add_threads_option(ArgParser& p, ContextConfig& context) {
    p.option("-t, --threads", "N", "threads (default: the physical cores)", [&context](const std::string& v) {
        const long long n = parse_integer("-t", v);
        if (n < 0 || n > 4096) throw UsageError("-t: '" + v + "' must be in 0..4096 (0: the physical cores)");
        context.n_threads = static_cast<int>(n);
    });
}

void add_kv_options(ArgParser& p, ContextConfig& context) {
    const auto kv_type = [](const std::string& option, const std::string& value) {
        try {
            return parse_kv_type(value);
        } catch (const ConfigError& e) {
            throw UsageError(option + ": " + e.what());
        }
    };
    p.option("-ctk, --cache-type-k", "TYPE",
             "KV cache type of K: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (default f16)",
             [&context, kv_type](const std::string& v) { context.type_k = kv_type("-ctk", v); });
    p.option("-ctv, --cache-type-v", "TYPE", "KV cache type of V, as -ctk (default f16)",
             [&context, kv_type](const std::string& v) { context.type_v = kv_type("-ctv", v); });
    p.option("--no-kv-rotation", "", "store quantized K/V heads without the Hadamard rotation",
             [&context](const std::string&) { context.kv_rotation = false; });
    p.option("--kv-spill-dir", "DIR",
             "a directory on disk where the KV cache spills the layers that do not fit in --kv-resident: they "
             "stream through memory around their attention (slower decoding, same results)",
             &context.kv_spill_dir);
    p.option("--kv-resident", "SIZE", "with --kv-spill-dir: the K/V bytes that may stay in memory (900M, 1.5G)",
             [&context](const std::string& v) { context.kv_resident = parse_size_option("--kv-resident", v); });
}

void add_prompt_cache_options(ArgParser& p, ContextConfig& context) {
    p.option("--cache-prompts", "N",
             "finished prompts whose KV cells stay cached, so that a request sharing a prefix computes only the "
             "rest; evicted least recently used when cells are needed; 0: none (serve's default: as many as -np)",
             &context.n_cached_prompts);
    p.option("--cache-ram", "SIZE",
             "host memory, within --mem, for kept prompts the KV cache evicts: copied back instead of computed "
             "again when a request shares them (default 0: none)",
             [&context](const std::string& v) { context.prompt_cache_ram = parse_size_option("--cache-ram", v); });
    p.option("--cache-disk", "SIZE",
             "disk below --cache-ram: kept prompts host memory gives up go to files (at most SIZE of them), read "
             "back when a request shares them (default 0: none)",
             [&context](const std::string& v) { context.prompt_cache_disk = parse_size_option("--cache-disk", v); });
    p.option("--cache-dir", "DIR",
             "where --cache-disk keeps its files, which then outlive the server: a restart of the same model "
             "file and KV layout takes them up (default: a directory of the server's in the system's temporary "
             "directory, deleted when it stops)",
             &context.prompt_cache_dir);
}

ContextConfig resolve_cached_prompts(ContextConfig c) {
    if (c.n_cached_prompts == kCachedPromptsAsSlots) {
        c.n_cached_prompts = std::clamp(kv::kMaxSequences - c.n_seq, 0, c.n_seq);
    }
    return c;
}

void add_context_shift_options(ArgParser& p, ContextConfig& context) {
    p.option("--context-shift", "",
             "when the context is full, drop the oldest half of the tokens after --keep and go on "
             "(default: stop)",
             [&context](const std::string&) { context.context_shift = true; });
    p.option("--keep", "N", "with --context-shift: the first N tokens always stay (default 0)", &context.n_keep);
}

void add_lookup_options(ArgParser& p, LookupOptions& lookup) {
    p.flag("--lookup", &lookup.enabled,
           "speculative decoding by prompt lookup: draft the tokens that followed the last few tokens where they "
           "occurred before (prompt or output), check them in one forward pass, keep what the model agrees with; "
           "the same text (greedy) or distribution (sampling), faster when the output repeats the prompt");
    p.option("--draft-max", "N",
             "with --lookup or -md: tokens drafted per forward pass at most (default 10 with --lookup, 8 with -md)",
             [&lookup](const std::string& v) {
                 const long long n = parse_integer("--draft-max", v);
                 if (n < 1 || n > 256) throw UsageError("--draft-max: '" + v + "' must be in 1..256");
                 lookup.params.n_draft = static_cast<int>(n);
                 lookup.draft.n_draft = static_cast<int>(n);
                 lookup.draft_max_given = true;
             });
    p.option("--lookup-ngram-min", "N", "with --lookup: the shortest run of last tokens looked up (default 1)",
             [&lookup](const std::string& v) {
                 lookup.params.ngram_min = parse_int("--lookup-ngram-min", v);
                 lookup.lookup_only_flags.push_back("--lookup-ngram-min");
             });
    p.option("--lookup-ngram-max", "N",
             "with --lookup: the longest run of last tokens looked up, tried first (default 3)",
             [&lookup](const std::string& v) {
                 lookup.params.ngram_max = parse_int("--lookup-ngram-max", v);
                 lookup.lookup_only_flags.push_back("--lookup-ngram-max");
             });
}

void add_draft_model_options(ArgParser& p, LookupOptions& lookup, EngineOptions& engine) {
    p.option("-md, --model-draft", "FILE",
             "speculative decoding with a draft model: a smaller GGUF model with the same vocabulary drafts "
             "--draft-max tokens greedily, the model checks them in one forward pass and keeps what it agrees "
             "with; the same text (greedy) or distribution (sampling). Both are planned under --mem",
             [&lookup, &engine](const std::string& v) {
                 if (v.empty()) throw UsageError("-md: the draft model's file name is empty");
                 lookup.draft_model = v;
                 engine.draft_model_path = v;
             });
    p.option("--draft-min", "N", "with -md: a draft of fewer tokens is not checked (default 0)",
             [&lookup](const std::string& v) {
                 lookup.draft.n_min = parse_int("--draft-min", v);
                 lookup.draft_only_flags.push_back("--draft-min");
             });
    p.option("--draft-p-min", "P",
             "with -md: stop drafting at a token the draft model gives a probability below P (default 0.75)",
             [&lookup](const std::string& v) {
                 lookup.draft.p_min = parse_float("--draft-p-min", v);
                 lookup.draft_only_flags.push_back("--draft-p-min");
             });
    p.option("--draft-vocab", "N",
             "with -md: the draft model scores only the first N tokens of the vocabulary, a cheaper output layer "
             "(the common tokens on most vocabularies); 0: all (default)",
             [&lookup](const std::string& v) {
                 lookup.draft.n_vocab = parse_count("--draft-vocab", v);
                 lookup.draft_only_flags.push_back("--draft-vocab");
             });
}

std::unique_ptr<engine::Drafter> make_drafter(engine::Engine& e, const LookupOptions& lookup) {
    if (engine::Engine* d = e.draft()) {
        return std::make_unique<engine::ModelDrafter>(d->model(), d->context(), d->threads(), lookup.draft, &e.host());
    }
    if (lookup.enabled) return std::make_unique<engine::LookupDrafter>(lookup.params);
    return nullptr;
}

void validate_lookup_options(const LookupOptions& lookup) {
    try {
        engine::check(lookup.params);
        engine::check(lookup.draft);
    } catch (const ConfigError& e) {
        throw UsageError(e.what());
    }
    if (lookup.enabled && !lookup.draft_model.empty()) {
        throw UsageError("--lookup and -md are two drafters; use one of them");
    }
    // A drafter's flag without its drafter would be accepted and ignored: refused instead.
    if (!lookup.enabled && !lookup.lookup_only_flags.empty()) {
        throw UsageError(lookup.lookup_only_flags.front() + " works with --lookup only, which is not given");
    }
    if (lookup.draft_model.empty() && !lookup.draft_only_flags.empty()) {
        throw UsageError(lookup.draft_only_flags.front() + " works with -md (a draft model) only, which is not given");
    }
    if (!lookup.enabled && lookup.draft_model.empty() && lookup.draft_max_given) {
        throw UsageError("--draft-max works with --lookup or -md only; neither is given");
    }
}

void apply_lookup_options(const LookupOptions& lookup, ContextConfig& context) {
    if (lookup.enabled) context.n_outputs = std::max(context.n_outputs, lookup.params.n_draft + 1);
    if (!lookup.draft_model.empty()) context.n_outputs = std::max(context.n_outputs, lookup.draft.n_draft + 1);
}

int parse_count(const std::string& name, const std::string& text) {
    const long long n = parse_integer(name, text);
    if (n < 0 || n > 1'000'000) throw UsageError(name + ": '" + text + "' must be in 0..1000000");
    return static_cast<int>(n);
}

void add_budget_options(ArgParser& p, EngineOptions& o) {
    p.option("--mem", "SIZE",
             "host memory budget: 900M, 1.5G, 2GiB, bytes (default: the cgroup limit, else MemAvailable, "
             "less 5% or 64 MiB); a plan over it is refused before loading",
             [&o](const std::string& v) {
                 o.load.mem = parse_size_option("--mem", v);
                 o.mem_label = "--mem " + v;
             });
    p.flag("--fit", &o.load.fit,
           "when the plan does not fit --mem: quantize the KV cache, stream weights, shorten the context (in "
           "that order) until it does, and say why");
    p.option("--stream-layers", "N",
             "stream the weights of the last N layers from the file instead of keeping them "
             "resident (default: none, or what --fit picks)",
             [&o](const std::string& v) { o.load.stream_layers = parse_count("--stream-layers", v); });
    p.option("--expert-cache", "N|auto|off",
             "a mixture-of-experts model's routed experts in a cache of N slots (auto: as many as --mem holds), "
             "read from the file on demand, the dense weights resident (default: off, or what --fit picks)",
             [&o](const std::string& v) {
                 if (v == "auto") {
                     o.load.expert_slots = LoadConfig::kExpertsAuto;
                 } else if (v == "off") {
                     o.load.expert_slots = 0;
                 } else {
                     o.load.expert_slots = parse_count("--expert-cache", v);
                 }
             });
    p.option("--expert-prefetch", "on|off",
             "with an expert cache, read ahead the experts the next layer's router would choose (default on)",
             [&o](const std::string& v) {
                 if (v != "on" && v != "off")
                     throw UsageError("--expert-prefetch: expected on or off, got '" + v + "'");
                 o.load.expert_prefetch = v == "on";
             });
    p.option("--expert-evict", "lfu|lru",
             "with an expert cache, give up the slot of the expert looked up least often lately (lfu, the "
             "default) or least recently (lru)",
             [&o](const std::string& v) {
                 if (v != "lfu" && v != "lru") throw UsageError("--expert-evict: expected lfu or lru, got '" + v + "'");
                 o.load.expert_evict = v == "lfu" ? ExpertEvict::lfu : ExpertEvict::lru;
             });
    add_offload_options(p, o.load.offload);
}

void add_memory_options(ArgParser& p, EngineOptions& o) {
    add_budget_options(p, o);
    p.flag("--mlock", &o.load.mlock, "lock the resident weights in RAM (within --mem and RLIMIT_MEMLOCK, or refused)");
}

void add_offload_options(ArgParser& p, OffloadConfig& offload) {
    p.option("--device", "NAME",
             "the device offloaded layers run on: cuda0 (cuda1, ...), or virtual (CPU-executed, with its own "
             "--vram budget, for testing placements), or virtual-unified (virtual with --unified); default: the "
             "first CUDA device when -ngl asks for one",
             &offload.device);
    p.option("-ngl, --n-gpu-layers", "N",
             "run the last N layers on the device (more than the model's layers: the output layer too; "
             "default with --device: as many as fit --vram)",
             [&offload](const std::string& v) { offload.n_gpu_layers = parse_count("-ngl", v); });
    p.option("--vram", "SIZE",
             "the device's memory budget (default: its free memory; the virtual device: no limit; a unified "
             "device has none of its own: --mem)",
             [&offload](const std::string& v) { offload.vram = parse_size_option("--vram", v); });
    p.option("--no-kv-offload", "", "keep the KV cache of offloaded layers in host memory",
             [&offload](const std::string&) { offload.kv_offload = false; });
    p.option("--cpu-moe", "",
             "keep the routed experts (ffn_{gate,up,down}_exps and their router) of every offloaded layer on the "
             "host, where they run; the rest of each layer runs on the device (a mixture of experts offloads "
             "only so)",
             [&offload](const std::string&) { offload.n_cpu_moe = OffloadConfig::kAllLayers; });
    p.option("--n-cpu-moe", "N", "--cpu-moe for the first N layers only",
             [&offload](const std::string& v) { offload.n_cpu_moe = parse_count("--n-cpu-moe", v); });
    p.option("-ot, --override-tensor", "REGEX=DEVICE,...",
             "tensors whose name REGEX finds go to DEVICE: CPU (kept on the host) or the -ngl device; the first "
             "rule that matches decides; repeatable. Only the routed experts of an offloaded layer can stay on "
             "the host (e.g. 'exps=CPU'); others are refused",
             [&offload](const std::string& v) { offload.override_tensors.push_back(v); });
    p.flag("--unified", &offload.unified,
           "the device shares the host's memory (integrated GPUs; automatic for a CUDA device that reports itself "
           "integrated): offloaded layers read their weights in place from the mapped file, no copies, and the "
           "device's KV cache and activations come out of --mem (one budget; default with it: every layer)");
}

namespace {

std::string base_name(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

int with_engine(const char* command, const EngineOptions& options, const std::function<int(engine::Engine&)>& body) {
    LoadConfig load = options.load;
    LoadProgress progress(stderr, base_name(load.model_path), isatty(fileno(stderr)) != 0);
    load.on_load_progress = [&progress](uint64_t done, uint64_t total) { progress.update(done, total); };
    std::unique_ptr<engine::Engine> e;
    try {
        e = engine::Engine::load(load, options.context,
                                 engine::Resources::open(load, options.context.n_threads, options.mem_label),
                                 options.draft_model_path);
    } catch (const DoesNotFitError& err) {
        std::fprintf(stderr, "fitllm %s: %s\n", command, err.what());
        if (!err.plan_text().empty()) {
            std::fprintf(stderr, "\n%s\n", err.plan_text().c_str());
            std::fprintf(stderr, "fitllm %s: %s\n", command,
                         load.fit ? "nothing fits even with --fit: raise --mem or use a smaller model"
                                  : "use --fit to let fitllm choose settings that fit (quantized KV cache, streamed "
                                    "layers, then a shorter context), or raise --mem");
        }
        return kExitDoesNotFit;
    } catch (const ConfigError& err) {
        throw UsageError(err.what());
    }
    const engine::Plan& plan = e->plan();
    if (load.fit) {
        for (const engine::FitStep& s : plan.fit_steps) {
            std::fprintf(stderr, "fitllm %s --fit: %s\n    why: %s\n", command, s.change.c_str(), s.reason.c_str());
        }
        std::fprintf(stderr, "fitllm %s --fit: %s%s: %s planned of the %s budget\n", command,
                     plan.fit_steps.empty() ? "fits as asked, " : "", engine::settings_text(plan).c_str(),
                     util::human_bytes(plan.total()).c_str(), util::human_bytes(plan.params.budget).c_str());
    }
    if (e->locked_bytes() > 0) {
        std::fprintf(stderr, "mlock: %s of resident weights locked\n", util::human_bytes(e->locked_bytes()).c_str());
    }
    try {
        return body(*e);
    } catch (const ConfigError& err) {
        throw UsageError(err.what());
    }
}

long peak_rss_kib() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
}

}  // namespace fitllm::cli
