#pragma once
// unroll<N>(f) calls f(std::integral_constant<int, I>{}) for I = 0 .. N-1: loops whose index must
// be a compile-time constant (register arrays, lane shuffles) in the SIMD kernels.
#include <type_traits>
#include <utility>

namespace fitllm::quant::detail {

template <typename F, int... I>
void unrolled(F&& f, std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
void unroll(F&& f) {
    unrolled(f, std::make_integer_sequence<int, N>{});
}

}  // namespace fitllm::quant::detail
