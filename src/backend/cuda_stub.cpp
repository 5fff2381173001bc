// open_device("cuda...") in a build without CUDA: a clear error instead of a link failure.
#include <stdexcept>
#include <string>

#include "backend/cuda_backend.h"

namespace fitllm::backend {

std::unique_ptr<Backend> make_cuda_backend(int ordinal, uint64_t /*capacity*/) {
    throw std::runtime_error("device cuda" + std::to_string(ordinal) +
                             ": fitllm was built without CUDA (-DFITLLM_CUDA=ON)");
}

std::unique_ptr<Backend> make_cuda_unified_backend(int ordinal, memory::Device& /*host*/) {
    return make_cuda_backend(ordinal, 0);
}

int cuda_device_count() {
    return 0;
}

bool cuda_device_integrated(int /*ordinal*/) {
    return false;
}

}  // namespace fitllm::backend
