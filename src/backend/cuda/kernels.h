#pragma once
// The CUDA kernels of a forward pass behind plain C++ declarations, so that code compiled by the
// host compiler (the CUDA device, tests) calls them without CUDA headers. Built only with
// FITLLM_CUDA (the preprocessor definition FITLLM_CUDA is then set).
//
// Every pointer named "device" is device memory (cudaMalloc); launches are asynchronous on
// `stream` (nullptr: the default stream) and return before the kernel ends; call synchronize()
// before reading results back. Every CUDA call is checked: a failure throws CudaError naming the
// call and CUDA's error string. Shapes are checked on the host before launching and throw
// std::invalid_argument naming the function and the value.
//
//   cuda::set_device(0);
//   void* w = cuda::device_malloc(bytes, "weights");      // or CudaError
//   cuda::copy_to_device(w, host_w, bytes, nullptr);
//   cuda::matmul(GgmlType::Q4_K, w, rows, cols, 0, x, n_tok, y, nullptr);
//   cuda::synchronize(nullptr);
#include <cstddef>
#include <cstdint>
#include <string>

#include "fitllm/error.h"
#include "quant/ggml_type.h"

namespace fitllm::backend::cuda {

// A CUDA runtime call failed (or no device is there): what() names the call and the error.
class CudaError : public Error {
public:
    using Error::Error;
};

using Stream = void*;  // a cudaStream_t

// ---- Runtime ----------------------------------------------------------------------------------

// The number of CUDA devices; throws CudaError "no CUDA device: cudaGetDeviceCount: <error>"
// when the call fails (no driver, no GPU) or finds none.
int device_count();
// "" when a CUDA device is usable; otherwise why not ("no CUDA device: ..."), for skipping tests.
std::string no_device_reason();
void set_device(int ordinal);  // cudaSetDevice, checked against device_count()
std::string device_name(int ordinal);
// Free and total bytes of the current device (cudaMemGetInfo).
void memory_info(uint64_t& free_bytes, uint64_t& total_bytes);

// cudaMalloc / cudaFree. Never managed memory. `what` names the buffer in the error.
void* device_malloc(size_t bytes, const char* what);
void device_free(void* p) noexcept;  // also frees host_malloc_mapped memory (cudaFreeHost)

// Unified mode (integrated GPUs): whether device `ordinal` is integrated (cudaDevAttrIntegrated),
// false when there is no such device; whether it can map host memory (cudaDevAttrCanMapHostMemory).
bool device_integrated(int ordinal);
bool can_map_host_memory(int ordinal);
// Pinned host memory mapped for the current device (cudaHostAlloc, cudaHostAllocMapped), at the
// same address on both sides (unified virtual addressing; CudaError if the device address
// differs). Freed by device_free.
void* host_malloc_mapped(size_t bytes, const char* what);
// Registers [host, host + bytes) (whole pages) for the current device to read (cudaHostRegister,
// mapped, and read-only where the device supports it: a read-only file mapping needs it) and
// returns the device address of host (cudaHostGetDevicePointer). host_unregister undoes it.
const void* host_register_mapped(const void* host, size_t bytes);
void host_unregister(const void* host) noexcept;
// Page-locked host memory (cudaHostAlloc / cudaFreeHost): copies from it run asynchronously.
void* host_malloc_pinned(size_t bytes, const char* what);
void host_free_pinned(void* p) noexcept;

Stream create_stream();
void destroy_stream(Stream s) noexcept;
void synchronize(Stream s);  // waits for the stream (nullptr: the whole device)

void copy_to_device(void* dst, const void* src, size_t bytes, Stream s);
void copy_to_host(void* dst, const void* src, size_t bytes, Stream s);
void copy_on_device(void* dst, const void* src, size_t bytes, Stream s);
void fill_zero(void* dst, size_t bytes, Stream s);

// ---- Matrix products ----------------------------------------------------------------------------

// Weight types matmul takes: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K.
bool matmul_supports(quant::GgmlType type);

// y[t * rows + r] = sum over c of w[r][c] * x[t * cols + c] for t < n_tok, r < rows.
// w: device, `rows` rows of `cols` values of `type`, row r at w + r * row_stride bytes
// (row_stride 0: packed). x, y: device floats. The weights are dequantized on the fly and
// multiplied with float activations in float: up to 8 tokens one warp per weight row reads each
// block once for all of them; more tokens go through shared-memory tiles of 64 rows x 64 tokens.
void matmul(quant::GgmlType type, const void* w, int64_t rows, int64_t cols, size_t row_stride, const float* x,
            int64_t n_tok, float* y, Stream s);

// ---- Element-wise and per-row ops (all device pointers; y may alias x) --------------------------

// y = x / sqrt(mean(x^2) + eps) * weight per row of n (weight may be nullptr); the sum of squares
// in double, as ops::rms_norm.
void rms_norm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t n, float* y, Stream s);

struct RopeArgs {
    bool neox = false;  // pairs (i, i + n_dims / 2) instead of (2i, 2i + 1)
    int n_dims = 0;     // rotated dimensions per head, even, <= head_dim
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;
    const float* freq_factors = nullptr;  // device, n_dims / 2 values, or nullptr
    // YaRN, as ops::RopeParams: 0 / 1 for none.
    float ext_factor = 0.0f;
    float attn_factor = 1.0f;
    float corr_low = 0.0f, corr_high = 0.0f;
};
// In place on x [n_tok, n_head, head_dim] at positions pos (device, n_tok values), angles built
// as ops::rope builds them (a float running product of freq_base^(-2 / n_dims)).
void rope(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim, const RopeArgs& args, Stream s);

