// The CUDA runtime calls of kernels.h: devices, memory, streams, copies. All checked.
#include <string>

#include "backend/cuda/common.cuh"

namespace fitllm::backend::cuda {

int device_count() {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        throw CudaError(std::string("no CUDA device: cudaGetDeviceCount: ") + cudaGetErrorName(err) + " (" +
                        cudaGetErrorString(err) + ")");
    }
    if (n <= 0) throw CudaError("no CUDA device: cudaGetDeviceCount found 0 devices");
    return n;
}

std::string no_device_reason() {
    try {
        device_count();
        return {};
    } catch (const CudaError& e) {
        return e.what();
    }
}

void set_device(int ordinal) {
    const int n = device_count();
    if (ordinal < 0 || ordinal >= n) {
        throw CudaError("no CUDA device " + std::to_string(ordinal) + ": there are " + std::to_string(n) +
                        " (cuda0 .. cuda" + std::to_string(n - 1) + ")");
    }
    FITLLM_CUDA_CHECK(cudaSetDevice(ordinal));
}

std::string device_name(int ordinal) {
    cudaDeviceProp prop{};
    FITLLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    return prop.name;
}

void memory_info(uint64_t& free_bytes, uint64_t& total_bytes) {
    size_t f = 0, t = 0;
    FITLLM_CUDA_CHECK(cudaMemGetInfo(&f, &t));
    free_bytes = f;
    total_bytes = t;
}

void* device_malloc(size_t bytes, const char* what) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();  // cudaMalloc's error is not sticky; clear it for the next check
        throw CudaError(std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes for " + what + ": " +
                        cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
    return p;
}

void device_free(void* p) noexcept {
    if (p == nullptr) return;
    // Errors here are from earlier async work; the next check reports them.
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.type == cudaMemoryTypeHost) {
        cudaFreeHost(p);
    } else {
        cudaGetLastError();
        cudaFree(p);
    }
}

namespace {

int attribute(cudaDeviceAttr attr, int ordinal) {
    int value = 0;
    FITLLM_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, ordinal));
    return value;
}

}  // namespace

bool device_integrated(int ordinal) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || ordinal < 0 || ordinal >= n) {
        cudaGetLastError();
        return false;
    }
    return attribute(cudaDevAttrIntegrated, ordinal) != 0;
}

bool can_map_host_memory(int ordinal) {
    return attribute(cudaDevAttrCanMapHostMemory, ordinal) != 0;
}

namespace {

// cudaHostAlloc with flags; a failure (cleared) is a CudaError naming the call, bytes and use.
void* host_alloc(size_t bytes, unsigned flags, const char* call, const char* what) {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, flags);
    if (err != cudaSuccess) {
        cudaGetLastError();
        throw CudaError(std::string(call) + " of " + std::to_string(bytes) + " bytes for " + what + ": " +
                        cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
    return p;
}

}  // namespace

void* host_malloc_mapped(size_t bytes, const char* what) {
    if (bytes == 0) return nullptr;
    void* p = host_alloc(bytes, cudaHostAllocMapped, "cudaHostAlloc (mapped)", what);
    void* on_device = nullptr;
    FITLLM_CUDA_CHECK(cudaHostGetDevicePointer(&on_device, p, 0));
    if (on_device != p) {
        cudaFreeHost(p);
        throw CudaError(std::string("mapped host memory for ") + what +
                        " has another address on the device (no unified virtual addressing)");
    }
    return p;
}

const void* host_register_mapped(const void* host, size_t bytes) {
    int ordinal = 0;
    FITLLM_CUDA_CHECK(cudaGetDevice(&ordinal));
    unsigned flags = cudaHostRegisterMapped;
    if (attribute(cudaDevAttrHostRegisterReadOnlySupported, ordinal) != 0) flags |= cudaHostRegisterReadOnly;
    void* p = const_cast<void*>(host);  // registered read-only where supported; never written
    FITLLM_CUDA_CHECK(cudaHostRegister(p, bytes, flags));
    void* on_device = nullptr;
    const cudaError_t err = cudaHostGetDevicePointer(&on_device, p, 0);
    if (err != cudaSuccess) {
        cudaHostUnregister(p);
        check(err, "cudaHostGetDevicePointer");
    }
    return on_device;
}

void host_unregister(const void* host) noexcept {
    if (host != nullptr) cudaHostUnregister(const_cast<void*>(host));
}

void* host_malloc_pinned(size_t bytes, const char* what) {
    if (bytes == 0) return nullptr;
    return host_alloc(bytes, cudaHostAllocDefault, "cudaHostAlloc", what);
}

void host_free_pinned(void* p) noexcept {
    if (p != nullptr) cudaFreeHost(p);
}

Stream create_stream() {
    cudaStream_t s = nullptr;
    FITLLM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
}

void destroy_stream(Stream s) noexcept {
    if (s != nullptr) cudaStreamDestroy(as_stream(s));
}

void synchronize(Stream s) {
    if (s == nullptr) {
        FITLLM_CUDA_CHECK(cudaDeviceSynchronize());
    } else {
        FITLLM_CUDA_CHECK(cudaStreamSynchronize(as_stream(s)));
    }
}

// cudaMemcpyDefault: the pointers say where they are (unified virtual addressing), so a unified
// device's buffers, mapped host memory, work on either side of a copy.
void copy_to_device(void* dst, const void* src, size_t bytes, Stream s) {
    if (bytes == 0) return;
    FITLLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(s)));
}

void copy_to_host(void* dst, const void* src, size_t bytes, Stream s) {
    if (bytes == 0) return;
    FITLLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(s)));
}

void copy_on_device(void* dst, const void* src, size_t bytes, Stream s) {
    if (bytes == 0) return;
    FITLLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(s)));
}

void fill_zero(void* dst, size_t bytes, Stream s) {
    if (bytes == 0) return;
    FITLLM_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, as_stream(s)));
}

}  // namespace fitllm::backend::cuda
