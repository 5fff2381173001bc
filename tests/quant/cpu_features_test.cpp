// CPU feature detection against the kernel's own view (/proc/cpuinfo), and FITLLM_CPU_ISA.
#include "quant/cpu_features.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "quant_test_data.h"  // PrintTo(Isa)

namespace fitllm::quant {
namespace {

// The "flags" of the first processor in /proc/cpuinfo; nullopt where there is no such file.
std::optional<std::set<std::string>> proc_cpu_flags() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("flags", 0) != 0) continue;
        std::istringstream words(line.substr(line.find(':') + 1));
        std::set<std::string> flags;
        for (std::string w; words >> w;) flags.insert(w);
        return flags;
    }
    return std::nullopt;
}

// Sets an environment variable for one scope, restoring the old value after.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        ::setenv(name, value, 1);
    }
    ~ScopedEnv() {
        if (old_)
            ::setenv(name_, old_->c_str(), 1);
        else
            ::unsetenv(name_);
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    const char* name_;
    std::optional<std::string> old_;
};

TEST(CpuFeatures, AgreesWithProcCpuinfo) {
    const auto flags = proc_cpu_flags();
    if (!flags) GTEST_SKIP() << "no /proc/cpuinfo";
    const CpuFeatures f = detect_cpu_features();
    auto has = [&](const char* flag) { return flags->count(flag) > 0; };
    // Linux lists a flag only when the OS supports the state it needs, as our xgetbv check does.
    EXPECT_EQ(f.avx2, has("avx2"));
    EXPECT_EQ(f.fma, has("fma"));
    EXPECT_EQ(f.f16c, has("f16c"));
    EXPECT_EQ(f.avx512f, has("avx512f"));
    EXPECT_EQ(f.avx512bw, has("avx512bw"));
    EXPECT_EQ(f.avx512vl, has("avx512vl"));
    EXPECT_EQ(f.avx512_vnni, has("avx512_vnni"));
    EXPECT_EQ(f.avx_vnni, has("avx_vnni"));
    std::printf("detected: %s -> %s\n", f.describe().c_str(), std::string(isa_name(f.best_isa())).c_str());
}

TEST(CpuFeatures, LevelsNeedEverythingBelow) {
    CpuFeatures f;
    EXPECT_EQ(f.best_isa(), Isa::Scalar);
    EXPECT_EQ(f.describe(), "none");
    f.avx2 = f.fma = true;
    EXPECT_EQ(f.best_isa(), Isa::Scalar);  // no F16C: the AVX2 kernels convert scales with it
    f.f16c = true;
    EXPECT_EQ(f.best_isa(), Isa::Avx2);
    f.avx512f = f.avx512bw = true;
    EXPECT_EQ(f.best_isa(), Isa::Avx2);  // no VL
    f.avx512vl = true;
    EXPECT_EQ(f.best_isa(), Isa::Avx512);
    f.avx512_vnni = true;
    EXPECT_EQ(f.best_isa(), Isa::Avx512Vnni);
    EXPECT_EQ(f.describe(), "avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni");

    for (Isa level : kAllIsas) EXPECT_EQ(limit_to(f, level).best_isa(), level) << isa_name(level);
    EXPECT_FALSE(limit_to(f, Isa::Avx2).avx512f);
    EXPECT_TRUE(limit_to(f, Isa::Avx2).f16c);
    EXPECT_FALSE(limit_to(f, Isa::Scalar).avx2);
}

TEST(CpuFeatures, IsaNames) {
    for (Isa isa : kAllIsas) EXPECT_EQ(isa_from_name(isa_name(isa)), isa);
    EXPECT_EQ(isa_from_name("AVX512_VNNI"), Isa::Avx512Vnni);
    EXPECT_EQ(isa_from_name("sse4"), std::nullopt);
}

TEST(CpuFeatures, EnvironmentLowersTheLevel) {
    const CpuFeatures detected = detect_cpu_features();
    {
        ScopedEnv env("FITLLM_CPU_ISA", "scalar");
        EXPECT_EQ(host_cpu_features().best_isa(), Isa::Scalar);
    }
    {
        ScopedEnv env("FITLLM_CPU_ISA", "avx2");
        EXPECT_EQ(host_cpu_features().best_isa(), std::min(Isa::Avx2, detected.best_isa()));
    }
    {
        ScopedEnv env("FITLLM_CPU_ISA", "avx512_vnni");  // asking for more than there is gives what there is
        EXPECT_EQ(host_cpu_features().best_isa(), detected.best_isa());
    }
    {
        ScopedEnv env("FITLLM_CPU_ISA", "");
        EXPECT_EQ(host_cpu_features().best_isa(), detected.best_isa());
    }
    {
        ScopedEnv env("FITLLM_CPU_ISA", "avx9000");
        try {
            host_cpu_features();
            ADD_FAILURE() << "no exception";
        } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("avx9000"), std::string::npos) << e.what();
        }
    }
}

}  // namespace
}  // namespace fitllm::quant
