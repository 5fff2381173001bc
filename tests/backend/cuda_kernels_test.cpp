// The CUDA kernels (src/backend/cuda/kernels.h) against the CPU reference (src/ops, src/quant) on
// random data. Without a CUDA device the kernel tests skip saying why; the checks made on the host
// before any launch (types, shapes) and the no-device error run everywhere.
#include <gtest/gtest.h>

#include <string>

#ifndef FITLLM_CUDA

TEST(CudaKernels, BuiltWithoutCuda) {
    GTEST_SKIP() << "built without CUDA (configure with -DFITLLM_CUDA=ON where nvcc is installed)";
}

#else

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "backend/cuda/kernels.h"
#include "kv/cache.h"
#include "kv/hadamard.h"
#include "ops/activation.h"
#include "ops/attention_kv.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"
#include "quant/dequantize.h"
#include "quant/quantize.h"

namespace fitllm::backend::cuda {
namespace {

using quant::GgmlType;

#define SKIP_WITHOUT_DEVICE()                       \
    do {                                            \
        const std::string why = no_device_reason(); \
        if (!why.empty()) GTEST_SKIP() << why;      \
        set_device(0);                              \
    } while (0)

std::vector<float> gaussian(uint32_t seed, size_t n, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, sigma);
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    return x;
}

// Device memory for a test, freed at scope end.
class DeviceBuffer {
public:
    explicit DeviceBuffer(size_t bytes) : p_(device_malloc(bytes, "test buffer")), bytes_(bytes) {
        fill_zero(p_, bytes, nullptr);
    }
    template <class T>
    explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
        copy_to_device(p_, host.data(), bytes_, nullptr);
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() { device_free(p_); }
    template <class T = void>
    T* get() const {
        return static_cast<T*>(p_);
    }
    template <class T>
    std::vector<T> read() const {
        std::vector<T> out(bytes_ / sizeof(T));
        copy_to_host(out.data(), p_, bytes_, nullptr);
        synchronize(nullptr);
        return out;
    }

private:
    void* p_;
    size_t bytes_;
};

// ---- Without a device ---------------------------------------------------------------------------

TEST(CudaKernels, NoDeviceErrorSaysWhy) {
    const std::string why = no_device_reason();
    if (why.empty()) GTEST_SKIP() << "a CUDA device is present";
    EXPECT_EQ(why.rfind("no CUDA device: ", 0), 0u) << why;
    EXPECT_THROW(device_count(), CudaError);
}

TEST(CudaKernels, HostChecksBeforeLaunching) {
    float* x = nullptr;
    EXPECT_THROW(matmul(GgmlType::IQ2_XXS, nullptr, 4, 256, 0, x, 1, x, nullptr), std::invalid_argument);
    EXPECT_THROW(matmul(GgmlType::Q4_K, nullptr, 4, 100, 0, x, 1, x, nullptr), std::invalid_argument);
    EXPECT_THROW(matmul(GgmlType::Q4_0, nullptr, 4, 64, 10, x, 1, x, nullptr), std::invalid_argument);
    EXPECT_THROW(rope(x, nullptr, 1, 1, 64, RopeArgs{.n_dims = 65}, nullptr), std::invalid_argument);
    EXPECT_THROW(rms_norm(x, nullptr, 1e-6f, 1, 0, x, nullptr), std::invalid_argument);
    const KvLayout q4k{.type = GgmlType::Q4_K, .row_bytes = 1000, .head_bytes = 144, .n_head_kv = 1, .head_dim = 256};
    EXPECT_THROW(kv_store(q4k, x, nullptr, 1, nullptr), std::invalid_argument);
    const KvLayout q4_0{.type = GgmlType::Q4_0, .row_bytes = 36, .head_bytes = 30, .n_head_kv = 1, .head_dim = 64};
    EXPECT_THROW(kv_store(q4_0, x, nullptr, 1, nullptr), std::invalid_argument);  // a head is 36 bytes
    KvLayout half_shaped{.type = GgmlType::Q4_0, .row_bytes = 36, .head_bytes = 36, .n_head_kv = 1, .head_dim = 64};
    const float dummy = 0.0f;
    half_shaped.center = &dummy;  // a centre without scales
    EXPECT_THROW(kv_store(half_shaped, x, nullptr, 1, nullptr), std::invalid_argument);
    EXPECT_THROW(kv_load(q4k, nullptr, 1, x, nullptr), std::invalid_argument);
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                       GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL}) {
        EXPECT_TRUE(kv_store_supports(t) && kv_read_supports(t) && kv::is_kv_type(t)) << quant::traits(t).name;
    }
    const KvLayout f16{.type = GgmlType::F16, .row_bytes = 128, .head_bytes = 128, .n_head_kv = 1, .head_dim = 64};
    KvAttentionArgs args{.n_head = 3, .n_head_kv = 2, .head_dim = 64, .block_size = 16};
    args.capacity = 16;
    EXPECT_THROW(attention_kv(x, 1, f16, f16, args, x, nullptr), std::invalid_argument);
    EXPECT_TRUE(matmul_supports(GgmlType::Q4_K) && matmul_supports(GgmlType::Q6_K) && matmul_supports(GgmlType::F16));
    EXPECT_FALSE(matmul_supports(GgmlType::IQ4_XS));
}

