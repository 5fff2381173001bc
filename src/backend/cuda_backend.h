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

// CUDA device `ordinal` in unified mode (Backend::unified()): its pools are host's (which must
// outlive it), its buffers are mapped pinned host memory (cudaHostAlloc, cudaHostAllocMapped) and
// map_host() registers host memory for its kernels to read in place. For integrated GPUs, whose
// memory is the host's. Throws std::runtime_error as make_cuda_backend, or when the device cannot
// map host memory (cudaDevAttrCanMapHostMemory).
std::unique_ptr<Backend> make_cuda_unified_backend(int ordinal, memory::Device& host);

// CUDA devices the runtime sees (0 when the driver is missing).
int cuda_device_count();

// Whether CUDA device `ordinal` is integrated (cudaDevAttrIntegrated: it shares the host's
// memory); false when there is no such device.
bool cuda_device_integrated(int ordinal);

}  // namespace fitllm::backend
