// `fitllm inspect`: the report's content, and the executable end to end.
#include "cli/inspect.h"

#include <gtest/gtest.h>

#include "gguf/gguf_writer.h"
#include "test_support.h"

namespace fitllm::cli {
namespace {

// A small llama-shaped file with a tokenizer.
std::string write_tiny_llama(const test::TempDir& dir) {
    gguf::GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_string("general.name", "tiny");
    w.add<uint32_t>("general.file_type", 7);
    w.add<uint32_t>("llama.block_count", 2);
    w.add<uint32_t>("llama.embedding_length", 64);
    w.add<uint32_t>("llama.attention.head_count", 4);
    w.add<uint32_t>("llama.attention.head_count_kv", 2);
    w.add<uint32_t>("llama.context_length", 128);
    w.add<float>("llama.rope.freq_base", 10000.0f);
    w.add_string("tokenizer.ggml.model", "llama");
    const std::vector<std::string> tokens{"<unk>", "<s>", "</s>", "a"};
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add<uint32_t>("tokenizer.ggml.bos_token_id", 1);
    w.add_string("tokenizer.chat_template", "{{ messages }}");
    const int64_t dims[] = {64, 4};
    w.add_tensor("token_embd.weight", quant::GgmlType::Q8_0, dims, std::vector<std::byte>(4 * 2 * 34));
    const int64_t norm[] = {64};
    w.add_tensor("output_norm.weight", quant::GgmlType::F32, norm, std::vector<std::byte>(256));
    const std::string path = (dir / "tiny.gguf").string();
    w.write_file(path);
    return path;
}

TEST(Inspect, ReportHasModelHyperParametersTokenizerAndTypes) {
    test::TempDir dir;
    const auto f = gguf::GgufFile::open(write_tiny_llama(dir));
    const auto r = inspect_report(f, {.tensors = true, .metadata = true});
    EXPECT_EQ(r["general"]["architecture"], "llama");
    EXPECT_EQ(r["general"]["file_type"]["name"], "Q8_0");
    EXPECT_EQ(r["hyperparameters"]["n_layer"], 2);
    EXPECT_EQ(r["hyperparameters"]["head_dim"], 16);  // derived: 64 / 4
    EXPECT_EQ(r["hyperparameters"]["rope"]["freq_base"], 10000.0);
    EXPECT_EQ(r["tokenizer"]["vocab_size"], 4);
    EXPECT_EQ(r["tokenizer"]["special_tokens"]["bos"]["text"], "<s>");
    EXPECT_EQ(r["tokenizer"]["chat_template"], true);
    EXPECT_EQ(r["totals"]["tensors"], 2);
    EXPECT_EQ(r["totals"]["bytes"], 4 * 2 * 34 + 256);
    ASSERT_EQ(r["tensors"].size(), 2u);
    EXPECT_EQ(r["tensors"][0]["name"], "token_embd.weight");
    EXPECT_EQ(r["tensors"][0]["shape"], nlohmann::ordered_json::array({64, 4}));
    EXPECT_EQ(r["tensors"][0]["offset"], f.data_offset());
    EXPECT_EQ(r["metadata"].size(), f.metadata().size());
    // Not runnable: no feed_forward_length, no layers' tensors. The report says so and why.
    EXPECT_EQ(r["fitllm"]["runs"], false);
    EXPECT_NE(r["fitllm"]["why"].get<std::string>().find("llama.feed_forward_length"), std::string::npos)
        << r["fitllm"];
    const std::string text = render_inspect_text(r);
    EXPECT_NE(text.find("fitllm runs it           no: "), std::string::npos) << text;
    EXPECT_NE(text.find("Q8_0 (7)"), std::string::npos) << text;
    EXPECT_NE(text.find("token_embd.weight"), std::string::npos) << text;
}

TEST(Inspect, ExecutableTextJsonHelpAndErrors) {
    test::TempDir dir;
    const std::string path = write_tiny_llama(dir);
    auto r = test::run_command(test::fitllm_exe() + " inspect '" + path + "' 2>&1");
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("architecture             llama"), std::string::npos) << r.output;

    r = test::run_command(test::fitllm_exe() + " inspect --json --tensors '" + path + "'");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["tensors"].size(), 2u);

    r = test::run_command(test::fitllm_exe() + " inspect --help");
    EXPECT_EQ(r.status, 0);
    EXPECT_NE(r.output.find("--tensors"), std::string::npos);
    r = test::run_command(test::fitllm_exe() + " --help");
    EXPECT_EQ(r.status, 0);
    EXPECT_NE(r.output.find("inspect"), std::string::npos);

    r = test::run_command(test::fitllm_exe() + " inspect /nonexistent.gguf 2>&1");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("/nonexistent.gguf"), std::string::npos) << r.output;
    r = test::run_command(test::fitllm_exe() + " inspect 2>&1");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.output.find("missing MODEL.gguf"), std::string::npos) << r.output;
    r = test::run_command(test::fitllm_exe() + " frobnicate 2>&1");
    EXPECT_EQ(r.status, 2);

    // A corrupt file: a clear error with the offset, exit status 1, no crash.
    auto bytes = test::read_file(path);
    bytes.resize(100);
    test::write_file(dir / "cut.gguf", bytes);
    r = test::run_command(test::fitllm_exe() + " inspect '" + (dir / "cut.gguf").string() + "' 2>&1");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("cut.gguf: byte "), std::string::npos) << r.output;
}

TEST(Inspect, DemoModelAndVocabFiles) {
    const auto model = test::demo_model();
    if (!model) GTEST_SKIP() << "demo model not found (run scripts/setup.sh)";
    const auto r = inspect_report(gguf::GgufFile::open(model->string()), {});
    EXPECT_EQ(r["general"]["architecture"], "gemma3");
    EXPECT_EQ(r["general"]["file_type"]["name"], "Q4_K_M");
    EXPECT_EQ(r["hyperparameters"]["sliding_window"], 512);
    EXPECT_EQ(r["tokenizer"]["vocab_size"], 262144);
    EXPECT_EQ(r["fitllm"]["runs"], true) << r["fitllm"];
    for (const auto& e : std::filesystem::directory_iterator(test::vocab_dir())) {
        if (e.path().extension() != ".gguf") continue;
        const auto v = inspect_report(gguf::GgufFile::open(e.path().string()), {.tensors = true});
        EXPECT_FALSE(render_inspect_text(v).empty());
    }
}

}  // namespace
}  // namespace fitllm::cli