// The kernels' block decoding, run on the host (no device needed): the values quant::dequantize_row
// gives, bit for bit (the same products in the same order; on the device a multiply-add the compiler
// fuses may differ in the last bit, which the kernel tests tolerate).
TEST(CudaKernels, DecodersMatchTheReferenceOnTheHost) {
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                          GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                          GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL}) {
        SCOPED_TRACE(std::string(quant::traits(type).name));
        const int64_t n = 1024;
        const std::vector<float> src = gaussian(21, n, 2.0f);
        std::vector<uint8_t> row(*quant::row_bytes(type, n));
        if (type == GgmlType::F32) {
            std::memcpy(row.data(), src.data(), row.size());
        } else {
            quant::quantize_row(type, src.data(), row.data(), n);
        }
        std::vector<float> want(n), got(n, -1.0f);
        quant::dequantize_row(type, row.data(), want.data(), n);
        decode_row_on_host(type, row.data(), n, got.data());
        int bad = 0;
        for (int64_t i = 0; i < n; ++i) {
            if (got[i] != want[i] && ++bad <= 5)
                ADD_FAILURE() << "element " << i << ": " << got[i] << " vs " << want[i];
        }
        EXPECT_EQ(bad, 0);
    }
    EXPECT_THROW(decode_row_on_host(GgmlType::IQ2_XXS, nullptr, 0, nullptr), std::invalid_argument);
}

// kv_store's block encoders, run on the host: the bytes quant::quantize_row writes (what the CPU's
// KV cache stores), bit for bit, for every quantized -ctk / -ctv type, on random blocks and on blocks
// that test the edges (zeros, a constant, one outlier, ties of the rounding, values near 1e-15).
TEST(CudaKernels, EncodersMatchTheReferenceOnTheHost) {
    std::vector<float> src = gaussian(41, 32 * 64, 3.0f);
    const std::vector<std::vector<float> > special = {
        std::vector<float>(32, 0.0f),   std::vector<float>(32, 1.25f),  std::vector<float>(32, -7.0f),
        std::vector<float>(32, 1e-16f), std::vector<float>(32, 2e-15f),
    };
    for (const std::vector<float>& block : special) src.insert(src.end(), block.begin(), block.end());
    std::vector<float> outlier = gaussian(42, 32, 0.01f);
    outlier[7] = 40.0f;
    src.insert(src.end(), outlier.begin(), outlier.end());
    std::vector<float> ties(32);
    for (int l = 0; l < 32; ++l) ties[l] = static_cast<float>(l - 16) * 0.5f;  // halves: ties to even
    src.insert(src.end(), ties.begin(), ties.end());
    const auto n = static_cast<int64_t>(src.size());
    for (GgmlType type :
         {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL}) {
        SCOPED_TRACE(std::string(quant::traits(type).name));
        const size_t bytes = *quant::row_bytes(type, static_cast<uint64_t>(n));
        std::vector<uint8_t> want(bytes), got(bytes, 0xA5);
        quant::quantize_row(type, src.data(), want.data(), n);
        encode_row_on_host(type, src.data(), n, got.data());
        const size_t block = bytes / static_cast<size_t>(n / 32);
        int bad = 0;
        for (size_t b = 0; b < bytes / block; ++b) {
            if (std::memcmp(got.data() + b * block, want.data() + b * block, block) != 0 && ++bad <= 5) {
                ADD_FAILURE() << "block " << b << " differs from quant::quantize_row's";
            }
        }
        EXPECT_EQ(bad, 0);
    }
    std::vector<uint8_t> out(64);
    EXPECT_THROW(encode_row_on_host(GgmlType::F16, src.data(), 32, out.data()), std::invalid_argument);
    EXPECT_THROW(encode_row_on_host(GgmlType::Q4_0, src.data(), 40, out.data()), std::invalid_argument);
}

