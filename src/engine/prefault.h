#pragma once
// Reading a model's weights into memory before the first forward pass, with progress reports.
//
// A mapped GGUF file costs nothing to open: its pages are read on first touch, so without this
// the first prompt would pay for reading the whole file, page fault by page fault, with no sign
// of what is happening. prefault() asks the kernel to read ahead (madvise WILLNEED) one chunk in
// front of the one it touches, and reports the bytes done after each chunk.
//
// A model that streams its last layers (model::LoadOptions::n_streamed_layers) must not have them
// faulted in: pass the model, and their bytes are left alone.
#include <cstdint>
#include <functional>
#include <span>

#include "gguf/gguf_reader.h"
#include "model/model.h"

namespace fitllm::engine {

// Called with the bytes read so far and the total, after every chunk and once at the end
// (done == total).
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

// Touches every page of the file's tensor data except those only inside the `skip` ranges (a page
// shared with data outside them is touched). A parsed (not mapped) file is already in memory:
// progress is reported once, at the end. Returns the bytes of tensor data outside `skip`.
uint64_t prefault(gguf::GgufFile& file, const ProgressFn& progress = {}, std::span<const model::FileRange> skip = {});

// The tensor data `model` reads through the mapping: all but its streamed layers and the tensors
// it copied to a device (offloaded_ranges()), and, when it streams some, but its token embedding
// unless the output shares it (read a row per token).
uint64_t prefault(gguf::GgufFile& file, const model::Model& model, const ProgressFn& progress = {});

}  // namespace fitllm::engine
