// The registry of architectures: one line each (model/architecture.h).
#include "model/architecture.h"

namespace fitllm::model {

// One per file of model/.
extern const Architecture kGemma2, kGemma3, kLlama, kPhi3, kQwen2, kQwen3;
extern const Architecture kGranite, kMistral3, kOlmo2, kSmolLm3;  // model/llama.cpp's variants
extern const Architecture kGptOss, kQwen2Moe, kQwen3Moe;          // model/llama.cpp, with model/moe.h's experts

namespace {

constexpr const Architecture* kArchitectures[] = {&kGemma2,   &kGemma3,   &kGptOss, &kGranite, &kLlama,
                                                  &kMistral3, &kOlmo2,    &kPhi3,   &kQwen2,   &kQwen2Moe,
                                                  &kQwen3,    &kQwen3Moe, &kSmolLm3};

}  // namespace

const Architecture* find_architecture(std::string_view name) {
    for (const Architecture* a : kArchitectures) {
        if (a->name == name) return a;
    }
    return nullptr;
}

std::string architecture_names() {
    std::string names;
    for (const Architecture* a : kArchitectures) names += (names.empty() ? "" : ", ") + std::string(a->name);
    return names;
}

}  // namespace fitllm::model