// What kv_store's kernel does to a K row (KvLayout: (x - center) * scale, each head rotated, then the
// block encoders) is what kv::KvCache::store does to it: the host cache's bytes, for every quantized
// type, from the parameters the host calibrated. Runs without a GPU (the rotation is the host's, which
// the kernel's butterflies match: KvStoreAndAttention); catches a change of the host's K shaping that
// the device would not follow.
TEST(CudaKernels, ShapedKeysAreStoredAsTheHostCacheStoresThem) {
    const int n_head_kv = 2, head_dim = 64, width = n_head_kv * head_dim, n = 24;
    for (GgmlType type :
         {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL}) {
        SCOPED_TRACE(std::string(quant::traits(type).name));
        kv::CacheParams params;
        params.n_cells = 32;
        params.type_k = params.type_v = type;
        kv::KvCache cache({kv::LayerShape{n_head_kv, head_dim, head_dim}}, params);
        std::vector<kv::SeqId> seq(n, 0);
        std::vector<kv::Pos> pos(n);
        for (int i = 0; i < n; ++i) pos[i] = i;
        std::vector<int32_t> cells(n);
        cache.place(seq, pos, cells);
        std::vector<float> k = gaussian(51, static_cast<size_t>(n) * width, 2.0f);
        for (size_t i = 0; i < k.size(); ++i) k[i] += static_cast<float>(i % width) * 0.05f;  // a common part
        const std::vector<float> v = gaussian(52, k.size());
        cache.limit_key_transform();  // as CudaBackend::attach_kv asks of the pools it attends
        cache.calibrate_keys(0, kv::KeySample{.k = k.data(), .n_rows = n});
        cache.store(0, cells, k.data(), v.data());
        const kv::KvCache::LayerView view = cache.layer_view(0);
        ASSERT_TRUE(view.rotated);
        ASSERT_NE(view.k_scale, nullptr);
        std::vector<float> row(width);
        std::vector<uint8_t> got(view.k_row_bytes);
        for (int i = 0; i < n; ++i) {
            for (int e = 0; e < width; ++e) row[e] = (k[i * width + e] - view.k_center[e]) * view.k_scale[e];
            kv::hadamard_transform_rows(row.data(), n_head_kv, head_dim);
            for (int h = 0; h < n_head_kv; ++h) {
                encode_row_on_host(type, row.data() + h * head_dim, head_dim, got.data() + h * view.k_head_bytes);
            }
            const auto* want = reinterpret_cast<const uint8_t*>(view.k) + cells[i] * view.k_row_bytes;
            ASSERT_EQ(0, std::memcmp(got.data(), want, view.k_row_bytes)) << "row " << i;
        }
    }
}

// ---- Matrix products ----------------------------------------------------------------------------

// |got - want| <= 1e-4 of sum |w| |x| (the float summation orders differ) + 1e-6.
void expect_matmul_close(GgmlType type, int64_t rows, int64_t cols, int n_tok, size_t row_stride = 0) {
    SCOPED_TRACE(std::string(quant::traits(type).name) + " rows " + std::to_string(rows) + " cols " +
                 std::to_string(cols) + " tokens " + std::to_string(n_tok));
    const size_t packed = *quant::row_bytes(type, static_cast<uint64_t>(cols));
    const size_t stride = row_stride != 0 ? row_stride : packed;
    std::vector<uint8_t> w(stride * static_cast<size_t>(rows), 0xA5);
    std::vector<float> w_ref(static_cast<size_t>(rows * cols));
    const std::vector<float> src = gaussian(7 + static_cast<uint32_t>(type), static_cast<size_t>(rows * cols), 0.5f);
    for (int64_t r = 0; r < rows; ++r) {
        void* row = w.data() + r * stride;
        if (type == GgmlType::F32) {
            std::memcpy(row, src.data() + r * cols, packed);
        } else {
            quant::quantize_row(type, src.data() + r * cols, row, cols);
        }
        quant::dequantize_row(type, row, w_ref.data() + r * cols, cols);
    }
    const std::vector<float> x = gaussian(99, static_cast<size_t>(n_tok * cols));
    DeviceBuffer dw(w), dx(x), dy(sizeof(float) * static_cast<size_t>(n_tok * rows));
    matmul(type, dw.get(), rows, cols, row_stride, dx.get<float>(), n_tok, dy.get<float>(), nullptr);
    const std::vector<float> y = dy.read<float>();
    int bad = 0;
    for (int t = 0; t < n_tok; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
            double want = 0.0, mag = 0.0;
            for (int64_t c = 0; c < cols; ++c) {
                want += static_cast<double>(w_ref[r * cols + c]) * x[t * cols + c];
                mag += std::fabs(static_cast<double>(w_ref[r * cols + c]) * x[t * cols + c]);
            }
            const double got = y[t * rows + r];
            if (std::fabs(got - want) > 1e-4 * mag + 1e-6 && ++bad <= 5) {
                ADD_FAILURE() << "token " << t << " row " << r << ": " << got << " vs " << want;
            }
        }
    }
    EXPECT_EQ(bad, 0);
}

const GgmlType kMatmulTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                                 GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                                 GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

TEST(CudaKernels, MatmulOneTokenEveryType) {
    SKIP_WITHOUT_DEVICE();
    for (GgmlType type : kMatmulTypes) expect_matmul_close(type, 37, 512, 1);
}

TEST(CudaKernels, MatmulSmallBatchesEveryType) {  // the matrix-vector kernel, 2..8 tokens and chunks of 8
    SKIP_WITHOUT_DEVICE();
    for (GgmlType type : kMatmulTypes) {
        expect_matmul_close(type, 19, 768, 3);
        expect_matmul_close(type, 19, 768, 8);
    }
    expect_matmul_close(GgmlType::F16, 5, 40, 20);  // cols not a multiple of 32: matrix-vector in chunks
}

