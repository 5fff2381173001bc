// fitllm plan -m MODEL [-c N] [-np N] [-b N] [-ctk T] [-ctv T] [--mem SIZE] [--device NAME -ngl N --vram SIZE]
//             [--unified] [--fit] [--json]
// The memory plan of a run (engine/plan.h), from the GGUF header alone.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "engine/engine.h"
#include "engine/plan_report.h"

namespace fitllm::cli {

ArgParser plan_parser(PlanOptions& o) {
    ContextConfig& c = o.engine.context;
    ArgParser p(
        "fitllm plan -m MODEL [-c N] [-np N] [-b N] [-t N] [-ctk T] [-ctv T] [--no-kv-rotation] [--context-shift] "
        "[--kv-spill-dir DIR --kv-resident SIZE] [--mem SIZE] [--stream-layers N] [--device NAME] [-ngl N] "
        "[--vram SIZE] [--no-kv-offload] [--unified] [--fit] [--cache-prompts N] [--cache-ram SIZE] "
        "[-md FILE [--draft-max N]] [--json]",
        "Show where every byte of a run would go, from the GGUF header alone: weights (resident\n"
        "or streamed), KV cache, scratch, outputs and overhead per device, the total, and whether\n"
        "it fits the memory budget. --fit changes the settings until it does: it quantizes the KV\n"
        "cache first, then streams weights, and shortens the context only as the last resort.\n"
        "The same options plan `fitllm run` the same way. Exit status 3 when the plan does not fit.");
    p.option("-m, --model", "FILE", "the GGUF model", &o.engine.load.model_path);
    p.option("-c, --ctx-size", "N", "context size in tokens, all sequences together (default 2048; 0: the model's)",
             &c.n_ctx);
    p.option("-np, --parallel", "N", "sequences sharing the cache (default 1)", &c.n_seq);
    p.option("-b, --batch-size", "N", "tokens per forward pass (default 512)", &c.n_batch);
    add_threads_option(p, c);
    add_kv_options(p, c);
    add_prompt_cache_options(p, c);
    p.option("--context-shift", "", "keep room for a context shift (run's --context-shift)",
             [&c](const std::string&) { c.context_shift = true; });
    add_budget_options(p, o.engine);
    p.option("-md, --model-draft", "FILE",
             "plan a draft model for speculative decoding too (run's -md): its weights, KV cache and scratch, "
             "and the model's plan for what the budget leaves; with -np N, as serve -md runs it: a draft KV "
             "cache and row of logits for each of the N slots",
             &o.engine.draft_model_path);
    p.option("--draft-max", "N", "with -md: tokens drafted per forward pass at most, as run's (default 8)",
             &o.draft_max);
    p.flag("--json", &o.as_json, "print the plan as JSON");
    return p;
}

void validate(const PlanOptions& o) {
    if (o.engine.load.model_path.empty()) throw UsageError("-m MODEL is required");
    if (o.engine.context.n_ctx < 0) throw UsageError("-c: " + std::to_string(o.engine.context.n_ctx) + " is negative");
    if (o.draft_max < 1 || o.draft_max > 256) {
        throw UsageError("--draft-max: " + std::to_string(o.draft_max) + " must be in 1..256");
    }
}

namespace {

int show_plan(const PlanOptions& o) {
    engine::PlanOnly planned;
    ContextConfig context = o.engine.context;
    // A draft's tokens and the one before them are checked in one pass: as many rows of logits,
    // for each slot with -np (serve's, within the batch).
    if (!o.engine.draft_model_path.empty()) {
        const int rows = context.n_seq > 1
                             ? std::min(context.n_seq * (o.draft_max + 1), std::max(context.n_batch, context.n_seq))
                             : o.draft_max + 1;
        context.n_outputs = std::max(context.n_outputs, rows);
    }
    try {
        planned = engine::plan_only(o.engine.load, context, o.engine.mem_label, o.engine.draft_model_path,
                                    std::max(1, context.n_seq));
    } catch (const ConfigError& e) {
        throw UsageError(e.what());
    }
    if (o.as_json) {
        nlohmann::ordered_json j = engine::plan_json(planned.plan, planned.budget_source);
        if (planned.draft) j["draft"] = engine::plan_json(*planned.draft, planned.draft_budget_source);
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::fputs(engine::plan_text(planned.plan, planned.budget_source).c_str(), stdout);
        if (planned.draft) {
            std::printf("\ndraft model (-md):\n%s",
                        engine::plan_text(*planned.draft, planned.draft_budget_source).c_str());
        }
    }
    return planned.plan.fits() ? 0 : kExitDoesNotFit;
}

}  // namespace

int run_plan(const std::vector<std::string>& args) {
    return parse_and_run(args, plan_parser, show_plan);
}

}  // namespace fitllm::cli
