#pragma once
// The tiny Llama (tests/model/data/tiny-llama-q8_0.gguf), its tokenizer and two compute threads,
// loaded once per test suite, for the tests of engine::Scheduler.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::engine::test_fixtures {

class TinyLlamaScheduler : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        file_ = new gguf::GgufFile(
            gguf::GgufFile::open((test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string()));
        tokenizer_ = new tokenizer::Tokenizer(tokenizer::Tokenizer::from_gguf(*file_));
        model_ = model::Model::load(*file_).release();
        compute_ = new Compute(2);
    }
    static void TearDownTestSuite() {
        delete compute_;
        delete model_;
        delete tokenizer_;
        delete file_;
        compute_ = nullptr;
        model_ = nullptr;
        tokenizer_ = nullptr;
        file_ = nullptr;
    }

    static std::vector<int32_t> ids(const std::string& text) { return tokenizer_->tokenize(text, true, false); }
    // What one request gives in a scheduler of its own.
    static Job::Update alone(const std::vector<int32_t>& prompt, const GenerationParams& p, const ContextConfig& c) {
        Scheduler s(*model_, *tokenizer_, c, {}, *compute_);
        return s.submit(prompt, p)->wait_all();
    }

    inline static gguf::GgufFile* file_ = nullptr;
    inline static tokenizer::Tokenizer* tokenizer_ = nullptr;
    inline static model::Model* model_ = nullptr;
    inline static Compute* compute_ = nullptr;
};

}  // namespace fitllm::engine::test_fixtures
