#pragma once
// The engine (DESIGN idea 3 made code): the one place where a configuration becomes a running
// model. Engine::load plans the model for its context against the budget, changes the settings
// when asked to fit, charges what it loads, locks and loads the weights and reads them in. Every
// front end (the CLI's subcommands, the server's registry, the public API) loads through it, and
// the contexts that run on the model (sessions, parallel decoding, the scheduler, perplexity) take
// their memory through it, sized by the same planner.
//
//   fitllm::LoadConfig load{.model_path = path, .mem = fitllm::parse_size("1G"), .fit = true};
//   fitllm::ContextConfig context{.n_ctx = 8192};
//   std::unique_ptr<engine::Engine> e = engine::Engine::load(load, context);  // or DoesNotFitError
//   engine::Session session(e->model(), e->context(), e->threads(), &e->host());
//   ... std::fprintf(stderr, "%s\n", e->peak_summary().c_str());
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "chat/chat_template.h"
#include "engine/context.h"
#include "engine/plan.h"
#include "engine/resources.h"
#include "fitllm/config.h"
#include "fitllm/error.h"
#include "gguf/gguf_reader.h"
#include "memory/pool.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::engine {

// The plan fits the budget, but engines sharing the resources hold the room it needs (the
// server answers 503 and may unload idle models first). Nothing was loaded.
class BudgetBusyError : public Error {
public:
    using Error::Error;
};

class Engine {
public:
    // Plans the model of load.model_path for `context` on `resources` (nullptr: resources of its
    // own, Resources::open(load, context.n_threads)); with load.fit, fit_plan() changes the
    // settings (plan().fit_steps says how and why). Then charges the planned overhead and the
    // resident weights to the host, locks them with load.mlock (all or nothing, within the budget
    // and RLIMIT_MEMLOCK), loads the model (it charges its scratch and stream buffers, and streams
    // the planned layers), and reads the resident weights in (load.on_load_progress).
    // Throws DoesNotFitError when the plan does not fit the budget (nothing loaded),
    // BudgetBusyError when it fits but shared resources lack the room now, ConfigError for
    // settings refused, and what loading throws (gguf::FormatError, model::ModelError,
    // io::IoError, memory::BudgetError).
    //
    // draft_model_path (not empty): a draft model for speculative decoding (engine/drafter.h),
    // loaded after the model on the same resources and budget (its CPU layers only): it is planned
    // first, for draft_context(context), and the model is planned (and fitted) for what the budget
    // leaves. DoesNotFitError when the draft alone does not fit or the two together do not,
    // ConfigError naming both files when their vocabularies differ. draft_slots: the draft
    // sessions the model's user runs (serve: one per slot), each with a KV cache and a row of
    // logits of its own: the draft's plan counts them all (Plan::draft_slots).
    static std::unique_ptr<Engine> load(const LoadConfig& load, const ContextConfig& context,
                                        std::shared_ptr<Resources> resources = nullptr,
                                        const std::string& draft_model_path = {}, int draft_slots = 1);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    const Plan& plan() const { return plan_; }
    // The context the plan was made for, as --fit left it: n_ctx (resolved when it was 0), the K/V
    // types. Contexts made from it fit the plan.
    const ContextConfig& context() const { return context_; }
    const LoadConfig& load_config() const { return load_; }
    // The plan as `fitllm plan` prints it, with the budget's source.
    std::string plan_text() const;
    // The draft model loaded with this one (nullptr: none), on the same resources.
    Engine* draft() { return draft_.get(); }
    const Engine* draft() const { return draft_.get(); }
    // Bytes of resident weights locked with load.mlock (0 without).
    uint64_t locked_bytes() const { return locked_bytes_; }

    gguf::GgufFile& file() { return *file_; }
    const gguf::GgufFile& file() const { return *file_; }
    model::Model& model() { return *model_; }
    const model::Model& model() const { return *model_; }
    // The tokenizer, built from the file's metadata on first use (a model file may have none:
    // tokenizer::VocabError then, as `fitllm bench` never asks for it).
    const tokenizer::Tokenizer& tokenizer() const;
    // The model's chat template (its own, or a built-in one chosen by architecture), parsed on
    // first use: chat::TemplateError for one that does not parse.
    const chat::ResolvedTemplate& chat_template() const;
    // add_generation_prompt, and the model's BOS and EOS texts (from the tokenizer).
    const chat::RenderOptions& render_options() const;