TEST(CudaKernels, MatmulTiledEveryType) {  // > 8 tokens: shared-memory tiles, partial at both edges
    SKIP_WITHOUT_DEVICE();
    for (GgmlType type : kMatmulTypes) expect_matmul_close(type, 70, 512, 67);
}

TEST(CudaKernels, MatmulRowStride) {
    SKIP_WITHOUT_DEVICE();
    expect_matmul_close(GgmlType::Q4_K, 9, 256, 1, 144 + 16);
    expect_matmul_close(GgmlType::Q8_0, 65, 64, 12, 68 + 6);
}

// ---- Norms, RoPE, element-wise ------------------------------------------------------------------

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel, float abs,
                  const char* what) {
    ASSERT_EQ(got.size(), want.size());
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!(std::fabs(got[i] - want[i]) <= abs + rel * std::fabs(want[i])) && ++bad <= 5) {
            ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
        }
    }
    EXPECT_EQ(bad, 0) << what;
}

TEST(CudaKernels, RmsNorm) {
    SKIP_WITHOUT_DEVICE();
    const int64_t rows = 5, n = 1000;
    const std::vector<float> x = gaussian(1, rows * n, 3.0f), w = gaussian(2, n);
    std::vector<float> want(x.size()), want_unscaled(x.size());
    ops::rms_norm(x.data(), w.data(), 1e-6f, rows, n, want.data());
    ops::rms_norm(x.data(), nullptr, 1e-6f, rows, n, want_unscaled.data());
    DeviceBuffer dx(x), dw(w), dy(x.size() * sizeof(float));
    rms_norm(dx.get<float>(), dw.get<float>(), 1e-6f, rows, n, dy.get<float>(), nullptr);
    expect_close(dy.read<float>(), want, 1e-6f, 1e-7f, "rms_norm");
    rms_norm(dx.get<float>(), nullptr, 1e-6f, rows, n, dx.get<float>(), nullptr);  // in place
    expect_close(dx.read<float>(), want_unscaled, 1e-6f, 1e-7f, "rms_norm in place");
}

TEST(CudaKernels, RopeNormalAndNeox) {
    SKIP_WITHOUT_DEVICE();
    const int n_tok = 6, n_head = 3, head_dim = 64;
    const std::vector<int32_t> pos = {0, 1, 7, 100, 4095, 30000};
    const std::vector<float> factors = [] {
        std::vector<float> f(24);
        for (size_t i = 0; i < f.size(); ++i) f[i] = 1.0f + 0.25f * static_cast<float>(i);
        return f;
    }();
    DeviceBuffer dpos(pos), dfactors(factors);
    for (const bool neox : {false, true}) {
        for (const bool with_factors : {false, true}) {
            SCOPED_TRACE(std::string(neox ? "neox" : "normal") + (with_factors ? " with freq factors" : ""));
            const int n_dims = with_factors ? 48 : 64;  // partial rotation with the factors
            const std::vector<float> x = gaussian(3, n_tok * n_head * head_dim);
            std::vector<float> want = x;
            ops::RopeParams p{.mode = neox ? ops::RopeMode::Neox : ops::RopeMode::Normal,
                              .n_dims = n_dims,
                              .freq_base = 500000.0f,
                              .freq_scale = 0.5f,
                              .freq_factors = with_factors ? factors.data() : nullptr};
            ops::rope(want.data(), pos.data(), n_tok, n_head, head_dim, p);
            DeviceBuffer dx(x);
            const RopeArgs args{.neox = neox,
                                .n_dims = n_dims,
                                .freq_base = p.freq_base,
                                .freq_scale = p.freq_scale,
                                .freq_factors = with_factors ? dfactors.get<float>() : nullptr};
            rope(dx.get<float>(), dpos.get<int32_t>(), n_tok, n_head, head_dim, args, nullptr);
            // The same angles in float; sin/cos of angles up to 15000 differ by an ulp or two of the angle's
            // reduction between libm and CUDA.
            expect_close(dx.read<float>(), want, 1e-5f, 2e-5f, "rope");
        }
    }
}

