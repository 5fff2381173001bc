// Matrix-vector products on one thread: a 4096 x 4096 weight matrix of each type times one
// activation row, with fitllm's dot kernel at every instruction-set level the CPU has and with
// llama.cpp's ggml_vec_dot_* (from the venv's llama-cpp-python, when present). Reports GB/s of
// weight bytes streamed.
//
//   build/bench/dot_bench [--benchmark_filter=Q4_K] [--benchmark_min_time=0.5]
//
// Two settings: "l3" reuses one matrix (it fits this machine's L3 for the 4- to 8-bit types), "dram"
// cycles through copies totalling >= 512 MiB so every byte comes from memory, as in decoding a model.
// The activation row is quantized once, outside the timing (it is 1/4096 of the work).
#include <benchmark/benchmark.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "llama_cpp_lib.h"
#include "quant/blocks.h"
#include "quant/dot.h"
#include "quant/quantize.h"

namespace {

using namespace fitllm::quant;

constexpr int kRows = 4096, kCols = 4096;
constexpr size_t kDramBytes = size_t{512} << 20;

constexpr GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_K,  GgmlType::Q6_K,  GgmlType::Q8_0,
                               GgmlType::Q2_K, GgmlType::Q3_K,  GgmlType::Q5_K,  GgmlType::Q4_1,
                               GgmlType::Q5_0, GgmlType::Q5_1,  GgmlType::F16,   GgmlType::BF16,
                               GgmlType::F32,  GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::MXFP4};

// Weights start on a cache line, as in a mapped GGUF file (32-byte aligned tensors) at best; set
// FITLLM_BENCH_OFFSET=32 to start them half-way into one instead.
struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p - offset()); }
    static size_t offset() {
        static const size_t off = [] {
            const char* env = std::getenv("FITLLM_BENCH_OFFSET");
            return env ? static_cast<size_t>(std::atoi(env)) % 64 : size_t{0};
        }();
        return off;
    }
};
using Buffer = std::unique_ptr<uint8_t[], FreeDeleter>;
Buffer allocate(size_t bytes) {
    const size_t padded = (bytes + FreeDeleter::offset() + 63) / 64 * 64;
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, padded));
    if (p == nullptr) throw std::bad_alloc();
    return Buffer(p + FreeDeleter::offset());
}

// One matrix per type (and its copies for the dram setting), built on first use.
struct Matrix {
    size_t row_bytes = 0;
    size_t bytes = 0;
    std::vector<Buffer> copies;     // [0] is the l3 one
    std::vector<uint8_t> act;       // fitllm's activation row
    std::vector<uint8_t> ggml_act;  // llama.cpp's (differs for F16 / BF16)
};

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

const Matrix& matrix(GgmlType type, bool dram) {
    static std::map<GgmlType, Matrix> cache;
    Matrix& m = cache[type];
    if (m.copies.empty()) {
        m.row_bytes = *row_bytes(type, kCols);
        m.bytes = m.row_bytes * kRows;
        Buffer data = allocate(m.bytes);
        const auto w = gaussian(size_t{kRows} * kCols, 1, 0.02f);
        for (int r = 0; r < kRows; ++r)
            quantize_row(type, w.data() + size_t{kCols} * r, data.get() + m.row_bytes * r, kCols);
        m.copies.push_back(std::move(data));
        const auto a = gaussian(kCols, 2, 1.0f);
        const GgmlType at = dot_activation_type(type);
        m.act.resize(*row_bytes(at, kCols));
        quantize_row(at, a.data(), m.act.data(), kCols);
        // llama.cpp pairs F16 / BF16 weights with F16 / BF16 activations.
        const GgmlType ggml_at = (type == GgmlType::F16 || type == GgmlType::BF16) ? type : at;
        m.ggml_act.resize(*row_bytes(ggml_at, kCols));
        quantize_row(ggml_at, a.data(), m.ggml_act.data(), kCols);
    }
    if (dram && m.copies.size() == 1) {
        while (m.copies.size() * m.bytes < kDramBytes) {
            Buffer copy = allocate(m.bytes);
            std::memcpy(copy.get(), m.copies[0].get(), m.bytes);
            m.copies.push_back(std::move(copy));
        }
    }
    return m;
}

