// `fitllm tokenize`: the rendering, and the executable end to end on a small vocabulary.
#include "cli/tokenize.h"

#include <gtest/gtest.h>

#include "test_support.h"
#include "tokenizer/tiny_vocab.h"

namespace fitllm::cli {
namespace {

// <unk> <s> </s>, byte tokens, "▁a" (id 259), "a" (260), "<|x|>" (261, control).
std::string write_tiny_spm(const test::TempDir& dir) {
    tokenizer::tiny::TinyVocabSpec spec = tokenizer::tiny::spm_spec({{"\xE2\x96\x81"
                                                                      "a",
                                                                      -1},
                                                                     {"a", -2},
                                                                     {"<|x|>", 0}});
    spec.types.back() = 3;
    gguf::GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_string("tokenizer.ggml.model", spec.model);
    w.add_string_array("tokenizer.ggml.tokens", std::span<const std::string>(spec.tokens));
    w.add_array<float>("tokenizer.ggml.scores", spec.scores);
    w.add_array<int32_t>("tokenizer.ggml.token_type", spec.types);
    const std::string path = (dir / "tiny.gguf").string();
    w.write_file(path);
    return path;
}

TEST(TokenizeCommand, RendersPiecesOrIds) {
    const test::TempDir dir;
    const auto file = gguf::GgufFile::open(write_tiny_spm(dir));
    const auto tok = tokenizer::Tokenizer::from_gguf(file);
    const std::vector<tokenizer::TokenId> ids = tok.tokenize("a a", true, false);
    EXPECT_EQ(render_tokens(tok, ids, false), "     1 -> '<s>'\n   259 -> ' a'\n   259 -> ' a'\n");
    EXPECT_EQ(render_tokens(tok, ids, true), "[1, 259, 259]\n");
    EXPECT_EQ(render_tokens(tok, {}, true), "[]\n");
}

TEST(TokenizeCommand, EndToEnd) {
    const test::TempDir dir;
    const std::string model = write_tiny_spm(dir);
    const std::string exe = test::fitllm_exe() + " tokenize -m " + model;

    auto r = test::run_command(exe + " --ids 'a a' 2>/dev/null");
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.output, "[1, 259, 259]\n");

    r = test::run_command(exe + " --ids --no-bos 'a<|x|>' 2>/dev/null");
    EXPECT_EQ(r.output, "[259, 63, 127, 123, 127, 65]\n");  // "<|x|>" spelled as byte tokens (3 + byte)
    r = test::run_command(exe + " --ids --no-bos --parse-special 'a<|x|>' 2>/dev/null");
    EXPECT_EQ(r.output, "[259, 261]\n");

    r = test::run_command(exe + " 'a' 2>&1");
    EXPECT_EQ(r.output, "     1 -> '<s>'\n   259 -> ' a'\n2 tokens\n");

    test::write_file(dir / "input.txt", std::as_bytes(std::span<const char>("a a", 3)));
    r = test::run_command(exe + " --ids -f " + (dir / "input.txt").string() + " 2>/dev/null");
    EXPECT_EQ(r.output, "[1, 259, 259]\n");
    r = test::run_command("printf 'a a' | " + exe + " --ids --stdin 2>/dev/null");
    EXPECT_EQ(r.output, "[1, 259, 259]\n");
}

TEST(TokenizeCommand, UsageErrors) {
    const test::TempDir dir;
    const std::string model = write_tiny_spm(dir);
    auto r = test::run_command(test::fitllm_exe() + " tokenize -m " + model + " 2>&1");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.output.find("exactly one of TEXT"), std::string::npos) << r.output;
    r = test::run_command(test::fitllm_exe() + " tokenize 'a' 2>&1");
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.output.find("-m MODEL"), std::string::npos) << r.output;
    r = test::run_command(test::fitllm_exe() + " tokenize -m " + (dir / "missing.gguf").string() + " a 2>&1");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("missing.gguf"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace fitllm::cli
