#pragma once
// The architectures fitllm runs, by their GGUF name (general.architecture). Each is one file in
// model/ (its hyper-parameters, weights and forward pass) and one line in architectures.cpp;
// a model of any other architecture is refused by name, in one place (read_hparams).
//
//   const Architecture* a = find_architecture("qwen2");   // nullptr: not supported
//   std::unique_ptr<Model> m = a->load(file, read_hparams(file), options);
#include <memory>
#include <string>
#include <string_view>

#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "model/model.h"

namespace fitllm::model {

struct Architecture {
    std::string_view name;
    // The architecture's own keys and checks, after read_hparams has read those every
    // architecture has (counts, sizes, norm epsilon, RoPE base). Throws ModelError naming the key.
    void (*read_hparams)(const HparamReader& reader, Hparams& hp);
    // Binds the weights (ModelError naming the first missing or misshapen tensor) and makes the
    // forward pass.
    std::unique_ptr<Model> (*load)(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options);
};

// The architecture of that name, or nullptr.
const Architecture* find_architecture(std::string_view name);
// "gemma3, llama, qwen2": for messages.
std::string architecture_names();

}  // namespace fitllm::model