    Resources& resources() { return *resources_; }
    memory::Device& host() { return resources_->host(); }
    const memory::Device& host() const { return resources_->host(); }
    Compute& compute() { return resources_->compute(); }
    ops::ThreadPool& threads() { return resources_->compute().pool; }

    // A KV cache for `context` (engine/context.h), charged to the budget; memory::BudgetError
    // when it has no room.
    kv::ModelCache make_cache(const ContextConfig& context, int max_position = 0) const;
    // rows x n_vocab floats of logits, charged to the budget.
    memory::PoolBuffer<float> make_logits(int rows) const;

    // "pools (peak): overhead 57.8 MiB, weights 235 MiB, ...; all 310 MiB of the 1.00 GiB budget,
    // plan 311 MiB" (and the offload device's pools).
    std::string peak_summary() const;

private:
    Engine() = default;
    // load() for one model: the plan's budget is the host's capacity less `reserved` (the draft
    // model's plan, reserved_for names it); draft_slots > 0: the draft model (planned by
    // draft_plan(), on the CPU only), 0: the model (its layers may go to the offload device).
    static std::unique_ptr<Engine> load_one(const LoadConfig& load, const ContextConfig& context,
                                            std::shared_ptr<Resources> resources, uint64_t reserved,
                                            const std::string& reserved_for, int draft_slots);

    LoadConfig load_;
    std::string budget_source_;  // the resources', with what a draft model takes of it
    ContextConfig context_;
    Plan plan_;
    std::shared_ptr<Resources> resources_;
    // Declared after the resources they charge: they go first.
    memory::Charge overhead_;
    memory::Charge weights_;
    memory::Charge lock_rounding_;  // load.mlock: whole pages beyond the weights' bytes
    uint64_t locked_bytes_ = 0;
    std::unique_ptr<gguf::GgufFile> file_;
    mutable std::once_flag tokenizer_once_;
    mutable std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
    mutable chat::RenderOptions render_options_;
    mutable std::once_flag template_once_;
    mutable std::unique_ptr<chat::ResolvedTemplate> template_;
    std::unique_ptr<model::Model> model_;
    std::unique_ptr<Engine> draft_;  // goes first
};

// The plan parameters of a load: the context's sizes and KV settings, load.stream_layers, the host
// budget, the threads the forward passes run on and the offload target. Throws ConfigError for
// what check() refuses.
PlanParams plan_params(const LoadConfig& load, const ContextConfig& context, uint64_t budget, int n_threads,
                       const OffloadTarget& offload);

// The plan of a load without loading (`fitllm plan`): as Engine::load plans it, with load.fit's
// changes, but nothing opened that a plan does not need. Throws ConfigError and what reading the
// file throws; a plan that does not fit is returned (Plan::fits() false).
// With draft_model_path: the draft model's plan too (draft_context(context), its CPU layers), and
// the model's plan for the budget it leaves (budget_source says so): plan.fits() says whether both
// fit. draft_slots: as Engine::load's.
struct PlanOnly {
    Plan plan;
    std::string budget_source;
    std::optional<Plan> draft;
    std::string draft_budget_source;  // the budget's source as given (the draft is planned for all of it)
};
PlanOnly plan_only(const LoadConfig& load, const ContextConfig& context, std::string budget_source = {},
                   const std::string& draft_model_path = {}, int draft_slots = 1);

// A draft model's plan: make_plan(shape, params) (params.n_seq 1, no --fit), its KV cache and
// logits times draft_slots (n_slots sessions of its own), and its overhead only its metadata and
// tokenizer: the runtime (kFixedOverhead) and the samplers are in the model's plan (the draft
// model proposes without a sampler). Throws std::invalid_argument as make_plan, and for
// draft_slots < 1.
Plan draft_plan(const ModelShape& shape, const PlanParams& params, int draft_slots);

// The LoadConfig of a draft model next to `load`: its file, no --fit, nothing streamed or
// offloaded, load.mlock as given.
LoadConfig draft_load_config(const LoadConfig& load, const std::string& draft_model_path);

}  // namespace fitllm::engine
