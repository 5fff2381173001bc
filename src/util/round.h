#pragma once
// Rounding up to a multiple, for sizes and counts.
#include <concepts>

namespace fitllm::util {

// n rounded up to a multiple of `multiple` (> 0); n + multiple - 1 must not overflow.
template <std::integral T>
constexpr T round_up(T n, T multiple) {
    return (n + multiple - 1) / multiple * multiple;
}

}  // namespace fitllm::util
