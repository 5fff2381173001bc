// The public configs' helpers (fitllm/config.h).
#include "fitllm/config.h"

#include <array>
#include <string>

#include "fitllm/error.h"
#include "memory/budget.h"

namespace fitllm {
namespace {

constexpr std::array<std::pair<KvType, std::string_view>, 9> kKvTypeNames = {{
    {KvType::f32, "f32"},
    {KvType::f16, "f16"},
    {KvType::bf16, "bf16"},
    {KvType::q8_0, "q8_0"},
    {KvType::q4_0, "q4_0"},
    {KvType::q4_1, "q4_1"},
    {KvType::q5_0, "q5_0"},
    {KvType::q5_1, "q5_1"},
    {KvType::iq4_nl, "iq4_nl"},
}};

}  // namespace

std::string_view kv_type_name(KvType type) {
    for (const auto& [t, name] : kKvTypeNames) {
        if (t == type) return name;
    }
    return "?";
}

KvType parse_kv_type(std::string_view name) {
    std::string names;
    for (const auto& [t, n] : kKvTypeNames) {
        if (n == name) return t;
        names += (names.empty() ? "" : ", ") + std::string(n);
    }
    throw ConfigError("unknown KV cache type '" + std::string(name) + "' (accepted: " + names + ")");
}

uint64_t parse_size(std::string_view text) {
    return memory::parse_size(text);
}

}  // namespace fitllm
