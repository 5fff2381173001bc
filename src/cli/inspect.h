#pragma once
// What `fitllm inspect` reports, as JSON; the text output is rendered from the same object
// so the two never disagree.
#include <nlohmann/json.hpp>

#include "gguf/gguf_reader.h"

namespace fitllm::cli {

struct InspectOptions {
    bool tensors = false;   // list every tensor
    bool metadata = false;  // list every metadata key
};

nlohmann::ordered_json inspect_report(const gguf::GgufFile& file, const InspectOptions& options);
std::string render_inspect_text(const nlohmann::ordered_json& report);

}  // namespace fitllm::cli
