// The rules of dot_kernels.h, checked on the object files: code compiled for AVX2 / AVX-512 must not
// leak into the paths that run on any x86-64. Skipped without binutils.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "test_support.h"

namespace fitllm::quant {
namespace {

namespace fs = std::filesystem;

fs::path object_file(const std::string& source) {
    return fs::path(FITLLM_BINARY_DIR) / "src" / "CMakeFiles" / "fitllm_core.dir" / "quant" / (source + ".o");
}

bool have_tool(const char* tool) {
    return test::run_command(std::string("command -v ") + tool).status == 0;
}

// Skips without binutils; fails where the objects are not where CMake puts them (a move of the
// sources to another target must move object_file() too).
#define REQUIRE_OBJECTS()                                                                                      \
    if (!have_tool("nm") || !have_tool("objdump")) GTEST_SKIP() << "needs nm and objdump (Debian's binutils)"; \
    ASSERT_TRUE(fs::exists(object_file("dot_avx2.cpp"))) << object_file("dot_avx2.cpp")

// A weak symbol (an inline function or template instance) defined by a file built for AVX2 / AVX-512
// could be the copy the linker keeps for every caller, including ones on CPUs without those.
TEST(DotIsolation, IsaFilesDefineNoSharedInlineFunctions) {
    REQUIRE_OBJECTS();
    for (const char* source : {"dot_avx2.cpp", "dot_avx2_kquants.cpp", "dot_avx512.cpp", "dot_avx512_kquants.cpp",
                               "gemm_batch_avx2.cpp", "gemm_batch_avx512.cpp"}) {
        const auto r = test::run_command("nm -C --defined-only " + object_file(source).string());
        ASSERT_EQ(r.status, 0) << source;
        std::istringstream lines(r.output);
        for (std::string line; std::getline(lines, line);) {
            // "address type name": global text T (the table lookups) and local t/r/d/b are fine.
            std::istringstream fields(line);
            std::string address, type, name;
            fields >> address >> type >> name;
            // The pointer to the C++ personality routine that exception tables refer to (data, no
            // code; the sanitizer build has one).
            if (name.starts_with("DW.ref.__gxx_personality_v0")) continue;
            EXPECT_TRUE(type == "T" || type == "t" || type == "r" || type == "d" || type == "b")
                << source << " defines a shared symbol: " << line;
        }
    }
}

// The files every CPU runs contain no VEX / EVEX instruction (all of whose mnemonics start with v).
TEST(DotIsolation, PortableFilesUseNoAvx) {
    REQUIRE_OBJECTS();
    for (const char* source :
         {"dot.cpp", "dot_ref.cpp", "cpu_features.cpp", "dequantize.cpp", "quantize.cpp", "gemm_batch_ref.cpp"}) {
        const auto r = test::run_command("objdump -d --no-show-raw-insn " + object_file(source).string() +
                                         " | grep -cE '^ +[0-9a-f]+:\\s+v[a-z0-9]+ '");
        EXPECT_EQ(r.output, "0\n") << source << " has AVX instructions";
    }
}

// The kVnni = false kernels are for AVX-512 CPUs without VNNI.
TEST(DotIsolation, NonVnniKernelsUseNoVnni) {
    REQUIRE_OBJECTS();
    for (const char* source : {"dot_avx512.cpp", "dot_avx512_kquants.cpp", "gemm_batch_avx512.cpp"}) {
        const auto r =
            test::run_command("objdump -d -C --no-show-raw-insn " + object_file(source).string() +
                              " | awk '/^[0-9a-f]+ <.*>:$/ { fn = $0 } /vpdp/ { print fn }' | grep -c false");
        EXPECT_EQ(r.output, "0\n") << source;
    }
}

}  // namespace
}  // namespace fitllm::quant
