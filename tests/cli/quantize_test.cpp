// `fitllm quantize`: the executable end to end (a quantized model runs, and gives the text of the
// file llama.cpp quantized from the same F16 model), and its usage errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "test_support.h"

namespace fitllm {
namespace {

namespace fs = std::filesystem;

std::string model_data(const std::string& name) {
    return (test::source_dir() / "tests" / "model" / "data" / name).string();
}

std::string run_text(const std::string& model) {
    const test::CommandResult r = test::run_command(test::fitllm_exe() + " run -m '" + model +
                                                    "' -p 'hello world' -n 12 --temp 0 -t 2 2>/dev/null");
    EXPECT_EQ(r.status, 0) << r.output;
    return r.output;
}

TEST(QuantizeCommand, QuantizedModelRunsAsLlamaCppsDoes) {
    test::TempDir dir;
    const std::string out = (dir / "q4km.gguf").string();
    const test::CommandResult q = test::run_command(test::fitllm_exe() + " quantize -t 2 '" +
                                                    model_data("tiny-llama-f16.gguf") + "' '" + out + "' Q4_K_M 2>&1");
    ASSERT_EQ(q.status, 0) << q.output;
    EXPECT_NE(q.output.find("wrote " + out + ": Q4_K_M"), std::string::npos) << q.output;
    EXPECT_NE(q.output.find("peak RSS"), std::string::npos) << q.output;
    EXPECT_NE(q.output.find("output.weight"), std::string::npos) << q.output;
    const std::string ours = run_text(out);
    EXPECT_FALSE(ours.empty());
    EXPECT_EQ(ours, run_text(model_data("tiny-llama-q4_k_m.gguf")));

    // The output exists now: refused without --force, written with it.
    test::CommandResult again = test::run_command(test::fitllm_exe() + " quantize '" +
                                                  model_data("tiny-llama-f16.gguf") + "' '" + out + "' Q8_0 2>&1");
    EXPECT_EQ(again.status, 2) << again.output;
    EXPECT_NE(again.output.find("--force"), std::string::npos) << again.output;
    again = test::run_command(test::fitllm_exe() + " quantize --force '" + model_data("tiny-llama-f16.gguf") + "' '" +
                              out + "' Q8_0 2>&1");
    EXPECT_EQ(again.status, 0) << again.output;
    EXPECT_EQ(run_text(out), run_text(model_data("tiny-llama-q8_0.gguf")));

    const test::CommandResult dry = test::run_command(test::fitllm_exe() + " quantize --dry-run '" +
                                                      model_data("tiny-llama-f16.gguf") + "' '" + out + "' q2_k 2>&1");
    EXPECT_EQ(dry.status, 0) << dry.output;
    EXPECT_NE(dry.output.find("tensor data:"), std::string::npos) << dry.output;
}

// --imatrix end to end with a legacy .dat file (GGUF ones: tests/gguf/imatrix_test.cpp) and
// --include-weights: the entries kept are counted, recorded in the output, and a type that needs
// an entry for every matrix names the first one missing.
TEST(QuantizeCommand, TakesAnImportanceMatrix) {
    test::TempDir dir;
    std::vector<std::byte> dat;
    auto put = [&](const void* p, size_t n) {
        const auto* b = static_cast<const std::byte*>(p);
        dat.insert(dat.end(), b, b + n);
    };
    auto i32 = [&](int32_t v) { put(&v, 4); };
    const std::vector<float> ones(256, 1.5f);
    i32(8);
    for (int layer = 0; layer < 2; ++layer) {
        for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
            const std::string name = "blk." + std::to_string(layer) + "." + m + ".weight";
            i32(static_cast<int32_t>(name.size()));
            put(name.data(), name.size());
            i32(3);  // ncall
            i32(256);
            put(ones.data(), 256 * sizeof(float));
        }
    }
    const fs::path imatrix = dir / "imatrix.dat";
    test::write_file(imatrix, dat);
    const std::string in = model_data("tiny-llama-f16.gguf"), out = (dir / "o.gguf").string();
    test::CommandResult r = test::run_command(test::fitllm_exe() + " quantize -t 2 --imatrix '" + imatrix.string() +
                                              "' --include-weights attn_q '" + in + "' '" + out + "' IQ3_S 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("2 entries of 8"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("legacy format"), std::string::npos) << r.output;
    size_t weighted = 0;  // the two attn_q matrices, and no other
    for (size_t at = r.output.find("(imatrix)"); at != std::string::npos; at = r.output.find("(imatrix)", at + 1))
        ++weighted;
    EXPECT_EQ(weighted, 2u) << r.output;
    EXPECT_FALSE(run_text(out).empty());
    r = test::run_command(test::fitllm_exe() + " quantize --force --imatrix '" + imatrix.string() + "' '" + in + "' '" +
                          out + "' IQ2_XS 2>&1");
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find("blk.0.ffn_gate.weight"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("has no entry for it"), std::string::npos) << r.output;
}

TEST(QuantizeCommand, UsageErrors) {
    test::TempDir dir;
    const std::string in = model_data("tiny-llama-f16.gguf"), out = (dir / "o.gguf").string();
    struct Case {
        std::string args;
        int status;
        std::string says;
    };
    const Case cases[] = {
        {"'" + in + "' '" + out + "' Q9_9", 2, "unknown file type 'Q9_9'"},
        {"'" + in + "' '" + in + "' Q8_0", 2, "is the input file"},
        {"'" + in + "' '" + out + "' IQ2_XS", 1, "importance matrix"},
        {"--imatrix '" + (dir / "x.dat").string() + "' '" + in + "' '" + out + "' Q4_K_M", 1,
         "x.dat: cannot open the importance matrix"},
        {"--include-weights attn '" + in + "' '" + out + "' Q4_K_M", 2, "need --imatrix"},
        {"--imatrix x --include-weights a --exclude-weights b '" + in + "' '" + out + "' Q4_K_M", 2,
         "one or the other"},
        {"'" + in + "' '" + out + "' Q2_K_S", 1, "pass --imatrix"},
        {"--output-tensor-type q9 '" + in + "' '" + out + "' Q4_K_M", 2, "unknown tensor type 'q9'"},
        {"--tensor-type attn_v '" + in + "' '" + out + "' Q4_K_M", 2, "PATTERN=TYPE"},
        {"'" + (dir / "missing.gguf").string() + "' '" + out + "' Q8_0", 1, "no such file"},
        {"'" + model_data("tiny-llama-q8_0.gguf") + "' '" + out + "' Q4_0", 1, "--allow-requantize"},
    };
    for (const Case& c : cases) {
        const test::CommandResult r = test::run_command(test::fitllm_exe() + " quantize " + c.args + " 2>&1");
        EXPECT_EQ(r.status, c.status) << c.args << "\n" << r.output;
        EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
        EXPECT_FALSE(fs::exists(out)) << c.args;
    }
}

}  // namespace
}  // namespace fitllm