TEST(CudaKernels, ElementWise) {
    SKIP_WITHOUT_DEVICE();
    const int64_t n_tok = 3, n = 333;
    const std::vector<float> a = gaussian(4, n_tok * n, 4.0f), b = gaussian(5, n_tok * n, 4.0f), bias = gaussian(6, n);
    DeviceBuffer da(a), db(b), dbias(bias), dy(a.size() * sizeof(float));
    std::vector<float> want(a.size());

    ops::add(a.data(), b.data(), n_tok * n, want.data());
    add(da.get<float>(), db.get<float>(), n_tok * n, dy.get<float>(), nullptr);
    expect_close(dy.read<float>(), want, 0.0f, 0.0f, "add");

    want = a;
    ops::add_bias(want.data(), bias.data(), n_tok, n);
    copy_on_device(dy.get(), da.get(), a.size() * sizeof(float), nullptr);
    add_bias(dy.get<float>(), dbias.get<float>(), n_tok, n, nullptr);
    expect_close(dy.read<float>(), want, 0.0f, 0.0f, "add_bias");

    want = a;
    ops::scale(want.data(), n_tok * n, 0.125f);
    copy_on_device(dy.get(), da.get(), a.size() * sizeof(float), nullptr);
    scale(dy.get<float>(), n_tok * n, 0.125f, nullptr);
    expect_close(dy.read<float>(), want, 0.0f, 0.0f, "scale");

    ops::swiglu(a.data(), b.data(), n_tok * n, want.data());  // ggml's exp polynomial vs expf: a few ulp
    swiglu(da.get<float>(), db.get<float>(), n_tok * n, dy.get<float>(), nullptr);
    expect_close(dy.read<float>(), want, 2e-6f, 1e-7f, "swiglu");

    // f16-rounded GELU: equal except where tanhf and std::tanh differ by an ulp next to an f16 rounding
    // boundary (one f16 step, 2^-10 relative).
    ops::geglu(a.data(), b.data(), n_tok * n, want.data());
    geglu(da.get<float>(), db.get<float>(), n_tok * n, dy.get<float>(), nullptr);
    expect_close(dy.read<float>(), want, 1e-3f, 1e-6f, "geglu");

    want = a;
    ops::softcap(want.data(), n_tok * n, 5.0f);
    copy_on_device(dy.get(), da.get(), a.size() * sizeof(float), nullptr);
    softcap(dy.get<float>(), n_tok * n, 5.0f, nullptr);
    expect_close(dy.read<float>(), want, 2e-6f, 1e-6f, "softcap");
}

// ---- KV cache -----------------------------------------------------------------------------------

struct KvCase {
    GgmlType type;
    bool rotate;
    int window;
    // K stored shaped on the device as the host cache shapes it (its K transform copied over): the
    // device's K bytes must then be the host cache's own.
    bool shaped = false;
};

// What kv_store should write for one row: each head rotated when asked (kv::hadamard_transform, the
// same butterflies as the kernel), then converted as the host converts (quantize_row; F32 copied).
std::vector<uint8_t> expected_row(GgmlType type, const float* row, int n_head_kv, int head_dim, size_t head_bytes,
                                  bool rotate) {
    std::vector<uint8_t> out(head_bytes * n_head_kv);
    std::vector<float> head(head_dim);
    for (int h = 0; h < n_head_kv; ++h) {
        std::copy(row + h * head_dim, row + (h + 1) * head_dim, head.begin());
        if (rotate) kv::hadamard_transform(head.data(), head_dim);
        if (type == GgmlType::F32) {
            std::memcpy(out.data() + h * head_bytes, head.data(), head_dim * sizeof(float));
        } else {
            quant::quantize_row(type, head.data(), out.data() + h * head_bytes, head_dim);
        }
    }
    return out;
}

// Attention in double over K/V given as floats per cell (un-rotated), with the visibility rules of
// kernels.h: the exact answer for what the device holds.
std::vector<float> exact_attention(const std::vector<float>& q, const std::vector<kv::Pos>& q_pos,
                                   const std::vector<kv::SeqId>& q_seq, const kv::KvCache& cache,
                                   const std::vector<std::vector<float> >& k, const std::vector<std::vector<float> >& v,
                                   const ops::AttentionParams& p) {
    const int d = p.head_dim, group = p.n_head / p.n_head_kv;
    std::vector<float> out(q.size(), 0.0f);
    for (size_t t = 0; t < q_pos.size(); ++t) {
        std::vector<int32_t> cells;
        for (const int32_t b : cache.seq_blocks(q_seq[t])) {
            for (int32_t c = b * cache.params().block_size; c < (b + 1) * cache.params().block_size; ++c) {
                const kv::Pos pos = cache.cell_pos(c);
                if (c < cache.capacity() && cache.cell_has_seq(c, q_seq[t]) && pos <= q_pos[t] &&
                    (p.sliding_window <= 0 || pos > q_pos[t] - p.sliding_window)) {
                    cells.push_back(c);
                }
            }
        }
        for (int h = 0; h < p.n_head; ++h) {
            const float* qh = q.data() + (t * p.n_head + h) * d;
            const int g = h / group;
            std::vector<double> score;
            double max = -1e300;
            for (const int32_t c : cells) {
                double dot = 0.0;
                for (int i = 0; i < d; ++i) dot += static_cast<double>(qh[i]) * k[c][g * d + i];
                double sc = dot * p.scale;
                if (p.softcap > 0.0f) sc = p.softcap * std::tanh(sc / p.softcap);
                score.push_back(sc);
                max = std::max(max, sc);
            }
            double sum = 0.0;
            std::vector<double> acc(d, 0.0);
            for (size_t j = 0; j < cells.size(); ++j) {
                const double w = std::exp(score[j] - max);
                sum += w;
                for (int i = 0; i < d; ++i) acc[i] += w * v[cells[j]][g * d + i];
            }
            for (int i = 0; i < d; ++i)
                out[(t * p.n_head + h) * d + i] = sum > 0 ? static_cast<float>(acc[i] / sum) : 0;
        }
    }
    return out;
}

