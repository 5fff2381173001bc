#pragma once
// The progress line the CLI shows while a model's weights are read in:
//   loading gemma-3-270m-q4_k_m.gguf: 42% (99 / 235 MiB)
// redrawn in place on stderr, shown only where stderr is a terminal and only once loading has
// taken longer than a moment, then ended with the time it took.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "gguf/gguf_reader.h"
#include "model/model.h"

namespace fitllm::cli {

class LoadProgress {
public:
    // enabled == false: prints nothing. Output starts once `delay_s` seconds have passed.
    LoadProgress(std::FILE* out, std::string name, bool enabled, double delay_s = 0.25);
    // Redraws the line (at most once per percent); done == total ends it.
    void update(uint64_t done, uint64_t total);
    bool printed() const { return printed_; }

private:
    std::FILE* out_;
    std::string name_;
    bool enabled_;
    double delay_s_;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
    int last_percent_ = -1;
    bool printed_ = false;
};

// Reads the weights `model` reads through the mapping of `file` into memory (engine::prefault:
// not its streamed layers) with a LoadProgress on stderr when it is a terminal.
void prefault_with_progress(gguf::GgufFile& file, const model::Model& model);

}  // namespace fitllm::cli
