// Every flag of every subcommand that loads a model, walked against what it sets: parsing the flag
// alone must change exactly the fields this table says, in the engine's LoadConfig and
// ContextConfig or in the command's own options. A flag that sets nothing (accepted and dropped),
// or something else than the table says, fails here; a new flag fails until the table names
// what it sets.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "fitllm/config.h"

namespace fitllm::cli {
namespace {

using Fields = std::map<std::string, std::string>;

template <class T>
std::string str(const T& v) {
    if constexpr (std::is_same_v<T, std::string>) {
        return v;
    } else if constexpr (std::is_same_v<T, bool>) {
        return v ? "true" : "false";
    } else if constexpr (std::is_same_v<T, KvType>) {
        return std::string(kv_type_name(v));
    } else {
        return std::to_string(v);
    }
}

void add(Fields& f, const LoadConfig& l) {
    f["load.model_path"] = l.model_path;
    f["load.mem"] = str(l.mem);
    f["load.fit"] = str(l.fit);
    f["load.fit_may_shorten_context"] = str(l.fit_may_shorten_context);
    f["load.mlock"] = str(l.mlock);
    f["load.stream_layers"] = str(l.stream_layers);
    f["load.offload.device"] = l.offload.device;
    f["load.offload.n_gpu_layers"] = str(l.offload.n_gpu_layers);
    f["load.offload.vram"] = str(l.offload.vram);
    f["load.offload.kv_offload"] = str(l.offload.kv_offload);
    f["load.offload.unified"] = str(l.offload.unified);
    std::string rules;
    for (const std::string& r : l.offload.override_tensors) rules += r + ";";
    f["load.offload.override_tensors"] = rules;
    f["load.offload.n_cpu_moe"] = str(l.offload.n_cpu_moe);
    f["load.expert_slots"] = str(l.expert_slots);
    f["load.expert_prefetch"] = str(l.expert_prefetch);
    f["load.expert_evict"] = l.expert_evict == ExpertEvict::lfu ? "lfu" : "lru";
}

void add(Fields& f, const ContextConfig& c) {
    f["context.n_ctx"] = str(c.n_ctx);
    f["context.n_seq"] = str(c.n_seq);
    f["context.n_batch"] = str(c.n_batch);
    f["context.n_outputs"] = str(c.n_outputs);
    f["context.type_k"] = str(c.type_k);
    f["context.type_v"] = str(c.type_v);
    f["context.kv_rotation"] = str(c.kv_rotation);
    f["context.kv_spill_dir"] = c.kv_spill_dir;
    f["context.kv_resident"] = str(c.kv_resident);
    f["context.context_shift"] = str(c.context_shift);
    f["context.n_keep"] = str(c.n_keep);
    f["context.n_threads"] = str(c.n_threads);
    f["context.n_cached_prompts"] = str(c.n_cached_prompts);
    f["context.prompt_cache_ram"] = str(c.prompt_cache_ram);
    f["context.prompt_cache_disk"] = str(c.prompt_cache_disk);
    f["context.prompt_cache_dir"] = c.prompt_cache_dir;
}

void add(Fields& f, const EngineOptions& e) {
    add(f, e.load);
    add(f, e.context);
    f["mem_label"] = e.mem_label;
    f["draft_model_path"] = e.draft_model_path;
}

void add(Fields& f, const sampling::SamplingParams& s) {
    f["sampling.temperature"] = str(s.temperature);
    f["sampling.top_k"] = str(s.top_k);
    f["sampling.top_p"] = str(s.top_p);
    f["sampling.min_p"] = str(s.min_p);
    f["sampling.typical_p"] = str(s.typical_p);
    f["sampling.repeat_penalty"] = str(s.repeat_penalty);
    f["sampling.frequency_penalty"] = str(s.frequency_penalty);
    f["sampling.presence_penalty"] = str(s.presence_penalty);
    f["sampling.penalty_last_n"] = str(s.penalty_last_n);
    f["sampling.seed"] = str(s.seed);
    f["sampling.grammar"] = s.grammar ? "set" : "none";
}

void add(Fields& f, const LookupOptions& l) {
    f["lookup.enabled"] = str(l.enabled);
    f["lookup.n_draft"] = str(l.params.n_draft);
    f["lookup.ngram_min"] = str(l.params.ngram_min);
    f["lookup.ngram_max"] = str(l.params.ngram_max);
    f["lookup.draft_model"] = l.draft_model;
    f["draft.n_draft"] = str(l.draft.n_draft);
    f["draft.n_min"] = str(l.draft.n_min);
    f["draft.p_min"] = str(l.draft.p_min);
    f["draft.n_vocab"] = str(l.draft.n_vocab);
}

Fields fields(const RunOptions& o) {
    Fields f;
    add(f, o.engine);
    add(f, o.sampling);
    add(f, o.lookup);
    f["prompt"] = o.prompt;
    f["n_predict"] = str(o.n_predict);
    return f;
}

Fields fields(const ChatOptions& o) {
    Fields f;
    add(f, o.engine);
    add(f, o.sampling);
    add(f, o.lookup);
    f["system_prompt"] = o.system_prompt;
    f["n_predict"] = str(o.n_predict);
    return f;
}

Fields fields(const BenchOptions& o) {
    Fields f;
    add(f, o.engine);
    f["n_prompt"] = str(o.n_prompt);
    f["n_gen"] = str(o.n_gen);
    f["repetitions"] = str(o.repetitions);
    f["output"] = o.output;
    return f;
}

Fields fields(const PerplexityOptions& o) {
    Fields f;
    add(f, o.engine);
    f["text_path"] = o.text_path;
    f["ppl.n_ctx"] = str(o.n_ctx);
    f["ppl.n_chunks"] = str(o.n_chunks);
    f["ppl.n_seq"] = str(o.n_seq);
    f["kl_base_path"] = o.kl_base_path;
    f["kl_compare"] = str(o.kl_compare);
    return f;
}

Fields fields(const PlanOptions& o) {
    Fields f;
    add(f, o.engine);
    f["as_json"] = str(o.as_json);
    f["draft_max"] = str(o.draft_max);
    return f;
}

Fields fields(const ServeOptions& o) {
    Fields f;
    add(f, o.engine);
    add(f, o.lookup);
    f["models_dir"] = o.models_dir;
    f["alias"] = o.alias;
    f["strict_model_names"] = o.strict_model_names ? "true" : "false";
    f["host"] = o.host;
    f["port"] = str(o.port);
    f["ttl"] = str(o.ttl);
    f["max_queue"] = str(o.max_queue);
    f["http.api_key"] = o.http.api_key;
    f["http.max_body"] = str(o.http.max_body);
    f["http.request_timeout"] = str(o.http.request_timeout);
    f["http.max_connections"] = str(o.http.max_connections);
    f["http.max_connections_per_client"] = str(o.http.max_connections_per_client);
    std::string hosts, origins;
    for (const std::string& h : o.http.allowed_hosts) hosts += h + ";";
    for (const std::string& h : o.http.cors_origins) origins += h + ";";
    f["http.allowed_hosts"] = hosts;
    f["http.cors_origins"] = origins;
    return f;
}

// A value for each flag that differs from every command's default.
const std::map<std::string, std::string> kSamples = {
    {"-m", "model.gguf"},
    {"-c", "1000"},
    {"-b", "100"},
    {"-t", "3"},
    {"-np", "3"},
    {"-ctk", "q8_0"},
    {"-ctv", "q4_0"},
    {"--no-kv-rotation", ""},
    {"--kv-spill-dir", "/tmp/spill"},
    {"--kv-resident", "1M"},
    {"--context-shift", ""},
    {"--keep", "5"},
    {"--mem", "1G"},
    {"--fit", ""},
    {"--mlock", ""},
    {"--stream-layers", "2"},
    {"--device", "virtual"},
    {"-ngl", "3"},
    {"--vram", "1G"},
    {"--no-kv-offload", ""},
    {"--unified", ""},
    {"--cpu-moe", ""},
    {"--n-cpu-moe", "3"},
    {"-ot", "exps=CPU"},
    {"--temp", "0.5"},
    {"--top-k", "7"},
    {"--top-p", "0.5"},
    {"--min-p", "0.2"},
    {"--seed", "9"},
    {"--repeat-penalty", "1.3"},
    {"--presence-penalty", "0.5"},
    {"--frequency-penalty", "0.25"},
    {"--repeat-last-n", "32"},
    {"--typical", "0.9"},
    {"--grammar", "root ::= \"a\""},
    {"-j", "{\"type\": \"boolean\"}"},
    {"-p", "7"},
    {"-n", "7"},
    {"--system", "be brief"},
    {"-r", "2"},
    {"-o", "json"},
    {"-f", "text.txt"},
    {"--chunks", "3"},
    {"--kl-divergence-base", "base.kld"},
    {"--kl-divergence", ""},
    {"--json", ""},
    {"--models-dir", "models"},
    {"--alias", "my-model"},
    {"--strict-model-names", ""},
    {"--host", "0.0.0.0"},
    {"--port", "9000"},
    {"--ttl", "5"},
    {"--api-key", "secret"},
    {"--max-body", "2M"},
    {"--request-timeout", "7"},
    {"--max-connections", "9"},
    {"--max-connections-per-client", "3"},
    {"--allowed-hosts", "box.local,other"},
    {"--cors-origin", "http://localhost:3000"},
    {"--max-queue", "3"},
    {"--cache-prompts", "2"},
    {"--cache-ram", "64M"},
    {"--cache-disk", "1G"},
    {"--expert-cache", "64"},
    {"--expert-prefetch", "off"},
    {"--expert-evict", "lru"},
    {"--cache-dir", "/var/tmp"},
    {"--lookup", ""},
    {"--draft-max", "4"},
    {"--lookup-ngram-min", "2"},
    {"--lookup-ngram-max", "5"},
    {"-md", "draft.gguf"},
    {"--draft-min", "2"},
    {"--draft-p-min", "0.5"},
    {"--draft-vocab", "1000"},
};

// What each flag sets, where every command that has it sets the same.
const std::map<std::string, std::set<std::string>> kSets = {
    {"-m", {"load.model_path"}},
    {"-c", {"context.n_ctx"}},
    {"-b", {"context.n_batch"}},
    {"-t", {"context.n_threads"}},
    {"-np", {"context.n_seq"}},
    {"-ctk", {"context.type_k"}},
    {"-ctv", {"context.type_v"}},
    {"--no-kv-rotation", {"context.kv_rotation"}},
    {"--kv-spill-dir", {"context.kv_spill_dir"}},
    {"--kv-resident", {"context.kv_resident"}},
    {"--context-shift", {"context.context_shift"}},
    {"--keep", {"context.n_keep"}},
    {"--mem", {"load.mem", "mem_label"}},
    {"--fit", {"load.fit"}},
    {"--mlock", {"load.mlock"}},
    {"--stream-layers", {"load.stream_layers"}},
    {"--device", {"load.offload.device"}},
    {"-ngl", {"load.offload.n_gpu_layers"}},
    {"--vram", {"load.offload.vram"}},
    {"--no-kv-offload", {"load.offload.kv_offload"}},
    {"--unified", {"load.offload.unified"}},
    {"--cpu-moe", {"load.offload.n_cpu_moe"}},
    {"--n-cpu-moe", {"load.offload.n_cpu_moe"}},
    {"-ot", {"load.offload.override_tensors"}},
    {"--temp", {"sampling.temperature"}},
    {"--top-k", {"sampling.top_k"}},
    {"--top-p", {"sampling.top_p"}},
    {"--min-p", {"sampling.min_p"}},
    {"--seed", {"sampling.seed"}},
    {"--repeat-penalty", {"sampling.repeat_penalty"}},
    {"--presence-penalty", {"sampling.presence_penalty"}},
    {"--frequency-penalty", {"sampling.frequency_penalty"}},
    {"--repeat-last-n", {"sampling.penalty_last_n"}},
    {"--typical", {"sampling.typical_p"}},
    {"--grammar", {"sampling.grammar"}},
    {"-j", {"sampling.grammar"}},
    {"-p", {"prompt"}},
    {"-n", {"n_predict"}},
    {"--system", {"system_prompt"}},
    {"-r", {"repetitions"}},
    {"-o", {"output"}},
    {"-f", {"text_path"}},
    {"--chunks", {"ppl.n_chunks"}},
    {"--kl-divergence-base", {"kl_base_path"}},
    {"--kl-divergence", {"kl_compare"}},
    {"--json", {"as_json"}},
    {"--models-dir", {"models_dir"}},
    {"--alias", {"alias"}},
    {"--strict-model-names", {"strict_model_names"}},
    {"--host", {"host"}},
    {"--port", {"port"}},
    {"--ttl", {"ttl"}},
    {"--api-key", {"http.api_key"}},
    {"--max-body", {"http.max_body"}},
    {"--request-timeout", {"http.request_timeout"}},
    {"--max-connections", {"http.max_connections"}},
    {"--max-connections-per-client", {"http.max_connections_per_client"}},
    {"--allowed-hosts", {"http.allowed_hosts"}},
    {"--cors-origin", {"http.cors_origins"}},
    {"--max-queue", {"max_queue"}},
    {"--cache-prompts", {"context.n_cached_prompts"}},
    {"--cache-ram", {"context.prompt_cache_ram"}},
    {"--cache-disk", {"context.prompt_cache_disk"}},
    {"--expert-cache", {"load.expert_slots"}},
    {"--expert-prefetch", {"load.expert_prefetch"}},
    {"--expert-evict", {"load.expert_evict"}},
    {"--cache-dir", {"context.prompt_cache_dir"}},
    {"--lookup", {"lookup.enabled"}},
    {"--draft-max", {"lookup.n_draft", "draft.n_draft"}},
    {"--lookup-ngram-min", {"lookup.ngram_min"}},
    {"--lookup-ngram-max", {"lookup.ngram_max"}},
    {"-md", {"lookup.draft_model", "draft_model_path"}},
    {"--draft-min", {"draft.n_min"}},
    {"--draft-p-min", {"draft.p_min"}},
    {"--draft-vocab", {"draft.n_vocab"}},
};

using Overrides = std::map<std::string, std::set<std::string>>;

std::set<std::string> changed(const Fields& before, const Fields& after) {
    std::set<std::string> out;
    for (const auto& [name, value] : after) {
        if (before.at(name) != value) out.insert(name);
    }
    return out;
}

std::string joined(const std::set<std::string>& names) {
    std::string s;
    for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
    return s.empty() ? "nothing" : s;
}

// Parses each declared flag alone and compares what changed with the table.
template <class Options>
void walk(const char* command, ArgParser (*make_parser)(Options&), const Overrides& overrides = {}) {
    Options defaults;
    const ArgParser declared = make_parser(defaults);
    const Fields base = fields(defaults);
    int walked = 0;
    for (const ArgParser::OptionInfo& info : declared.options()) {
        const std::string& flag = info.names.front();
        if (flag == "-h") continue;
        SCOPED_TRACE(std::string("fitllm ") + command + " " + flag);
        const auto sample = kSamples.find(flag);
        ASSERT_NE(sample, kSamples.end()) << "flag_test.cpp has no sample value for " << flag << ": add one";
        Options o;
        ArgParser parser = make_parser(o);
        std::vector<std::string> args = {flag};
        if (!info.metavar.empty()) args.push_back(sample->second);
        ASSERT_TRUE(parser.parse(args));
        const auto over = overrides.find(flag);
        const auto common = kSets.find(flag);
        ASSERT_TRUE(over != overrides.end() || common != kSets.end())
            << "flags_test.cpp does not say what " << flag << " sets: add it to kSets or the command's overrides";
        const std::set<std::string>& expected = over != overrides.end() ? over->second : common->second;
        const std::set<std::string> got = changed(base, fields(o));
        EXPECT_EQ(got, expected) << flag << " set " << joined(got) << "; expected " << joined(expected);
        ++walked;
    }
    EXPECT_GT(walked, 5) << command;
}

TEST(Flags, RunSetsWhatItSays) {
    walk<RunOptions>("run", run_parser);
}

TEST(Flags, ChatSetsWhatItSays) {
    walk<ChatOptions>("chat", chat_parser);
}

TEST(Flags, BenchSetsWhatItSays) {
    walk<BenchOptions>("bench", bench_parser, {{"-p", {"n_prompt"}}, {"-n", {"n_gen"}}});
}

TEST(Flags, PerplexitySetsWhatItSays) {
    walk<PerplexityOptions>("perplexity", perplexity_parser, {{"-c", {"ppl.n_ctx"}}, {"-np", {"ppl.n_seq"}}});
}

TEST(Flags, PlanSetsWhatItSays) {
    walk<PlanOptions>("plan", plan_parser, {{"-md", {"draft_model_path"}}, {"--draft-max", {"draft_max"}}});
}

// The server takes the same engine flags as run (its models' LoadConfig and ContextConfig):
// before the engine layer, --kv-spill-dir, --kv-resident and --no-kv-rotation were accepted and
// dropped here.
TEST(Flags, ServeSetsWhatItSays) {
    walk<ServeOptions>("serve", serve_parser);
    ServeOptions o;
    ArgParser p = serve_parser(o);
    ASSERT_TRUE(p.parse({"--kv-spill-dir", "/tmp/x", "--kv-resident", "2M", "--no-kv-rotation", "-ctk", "q4_0"}));
    EXPECT_EQ(o.engine.context.kv_spill_dir, "/tmp/x");
    EXPECT_EQ(o.engine.context.kv_resident, 2u << 20);
    EXPECT_FALSE(o.engine.context.kv_rotation);
    EXPECT_EQ(o.engine.context.type_k, KvType::q4_0);

    // --cache-prompts: as many as -np by default, within the 64 sequence ids; more is refused.
    const auto cached = [](std::vector<std::string> args) {
        ServeOptions so;
        ArgParser sp = serve_parser(so);
        args.insert(args.begin(), {"-m", "model.gguf"});
        EXPECT_TRUE(sp.parse(args));
        validate(so);
        return registry_options(so).context.n_cached_prompts;
    };
    EXPECT_EQ(cached({}), 4);
    EXPECT_EQ(cached({"-np", "2"}), 2);
    EXPECT_EQ(cached({"-np", "62"}), 2);
    EXPECT_EQ(cached({"--cache-prompts", "0"}), 0);
    EXPECT_EQ(cached({"--cache-prompts", "9"}), 9);
    EXPECT_THROW(cached({"--cache-prompts", "61"}), UsageError);
    EXPECT_THROW(cached({"--cache-prompts", "-2"}), UsageError);
    EXPECT_THROW(cached({"--cache-prompts", "0", "--cache-ram", "1G"}), UsageError);  // nothing to keep
    EXPECT_THROW(cached({"--cache-disk", "1G"}), UsageError);                         // no host memory tier
    // Files for the next run with keys shaped by a K transform: it goes with them (engine/prompt_cache.h).
    const std::vector<std::string> tiers = {"--cache-ram", "1G", "--cache-disk", "1G", "--cache-dir", "/var/tmp"};
    for (const char* type : {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"}) {
        std::vector<std::string> args = tiers;
        args.insert(args.end(), {"-ctk", type});
        EXPECT_EQ(cached(args), 4) << type;
        args.push_back("--no-kv-rotation");
        EXPECT_EQ(cached(args), 4) << type << ": unshaped keys";
        args = {"--cache-ram", "1G", "--cache-disk", "1G", "-ctk", type, "-ctv", type};
        EXPECT_EQ(cached(args), 4) << type << ": files for this run only";
    }
    for (const char* type : {"f16", "bf16", "f32"}) {
        std::vector<std::string> args = tiers;
        args.insert(args.end(), {"-ctk", type, "-ctv", "q8_0"});
        EXPECT_EQ(cached(args), 4) << type;
    }
}

// What the server cannot do is refused by name rather than accepted.
TEST(Flags, ServeRefusesWhatItCannotDo) {
    for (const char* flag : {"--context-shift", "-p", "--temp"}) {
        ServeOptions o;
        ArgParser p = serve_parser(o);
        EXPECT_THROW(p.parse({flag, "1"}), UsageError) << flag;
    }
}

}  // namespace
}  // namespace fitllm::cli