// Runs rows x dot, one matrix (copy) per iteration.
template <typename RowDot>
void run_matvec(benchmark::State& state, const Matrix& m, bool dram, RowDot dot) {
    std::vector<float> out(kRows);
    size_t copy = 0;
    for (auto _ : state) {
        const uint8_t* w = m.copies[dram ? copy : 0].get();
        for (int r = 0; r < kRows; ++r) dot(&out[r], w + m.row_bytes * r);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
        copy = (copy + 1) % m.copies.size();
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * m.bytes));
    state.counters["GB/s"] =
        benchmark::Counter(static_cast<double>(m.bytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void bm_fitllm(benchmark::State& state, GgmlType type, Isa isa, bool dram) {
    const Matrix& m = matrix(type, dram);
    const DotKernel k = select_dot(type, limit_to(detect_cpu_features(), isa));
    if (k.isa != isa) {
        state.SkipWithError("kernel level not available");
        return;
    }
    run_matvec(state, m, dram, [&](float* out, const uint8_t* w) { k.fn(kCols, out, w, m.act.data()); });
}

// ggml's vec_dot: (n, s, bs, x, bx, y, by, nrc)
using GgmlVecDot = void (*)(int, float*, size_t, const void*, size_t, const void*, size_t, int);

GgmlVecDot ggml_vec_dot(GgmlType type) {
    static void* cpu = fitllm::bench::open_llama_cpp_lib("libggml-cpu.so");
    if (!cpu) return nullptr;
    static bool initialized = [] {
        if (auto init = reinterpret_cast<void (*)()>(fitllm::bench::find_symbol(cpu, "ggml_cpu_init"))) init();
        return true;
    }();
    (void)initialized;
    std::string name;
    switch (type) {
        case GgmlType::F32:
            name = "f32";
            break;
        case GgmlType::F16:
            name = "f16";
            break;
        case GgmlType::BF16:
            name = "bf16";
            break;
        default: {
            std::string w(traits(type).name), a(traits(dot_activation_type(type)).name);
            for (auto& c : w) c = c == 'K' ? 'K' : static_cast<char>(std::tolower(c));
            for (auto& c : a) c = c == 'K' ? 'K' : static_cast<char>(std::tolower(c));
            name = w + "_" + a;
        }
    }
    return reinterpret_cast<GgmlVecDot>(fitllm::bench::find_symbol(cpu, ("ggml_vec_dot_" + name).c_str()));
}

void bm_llama_cpp(benchmark::State& state, GgmlType type, bool dram) {
    const GgmlVecDot fn = ggml_vec_dot(type);
    if (!fn) {
        state.SkipWithError("llama.cpp libraries not found");
        return;
    }
    const Matrix& m = matrix(type, dram);
    run_matvec(state, m, dram, [&](float* out, const uint8_t* w) { fn(kCols, out, 0, w, 0, m.ggml_act.data(), 0, 1); });
}

// Prints Google Benchmark's table, then GB/s per type and kernel, one table per setting.
class TableReporter : public benchmark::ConsoleReporter {
public:
    void ReportRuns(const std::vector<Run>& runs) override {
        ConsoleReporter::ReportRuns(runs);
        for (const Run& r : runs) {
            if (r.error_occurred) continue;
            const auto it = r.counters.find("GB/s");
            if (it != r.counters.end()) gbps_[r.run_name.function_name] = it->second.value;
        }
    }
    void Finalize() override {
        ConsoleReporter::Finalize();
        const char* columns[] = {"scalar", "avx2", "avx512", "avx512_vnni", "llama.cpp"};
        for (const char* setting : {"l3", "dram"}) {
            std::printf("\nGB/s of weights, %d x %d matrix-vector, one thread, %s\n", kRows, kCols, setting);
            std::printf("%-6s", "type");
            for (const char* c : columns) std::printf(" %12s", c);
            std::printf("\n");
            for (GgmlType t : kTypes) {
                std::printf("%-6s", std::string(traits(t).name).c_str());
                for (const char* c : columns) {
                    const auto it =
                        gbps_.find(std::string("dot/") + std::string(traits(t).name) + "/" + c + "/" + setting);
                    if (it == gbps_.end())
                        std::printf(" %12s", "-");
                    else
                        std::printf(" %12.2f", it->second);
                }
                std::printf("\n");
            }
        }
    }

private:
    std::map<std::string, double> gbps_;
};

}  // namespace

int main(int argc, char** argv) {
    const CpuFeatures cpu = detect_cpu_features();
    std::printf("cpu: %s\n", cpu.describe().c_str());
    for (const char* setting : {"l3", "dram"}) {
        const bool dram = std::string(setting) == "dram";
        for (GgmlType t : kTypes) {
            const std::string type(traits(t).name);
            for (Isa isa : kAllIsas) {
                if (isa > cpu.best_isa()) continue;
                benchmark::RegisterBenchmark(("dot/" + type + "/" + std::string(isa_name(isa)) + "/" + setting).c_str(),
                                             [=](benchmark::State& s) { bm_fitllm(s, t, isa, dram); })
                    ->Unit(benchmark::kMillisecond)
                    ->MinTime(0.3);
            }
            benchmark::RegisterBenchmark(("dot/" + type + "/llama.cpp/" + setting).c_str(),
                                         [=](benchmark::State& s) { bm_llama_cpp(s, t, dram); })
                ->Unit(benchmark::kMillisecond)
                ->MinTime(0.3);
        }
    }
    benchmark::Initialize(&argc, argv);
    TableReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return 0;
}