void add(const float* a, const float* b, int64_t n, float* y, Stream s);
void add_bias(float* x, const float* bias, int64_t n_tok, int64_t n, Stream s);  // x[t] += bias
void scale(float* x, int64_t n, float factor, Stream s);
// y = silu(gate) * up (silu with expf); y = gelu(gate) * up with ops::gelu's f16-rounded tanh GELU.
void swiglu(const float* gate, const float* up, int64_t n, float* y, Stream s);
void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y, Stream s);
void geglu(const float* gate, const float* up, int64_t n, float* y, Stream s);
void softcap(float* x, int64_t n, float cap, Stream s);  // x = cap * tanh(x / cap)

// ---- KV cache on the device ---------------------------------------------------------------------

// Where a layer's K or V lives on the device: the host cache's layout (kv::KvCache::LayerView):
// cell c's row at data + c * row_bytes, head h at + h * head_bytes, heads of head_dim values of
// `type`, Hadamard-rotated when `rotated`, shaped when `center` is set.
struct KvLayout {
    quant::GgmlType type = quant::GgmlType::F16;
    void* data = nullptr;  // device
    size_t row_bytes = 0, head_bytes = 0;
    int n_head_kv = 0, head_dim = 0;
    bool rotated = false;
    // K shaped as the host cache shapes it (kv/key_transform.h; LayerView's k_center, k_scale,
    // q_scale copied to the device, [n_head_kv * head_dim] each): stored as (x - center) * scale
    // before the rotation, read back (kv_load) as x * inv_scale + center. nullptr: stored as is.
    const float* center = nullptr;
    const float* scale = nullptr;
    const float* inv_scale = nullptr;
};

// Types kv_store writes and attention_kv and kv_load read: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1, IQ4_NL (every -ctk / -ctv type), each rounded as quant::quantize_row rounds it.
bool kv_store_supports(quant::GgmlType type);
bool kv_read_supports(quant::GgmlType type);

// Writes n_rows rows ([n_rows, n_head_kv * head_dim] floats, device) into cells[i] (device):
// shaped, rotated, then converted per head, as kv::KvCache::store. Throws std::invalid_argument for
// a type kv_store_supports() rejects.
void kv_store(const KvLayout& layout, const float* rows, const int32_t* cells, int64_t n_rows, Stream s);
// The inverse: rows [n_rows, n_head_kv * head_dim] (device floats) <- cells[i] (device), decoded,
// un-rotated and un-shaped as kv::KvCache::read_k reads them (for re-rotating K on a shift).
void kv_load(const KvLayout& layout, const int32_t* cells, int64_t n_rows, float* rows, Stream s);

// The host cache's bookkeeping for one layer's attention, copied to the device: visibility as
// ops::attention_kv decides it.
struct KvAttentionArgs {
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    float scale = 0.0f, softcap = 0.0f;
    int sliding_window = 0;
    const int32_t* q_pos = nullptr;       // device [n_tok]
    const int32_t* q_seq = nullptr;       // device [n_tok]
    const int32_t* cell_pos = nullptr;    // device [capacity]: -1 for a free cell
    const uint64_t* cell_seqs = nullptr;  // device [capacity]: bit s = used by sequence s
    int capacity = 0;                     // cells
    const int32_t* blocks = nullptr;      // device: every sequence's block table, one after another
    const int32_t* seq_blocks = nullptr;  // device [n_seq + 1]: sequence s's blocks are
                                          // blocks[seq_blocks[s] .. seq_blocks[s + 1])
    int block_size = 0;
    // K stored centred and scaled (kv/key_transform.h, the host cache's quantized K): q is
    // multiplied by q_scale (device, [n_head_kv * head_dim]) before the rotation, and with
    // soft-capping scale * (q . k_center) goes back into each score before the cap. nullptr: none.
    const float* q_scale = nullptr;
    const float* k_center = nullptr;
};
// out[t][h] = sum over visible cells c of softmax(scale * q[t][h] . K[c][g]) V[c][g], g the kv
// head of h; a cell is visible to token t when it is in a block of q_seq[t]'s table, its sequence
// set has q_seq[t], and cell_pos <= q_pos[t] (and > q_pos[t] - sliding_window when that is > 0).
// Online softmax in float; a query that sees no cell gets zeros. q, out: device
// [n_tok, n_head, head_dim]. Throws std::invalid_argument for inconsistent shapes or types.
void attention_kv(const float* q, int64_t n_tok, const KvLayout& k, const KvLayout& v, const KvAttentionArgs& args,
                  float* out, Stream s);

// ---- For tests without a GPU ----------------------------------------------------------------------

// The kernels' own block decoding (common.cuh), run on the host: elements [0, n) of a row of `type`
// as matmul (matmul_supports' types, n a multiple of 8) or attention (kv_read_supports' others)
// reads them. Throws std::invalid_argument for other types.
void decode_row_on_host(quant::GgmlType type, const void* row, int64_t n, float* out);
// kv_store's block encoders, run on the host: n values (a multiple of 32) of a quantized
// kv_store_supports() type into `out` as the kernel writes them. Throws std::invalid_argument for
// other types.
void encode_row_on_host(quant::GgmlType type, const float* x, int64_t n, void* out);

}  // namespace fitllm::backend::cuda
