#pragma once
// What the CPU (and the OS, which must save the wider registers) lets the kernels use, and the
// instruction-set levels the kernel tables are built for.
#include <optional>
#include <string>
#include <string_view>

namespace fitllm::quant {

// Kernel levels, lowest first. Each level needs everything of the levels below it.
enum class Isa {
    Scalar,      // the reference kernels: any x86-64
    Avx2,        // AVX2 + FMA + F16C (Haswell, Zen 1 and later)
    Avx512,      // + AVX-512 F, BW, VL (Skylake-X)
    Avx512Vnni,  // + AVX-512 VNNI (Cascade Lake, Ice Lake, Zen 4 and later)
};
inline constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni};

std::string_view isa_name(Isa isa);                       // "scalar", "avx2", "avx512", "avx512_vnni"
std::optional<Isa> isa_from_name(std::string_view name);  // the inverse, case-insensitive

struct CpuFeatures {
    bool avx2 = false;
    bool fma = false;
    bool f16c = false;
    bool avx512f = false;
    bool avx512bw = false;
    bool avx512vl = false;
    bool avx512_vnni = false;
    bool avx_vnni = false;  // the VEX-encoded VNNI of Alder Lake; detected, not used yet

    Isa best_isa() const;          // the highest level all of whose features are present
    std::string describe() const;  // "avx2 fma f16c avx512f ...", "none" without any
};

// Asks the CPU (cpuid) and the OS (xgetbv: are the YMM / ZMM states enabled?).
CpuFeatures detect_cpu_features();

// The features with everything above `level` cleared.
CpuFeatures limit_to(CpuFeatures features, Isa level);

// detect_cpu_features(), lowered to $FITLLM_CPU_ISA (scalar | avx2 | avx512 | avx512_vnni) when it is
// set, for tests and benchmarks; asking for more than the CPU has gives what it has. Throws
// std::invalid_argument for any other value, naming it.
CpuFeatures host_cpu_features();

}  // namespace fitllm::quant