// Two sequences sharing a prefix, a removed range (holes) and a sliding window, in a host cache
// that keeps the bookkeeping. The device stores the same rows: its bytes are compared with what the
// host's conversions give, and its attention over them with exact attention over their values.
// Then the device attends the host cache's own bytes (as a host-held KV pool is attended, with the
// cache's K transform, kv/key_transform.h), compared with ops::attention_kv over the same bytes.
void run_kv_case(const KvCase& kc) {
    SCOPED_TRACE(std::string(quant::traits(kc.type).name) + (kc.rotate ? " rotated" : "") +
                 (kc.shaped ? " shaped" : "") + " window " + std::to_string(kc.window));
    const int n_head = 8, n_head_kv = 2, head_dim = 128, width = n_head_kv * head_dim;
    kv::CacheParams params;
    params.n_cells = 256;
    params.n_seq_max = 3;
    params.block_size = 16;
    params.type_k = params.type_v = kc.type;
    params.rotate = kc.rotate;
    kv::KvCache cache({kv::LayerShape{n_head_kv, head_dim, head_dim}}, params);

    // Sequence 0: 70 tokens; sequence 1 shares its first 40 and adds 25 more; sequence 0 loses 10..19.
    std::vector<kv::SeqId> seq(70, 0);
    std::vector<kv::Pos> pos(70);
    for (int i = 0; i < 70; ++i) pos[i] = i;
    std::vector<int32_t> cells(70);
    cache.place(seq, pos, cells);
    cache.seq_cp(0, 1, 0, 40);
    std::vector<kv::SeqId> seq1(25, 1);
    std::vector<kv::Pos> pos1(25);
    for (int i = 0; i < 25; ++i) pos1[i] = 40 + i;
    std::vector<int32_t> cells1(25);
    cache.place(seq1, pos1, cells1);
    cells.insert(cells.end(), cells1.begin(), cells1.end());
    cache.seq_rm(0, 10, 20);

    const size_t n_rows = cells.size();
    const std::vector<float> k = gaussian(11, n_rows * width), v = gaussian(12, n_rows * width);
    cache.store(0, cells, k.data(), v.data());
    const kv::KvCache::LayerView view = cache.layer_view(0);
    const bool rotated = kc.rotate && quant::traits(kc.type).is_quantized;
    ASSERT_EQ(view.rotated, rotated);
    ASSERT_EQ(view.k_scale != nullptr, rotated) << "the host cache shapes quantized K when it rotates";
    ASSERT_TRUE(!kc.shaped || rotated);

    const size_t k_bytes = view.k_row_bytes * static_cast<size_t>(cache.capacity());
    const size_t v_bytes = view.v_row_bytes * static_cast<size_t>(cache.capacity());
    DeviceBuffer dk(k_bytes), dv(v_bytes), dk_rows(k), dv_rows(v), dcells(cells);
    const size_t transform = view.q_scale != nullptr ? static_cast<size_t>(width) : 0;
    DeviceBuffer dq_scale(std::vector<float>(view.q_scale, view.q_scale + transform)),
        dk_center(std::vector<float>(view.k_center, view.k_center + transform)),
        dk_scale(std::vector<float>(view.k_scale, view.k_scale + transform));
    KvLayout k_layout{.type = kc.type,
                      .data = dk.get(),
                      .row_bytes = view.k_row_bytes,
                      .head_bytes = view.k_head_bytes,
                      .n_head_kv = n_head_kv,
                      .head_dim = head_dim,
                      .rotated = rotated};
    KvLayout v_layout = k_layout;
    v_layout.data = dv.get();
    v_layout.row_bytes = view.v_row_bytes;
    v_layout.head_bytes = view.v_head_bytes;
    if (kc.shaped) {
        k_layout.center = dk_center.get<float>();
        k_layout.scale = dk_scale.get<float>();
        k_layout.inv_scale = dq_scale.get<float>();
    }
    kv_store(k_layout, dk_rows.get<float>(), dcells.get<int32_t>(), static_cast<int64_t>(n_rows), nullptr);
    kv_store(v_layout, dv_rows.get<float>(), dcells.get<int32_t>(), static_cast<int64_t>(n_rows), nullptr);
    const std::vector<uint8_t> k_dev = dk.read<uint8_t>(), v_dev = dv.read<uint8_t>();
    // The stored bytes, and the values they hold (un-rotated) for the exact reference.
    std::vector<std::vector<float> > k_val(cache.capacity(), std::vector<float>(width)),
        v_val(cache.capacity(), std::vector<float>(width));
    for (size_t i = 0; i < n_rows; ++i) {
        const size_t c = static_cast<size_t>(cells[i]);
        for (const bool is_k : {true, false}) {
            const std::vector<uint8_t>& dev = is_k ? k_dev : v_dev;
            const size_t row_bytes = is_k ? view.k_row_bytes : view.v_row_bytes;
            const size_t head_bytes = is_k ? view.k_head_bytes : view.v_head_bytes;
            std::vector<uint8_t> want =
                expected_row(kc.type, (is_k ? k : v).data() + i * width, n_head_kv, head_dim, head_bytes, rotated);
            if (is_k && kc.shaped) {  // the host cache's own bytes
                const auto* host = reinterpret_cast<const uint8_t*>(view.k) + c * row_bytes;
                want.assign(host, host + row_bytes);
            }
            ASSERT_EQ(0, std::memcmp(dev.data() + c * row_bytes, want.data(), want.size()))
                << (is_k ? "K" : "V") << " row " << i << " (cell " << c << ") differs from the host's conversion";
            float* val = (is_k ? k_val : v_val)[c].data();
            if (is_k && kc.shaped) {
                cache.read_k(0, static_cast<int32_t>(c), val);
                continue;
            }
            for (int h = 0; h < n_head_kv; ++h) {
                quant::dequantize_row(kc.type, dev.data() + c * row_bytes + h * head_bytes, val + h * head_dim,
                                      head_dim);
            }
            if (rotated) kv::hadamard_transform_rows(val, n_head_kv, head_dim);
        }
    }
    // kv_load reads the stored rows back as the host reads them (read_k / read_v): the same values.
    {
        DeviceBuffer back_k(n_rows * width * sizeof(float)), back_v(n_rows * width * sizeof(float));
        kv_load(k_layout, dcells.get<int32_t>(), static_cast<int64_t>(n_rows), back_k.get<float>(), nullptr);
        kv_load(v_layout, dcells.get<int32_t>(), static_cast<int64_t>(n_rows), back_v.get<float>(), nullptr);
        const std::vector<float> got_k = back_k.read<float>(), got_v = back_v.read<float>();
        for (size_t i = 0; i < n_rows; ++i) {
            const size_t c = static_cast<size_t>(cells[i]);
            for (int e = 0; e < width; ++e) {
                ASSERT_EQ(got_k[i * width + e], k_val[c][e]) << "kv_load K row " << i << " element " << e;
                ASSERT_EQ(got_v[i * width + e], v_val[c][e]) << "kv_load V row " << i << " element " << e;
            }
        }
    }

    // Queries: sequence 0 at 70 and 71 (decode-like), sequence 1 at 30, 64 (prefix and own cells).
    const std::vector<kv::SeqId> q_seq = {0, 0, 1, 1};
    const std::vector<kv::Pos> q_pos = {70, 71, 30, 64};
    const int n_tok = static_cast<int>(q_seq.size());
    const std::vector<float> q = gaussian(13, static_cast<size_t>(n_tok) * n_head * head_dim);
    const ops::AttentionParams ap{.n_head = n_head,
                                  .n_head_kv = n_head_kv,
                                  .head_dim = head_dim,
                                  .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
                                  .softcap = kc.window > 0 ? 30.0f : 0.0f,
                                  .sliding_window = kc.window};

    // The host's bookkeeping on the device: its cells' positions and sequence sets, the block tables.
    std::vector<int32_t> blocks, seq_blocks = {0};
    for (kv::SeqId s = 0; s < params.n_seq_max; ++s) {
        const std::span<const int32_t> table = cache.seq_blocks(s);
        blocks.insert(blocks.end(), table.begin(), table.end());
        seq_blocks.push_back(static_cast<int32_t>(blocks.size()));
    }
    const std::vector<int32_t> cell_pos(cache.cell_positions().begin(), cache.cell_positions().end());
    const std::vector<uint64_t> cell_seqs(cache.cell_seq_masks().begin(), cache.cell_seq_masks().end());
    DeviceBuffer dq(q), dout(q.size() * sizeof(float)), dq_pos(q_pos), dq_seq(q_seq), dcell_pos(cell_pos),
        dcell_seqs(cell_seqs), dblocks(blocks), dseq_blocks(seq_blocks);
    KvAttentionArgs args{.n_head = n_head,
                         .n_head_kv = n_head_kv,
                         .head_dim = head_dim,
                         .scale = ap.scale,
                         .softcap = ap.softcap,
                         .sliding_window = ap.sliding_window,
                         .q_pos = dq_pos.get<int32_t>(),
                         .q_seq = dq_seq.get<int32_t>(),
                         .cell_pos = dcell_pos.get<int32_t>(),
                         .cell_seqs = dcell_seqs.get<uint64_t>(),
                         .capacity = cache.capacity(),
                         .blocks = dblocks.get<int32_t>(),
                         .seq_blocks = dseq_blocks.get<int32_t>(),
                         .block_size = params.block_size};
    if (kc.shaped) {
        args.q_scale = dq_scale.get<float>();
        args.k_center = dk_center.get<float>();
    }
    attention_kv(dq.get<float>(), n_tok, k_layout, v_layout, args, dout.get<float>(), nullptr);
    // Float online softmax against double: 1e-4.
    expect_close(dout.read<float>(), exact_attention(q, q_pos, q_seq, cache, k_val, v_val, ap), 1e-4f, 1e-4f,
                 "attention over the device's K/V");

    // The host cache's own bytes (as a host-held pool is attended), with its K transform if any.
    std::vector<float> want(q.size());
    ops::ThreadPool pool(1);
    ops::Scratch scratch;
    ops::attention_kv(q.data(), q_pos.data(), q_seq.data(), n_tok, cache, 0, ap, want.data(), pool, scratch);
    const auto* host_k = reinterpret_cast<const uint8_t*>(view.k);
    const auto* host_v = reinterpret_cast<const uint8_t*>(view.v);
    DeviceBuffer hk(std::vector<uint8_t>(host_k, host_k + k_bytes)), hv(std::vector<uint8_t>(host_v, host_v + v_bytes));
    args.q_scale = transform > 0 ? dq_scale.get<float>() : nullptr;
    args.k_center = transform > 0 ? dk_center.get<float>() : nullptr;
    KvLayout hk_layout = k_layout, hv_layout = v_layout;
    hk_layout.data = hk.get();
    hv_layout.data = hv.get();
    attention_kv(dq.get<float>(), n_tok, hk_layout, hv_layout, args, dout.get<float>(), nullptr);
    // The CPU's f16 path rounds q to f16 and sums V in f16: 3e-3 on outputs of magnitude ~0.1-1.
    expect_close(dout.read<float>(), want, 1e-2f, 3e-3f, "attention over the host cache's K/V");
}

