#pragma once

namespace fitllm {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace fitllm
