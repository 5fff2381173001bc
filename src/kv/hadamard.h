#pragma once
// The normalized fast Walsh-Hadamard transform: x <- H x / sqrt(n) for n a power of two, where H is
// Sylvester's Hadamard matrix (H[i][j] = (-1)^popcount(i & j)). Scaled so it is orthonormal and its
// own inverse: rotating q and k keeps q . k, and rotating V's rows means un-rotating the output.
//
// The KV cache rotates each head before quantizing it (docs/architecture.md, idea 4), so that a few large
// values (outliers) spread over the whole head instead of setting one block's scale.
#include <cstdint>

namespace fitllm::kv {

constexpr bool is_power_of_two(int64_t n) {
    return n > 0 && (n & (n - 1)) == 0;
}

// In place on n floats. Throws std::invalid_argument when n is not a power of two.
void hadamard_transform(float* x, int n);

// In place on n_rows consecutive rows of n floats each (a head per row).
void hadamard_transform_rows(float* x, int64_t n_rows, int n);

}  // namespace fitllm::kv