// The test's exact reference (above) against ops::attention_kv on an f32 cache, where the CPU reads
// the values as stored: the visibility rules the kernel and the reference share are the CPU's.
// Runs without a GPU.
TEST(CudaKernels, ExactAttentionReferenceAgreesWithTheCpu) {
    for (const int window : {0, 24}) {
        SCOPED_TRACE("window " + std::to_string(window));
        const int n_head = 4, n_head_kv = 2, head_dim = 64, width = n_head_kv * head_dim;
        kv::CacheParams params;
        params.n_cells = 128;
        params.n_seq_max = 2;
        params.block_size = 16;
        params.type_k = params.type_v = GgmlType::F32;
        kv::KvCache cache({kv::LayerShape{n_head_kv, head_dim, head_dim}}, params);
        std::vector<kv::SeqId> seq(50, 0);
        std::vector<kv::Pos> pos(50);
        for (int i = 0; i < 50; ++i) pos[i] = i;
        std::vector<int32_t> cells(50);
        cache.place(seq, pos, cells);
        cache.seq_cp(0, 1, 0, 30);
        cache.seq_rm(0, 5, 12);
        const std::vector<float> k = gaussian(31, 50 * width), v = gaussian(32, 50 * width);
        cache.store(0, cells, k.data(), v.data());
        std::vector<std::vector<float> > k_val(cache.capacity(), std::vector<float>(width)),
            v_val(cache.capacity(), std::vector<float>(width));
        for (int32_t c = 0; c < cache.capacity(); ++c) {
            cache.read_k(0, c, k_val[c].data());
            cache.read_v(0, c, v_val[c].data());
        }
        const std::vector<kv::SeqId> q_seq = {0, 0, 1};
        const std::vector<kv::Pos> q_pos = {49, 20, 29};
        const std::vector<float> q = gaussian(33, q_seq.size() * n_head * head_dim);
        const ops::AttentionParams ap{.n_head = n_head,
                                      .n_head_kv = n_head_kv,
                                      .head_dim = head_dim,
                                      .scale = 0.125f,
                                      .softcap = window > 0 ? 30.0f : 0.0f,
                                      .sliding_window = window};
        std::vector<float> want(q.size());
        ops::ThreadPool pool(1);
        ops::Scratch scratch;
        ops::attention_kv(q.data(), q_pos.data(), q_seq.data(), 3, cache, 0, ap, want.data(), pool, scratch);
        expect_close(exact_attention(q, q_pos, q_seq, cache, k_val, v_val, ap), want, 1e-4f, 1e-5f, "reference");
    }
}

TEST(CudaKernels, KvStoreAndAttention) {
    SKIP_WITHOUT_DEVICE();
    for (const KvCase& kc :
         {KvCase{GgmlType::F16, false, 0}, KvCase{GgmlType::F16, false, 24}, KvCase{GgmlType::F32, false, 0},
          KvCase{GgmlType::BF16, false, 0}, KvCase{GgmlType::Q8_0, false, 0}, KvCase{GgmlType::Q8_0, true, 0},
          KvCase{GgmlType::Q8_0, true, 24}, KvCase{GgmlType::Q8_0, true, 24, true}}) {
        run_kv_case(kc);
    }
}

// The 4- and 5-bit K/V types: stored, read back, attended; plain, rotated, and shaped as the host
// shapes K (the host cache's own bytes).
TEST(CudaKernels, KvStoreAndAttentionSmallTypes) {
    SKIP_WITHOUT_DEVICE();
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL}) {
        for (const KvCase& kc : {KvCase{type, false, 0}, KvCase{type, true, 0}, KvCase{type, true, 24, true}}) {
            run_kv_case(kc);
        }
    }
}

}  // namespace
}  // namespace fitllm::backend::cuda

#endif  // FITLLM_CUDA
