#include "kv/hadamard.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace fitllm::kv {
namespace {

// One butterfly stage: pairs (j, j + half) inside each group of 2 * half values. The inner loop
// runs over contiguous floats, so the compiler vectorizes it once half reaches the vector width.
void butterfly_stage(float* x, int n, int half) {
    for (int group = 0; group < n; group += 2 * half) {
        float* lo = x + group;
        float* hi = lo + half;
        for (int j = 0; j < half; ++j) {
            const float a = lo[j];
            const float b = hi[j];
            lo[j] = a + b;
            hi[j] = a - b;
        }
    }
}

void check_size(int n) {
    if (!is_power_of_two(n)) {
        throw std::invalid_argument("hadamard_transform: size " + std::to_string(n) + " is not a power of two");
    }
}

void transform(float* x, int n) {
    for (int half = 1; half < n; half *= 2) butterfly_stage(x, n, half);
    const float scale = 1.0f / std::sqrt(static_cast<float>(n));
    for (int i = 0; i < n; ++i) x[i] *= scale;
}

}  // namespace

void hadamard_transform(float* x, int n) {
    check_size(n);
    transform(x, n);
}

void hadamard_transform_rows(float* x, int64_t n_rows, int n) {
    check_size(n);
    for (int64_t r = 0; r < n_rows; ++r) transform(x + r * n, n);
}

}  // namespace fitllm::kv
