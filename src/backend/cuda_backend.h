#pragma once
// What the CUDA part of the backend (src/backend/cuda/, built with -DFITLLM_CUDA=ON) provides to
// open_device(). Without CUDA, cuda_stub.cpp provides the same functions: make_cuda_backend throws
// and cuda_device_count returns 0.
#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace fitllm::backend {

// CUDA device `ordinal` as a Backend named "cuda<ordinal>" whose memory() has `capacity` bytes
// (capped at the device's free memory; a smaller capacity than asked is said in name() or an
// error, the CUDA part decides). Throws std::runtime_error naming the ordinal when there is no
// such device or the driver fails.
std::unique_ptr<Backend> make_cuda_backend(int ordinal, uint64_t capacity);

// CUDA devices the runtime sees (0 when the driver is missing).
int cuda_device_count();

}  // namespace fitllm::backend
