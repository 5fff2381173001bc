#include "quant/cpu_features.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "util/text.h"

namespace fitllm::quant {
namespace {

struct CpuidRegs {
    uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidRegs cpuid(uint32_t leaf, uint32_t subleaf) {
    CpuidRegs r;
    if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) return CpuidRegs{};
    return r;
}

// XCR0: which register states the OS saves on a context switch. xgetbv is only valid when
// cpuid says OSXSAVE; inline assembly avoids needing -mxsave for the intrinsic.
uint64_t read_xcr0() {
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(uint32_t reg, int n) {
    return (reg >> n) & 1u;
}

}  // namespace

std::string_view isa_name(Isa isa) {
    switch (isa) {
        case Isa::Scalar:
            return "scalar";
        case Isa::Avx2:
            return "avx2";
        case Isa::Avx512:
            return "avx512";
        case Isa::Avx512Vnni:
            return "avx512_vnni";
    }
    return "unknown";
}

std::optional<Isa> isa_from_name(std::string_view name) {
    for (Isa isa : kAllIsas) {
        if (util::iequals(isa_name(isa), name)) return isa;
    }
    return std::nullopt;
}

Isa CpuFeatures::best_isa() const {
    if (!(avx2 && fma && f16c)) return Isa::Scalar;
    if (!(avx512f && avx512bw && avx512vl)) return Isa::Avx2;
    return avx512_vnni ? Isa::Avx512Vnni : Isa::Avx512;
}

std::string CpuFeatures::describe() const {
    std::string s;
    auto add = [&](bool has, const char* name) {
        if (!has) return;
        if (!s.empty()) s += ' ';
        s += name;
    };
    add(avx2, "avx2");
    add(fma, "fma");
    add(f16c, "f16c");
    add(avx512f, "avx512f");
    add(avx512bw, "avx512bw");
    add(avx512vl, "avx512vl");
    add(avx512_vnni, "avx512_vnni");
    add(avx_vnni, "avx_vnni");
    return s.empty() ? "none" : s;
}

CpuFeatures detect_cpu_features() {
    CpuFeatures f;
    const CpuidRegs leaf1 = cpuid(1, 0);
    if (!bit(leaf1.ecx, 27) || !bit(leaf1.ecx, 28)) return f;  // no OSXSAVE or no AVX
    const uint64_t xcr0 = read_xcr0();
    const bool ymm_state = (xcr0 & 0x6) == 0x6;                 // SSE and AVX state
    const bool zmm_state = ymm_state && (xcr0 & 0xE0) == 0xE0;  // opmask, ZMM0-15 upper, ZMM16-31
    if (!ymm_state) return f;
    const CpuidRegs leaf7 = cpuid(7, 0);
    const CpuidRegs leaf7_1 = cpuid(7, 1);
    f.fma = bit(leaf1.ecx, 12);
    f.f16c = bit(leaf1.ecx, 29);
    f.avx2 = bit(leaf7.ebx, 5);
    f.avx_vnni = bit(leaf7_1.eax, 4);
    if (zmm_state) {
        f.avx512f = bit(leaf7.ebx, 16);
        f.avx512bw = bit(leaf7.ebx, 30);
        f.avx512vl = bit(leaf7.ebx, 31);
        f.avx512_vnni = bit(leaf7.ecx, 11);
    }
    return f;
}

CpuFeatures limit_to(CpuFeatures f, Isa level) {
    if (level < Isa::Avx512Vnni) f.avx512_vnni = false;
    if (level < Isa::Avx512) f.avx512f = f.avx512bw = f.avx512vl = false;
    if (level < Isa::Avx2) f.avx2 = f.fma = f.f16c = f.avx_vnni = false;
    return f;
}

CpuFeatures host_cpu_features() {
    const CpuFeatures detected = detect_cpu_features();
    const char* env = std::getenv("FITLLM_CPU_ISA");
    if (env == nullptr || *env == '\0') return detected;
    const auto level = isa_from_name(env);
    if (!level) {
        throw std::invalid_argument(std::string("FITLLM_CPU_ISA=") + env +
                                    ": expected scalar, avx2, avx512 or avx512_vnni");
    }
    return limit_to(detected, *level);
}

}  // namespace fitllm::quant
