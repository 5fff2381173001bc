#pragma once
// fitllm's C++ API: load a GGUF model inside a memory budget, see its plan, tokenize, render its
// chat template, generate text (whole, streamed, several continuations at once), measure
// perplexity and read what every memory pool holds. Nothing of fitllm's insides shows here.
//
//   #include <fitllm/fitllm.h>
//   fitllm::Engine engine = fitllm::Engine::load({.model_path = "model.gguf", .mem = fitllm::parse_size("2G")});
//   fitllm::Completion c = engine.generate("Once upon a time", {.max_tokens = 32},
//                                          [](std::string_view piece) { std::cout << piece; return true; });
//
// Build against the installed package: find_package(fitllm) and target_link_libraries(app
// fitllm::fitllm), or `pkg-config --cflags --libs fitllm`. Errors are exceptions derived from
// fitllm::Error (fitllm/error.h): a plan over the budget is DoesNotFitError, an allocation the
// budget has no room for BudgetError (with the numbers), a setting refused ConfigError.
//
// An Engine runs one generation at a time; use one Engine per thread, or serialize the calls.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fitllm/config.h"
#include "fitllm/error.h"
#include "fitllm/export.h"
#include "fitllm/version.h"

namespace fitllm {

struct ChatMessage {
    std::string role;  // "system", "user", "assistant"
    std::string content;
};

struct SamplingOptions {
    float temperature = 0.8f;  // <= 0: greedy
    int top_k = 40;            // 0: off
    float top_p = 0.95f;       // 1: off
    float min_p = 0.05f;       // 0: off
    float repeat_penalty = 1.0f;
    float frequency_penalty = 0.0f;
    float presence_penalty = 0.0f;
    int penalty_last_n = 64;       // the tokens the penalties look back over
    std::optional<uint64_t> seed;  // unset: a random one
};

struct GenerateOptions {
    int max_tokens = 128;
    SamplingOptions sampling;
    std::vector<std::string> stop;  // generation ends before the first of these (not in the text)
    // generate(): the model's BOS before the prompt as it asks, and control tokens spelled in the
    // prompt ("<start_of_turn>") read as such.
    bool add_special = true;
    bool parse_special = true;
};

enum class FinishReason {
    stop,          // an end-of-generation token or a stop string
    length,        // max_tokens
    context_full,  // the context holds no more tokens (ContextConfig::context_shift goes on instead)
    cancelled,     // the callback returned false
};
FITLLM_API std::string_view finish_reason_name(FinishReason reason);  // "stop", "length", ...

struct Completion {
    std::string text;
    std::vector<int32_t> tokens;  // the generated tokens (an end-of-generation token included)
    FinishReason finish_reason = FinishReason::length;
    int n_prompt = 0;      // tokens of the prompt
    int n_prompt_fed = 0;  // of them, those computed (the rest were in the cache from the last call)
    double prompt_seconds = 0.0;
    double generate_seconds = 0.0;
};

// Called with each piece of text as it completes; false stops the generation.
using TextCallback = std::function<bool(std::string_view piece)>;

// The plan of a load: where every byte goes, whether it fits, what fitting changed.
struct PlanReport {
    uint64_t total = 0;  // the host's bytes
    uint64_t budget = 0;
    bool fits = false;
    uint64_t weights = 0, kv = 0, scratch = 0, logits = 0, overhead = 0;
    int n_ctx = 0;                       // the context as planned (fitting may shorten it)
    std::vector<std::string> fit_steps;  // "KV cache f16/f16 -> q8_0/q8_0 (why: ...)"
    std::string text;                    // the table `fitllm plan` prints
    std::string json;                    // the JSON `fitllm plan --json` prints
};

struct PoolUsage {
    std::string name;  // "weights", "kv", "scratch", "logits", "staging", "overhead"
    uint64_t used = 0;
    uint64_t peak = 0;
};

struct DeviceUsage {
    std::string name;  // "host", "cuda0", "virtual"
    uint64_t capacity = 0;
    uint64_t used = 0;
    uint64_t peak = 0;
    std::vector<PoolUsage> pools;
};

struct MemoryReport {
    std::vector<DeviceUsage> devices;  // the host first
    uint64_t plan_total = 0;
    uint64_t peak_rss = 0;  // the process's peak resident set (VmHWM), 0 where unknown
};

struct PerplexityOptions {
    int n_ctx = 512;    // tokens per chunk; the text needs 2 * n_ctx at least
    int n_chunks = -1;  // < 0: all
    int n_batch = 512;
    int n_seq = 1;  // chunks evaluated together
};

struct PerplexityResult {
    double ppl = 0.0;
    double ppl_error = 0.0;
    int n_chunks = 0;
    int64_t n_scored = 0;
};

class Generation;

class FITLLM_API Engine {
public:
    // Plans the model for `context` against load.mem (fitting it with load.fit), then loads it:
    // fitllm's only load path, the same as `fitllm run`'s. Throws DoesNotFitError (nothing loaded),
    // ConfigError, BudgetError, and fitllm::Error for a file that cannot be read or run.
    static Engine load(const LoadConfig& load, const ContextConfig& context = {});
    // The plan without loading (as `fitllm plan`).
    static PlanReport plan(const LoadConfig& load, const ContextConfig& context = {});

    Engine(Engine&&) noexcept;
    Engine& operator=(Engine&&) noexcept;
    ~Engine();

    PlanReport plan() const;
    // The context as planned: n_ctx, K/V types as fitting left them.
    ContextConfig context() const;
    std::string architecture() const;  // "llama", "gemma3", ...
    int n_vocab() const;
    int n_ctx_train() const;
    std::string chat_template_source() const;  // the model's own, or which built-in and why

    std::vector<int32_t> tokenize(std::string_view text, bool add_special = true, bool parse_special = false) const;
    std::string detokenize(std::span<const int32_t> tokens) const;
    // The prompt the model sees for a conversation (its chat template).
    std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;

    // Continues `prompt`; on_text gets each piece as it completes. The tokens the engine's context
    // holds from the last call are reused where the new prompt starts with them.
    Completion generate(std::string_view prompt, const GenerateOptions& options = {}, const TextCallback& on_text = {});
    // The assistant's reply to a conversation, through the chat template.
    Completion chat(const std::vector<ChatMessage>& messages, const GenerateOptions& options = {},
                    const TextCallback& on_text = {});
    // n continuations of one prompt decoded together (the prompt's cache shared; seeds seed + i).
    std::vector<Completion> generate_parallel(std::string_view prompt, int n, const GenerateOptions& options = {});
    // A generation to pull pieces from one at a time (the engine is busy until it ends or goes).
    Generation start(std::string_view prompt, const GenerateOptions& options = {});

    // As `fitllm perplexity` (llama-perplexity's method).
    PerplexityResult perplexity(std::string_view text, const PerplexityOptions& options = {});

    MemoryReport memory() const;

    struct Impl;

private:
    explicit Engine(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
    friend class Generation;
};

// A generation in progress (Engine::start): next() samples and returns the next piece of text.
class FITLLM_API Generation {
public:
    Generation(Generation&&) noexcept;
    Generation& operator=(Generation&&) noexcept;
    ~Generation();

    // The next piece of text (pieces may be empty while a UTF-8 character or a possible stop string
    // is held back), or nullopt when the generation has ended.
    std::optional<std::string> next();
    // Ends it now (finish reason cancelled).
    void cancel();
    bool done() const;
    // What has been generated so far; finish_reason once done().
    const Completion& result() const;

    struct State;

private:
    explicit Generation(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
    friend class Engine;
};

}  // namespace fitllm
