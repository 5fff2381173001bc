#pragma once
// The plan (engine/plan.h) in words and numbers: the table `fitllm plan` prints, its JSON, and the
// one-line answers a refusal gives.
#include <nlohmann/json.hpp>
#include <string>

#include "engine/plan.h"

namespace fitllm::engine {

// The plan as `fitllm plan` prints it: each device's rows (weights, KV cache, scratch, outputs,
// overhead), the total, the budget (budget_source: where it comes from) and whether it fits, then
// what --fit changed and why.
std::string plan_text(const Plan& plan, const std::string& budget_source);

// The same as JSON (`fitllm plan --json`, /v1/memory, the Python bindings' Engine.plan()).
nlohmann::ordered_json plan_json(const Plan& plan, const std::string& budget_source);

// "-c 4096 -ctk q8_0 -ctv q8_0, 2 of 18 layers streamed" (and ", -ngl N on DEVICE").
std::string settings_text(const Plan& plan);

// Why a plan does not fit: the memory::BudgetError message of the first of its rows that a device
// of the budget's size refuses, in the order a run charges them (load: overhead, weights, stream
// buffers; the context: KV, logits; the first forward pass: scratch), then the offload device's.
std::string first_refusal(const Plan& plan);

}  // namespace fitllm::engine
