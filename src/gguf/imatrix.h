#pragma once
// Importance matrices as llama.cpp's llama-imatrix writes them, for `fitllm quantize --imatrix`.
//
// GGUF format (llama-imatrix's default): for each weight matrix W that saw activations, two F32
// tensors, "<W's name>.in_sum2" (ne[0] = W's row length, ne[1] = its experts, 1 for a dense matrix:
// the sum of the squared activations of each input column) and "<W's name>.counts" (one value per
// expert: the number of activation rows summed), plus the metadata imatrix.datasets (array of
// strings), imatrix.chunk_count and imatrix.chunk_size. Legacy .dat format: int32 entry count;
// per entry int32 name length, the name, int32 ncall, int32 nval and nval floats (sums already
// divided by their count and multiplied by ncall); optionally int32 chunk count, int32 length and
// the dataset's name.
//
// What llama-quantize makes of them, and so this: the weight of column j of expert e is
// in_sum2[e][j] / counts[e] (1 where the count is 0); legacy: value / ncall (the value itself where
// ncall is 0). A weight that is not finite is refused.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fitllm::gguf {

struct ImportanceMatrix {
    std::string path;                                   // the file, as given (in errors and metadata)
    std::map<std::string, std::vector<float>> weights;  // by weight name: n_expert * row length
    std::vector<std::string> datasets;
    int64_t chunk_count = 0;
    bool legacy = false;
};

// Reads a GGUF (by its magic) or legacy importance matrix. Throws Error naming the file and the
// entry for anything malformed: a missing partner tensor, a type that is not F32, sums that are
// no whole number of rows per count, a truncated legacy file, a value that is not finite.
ImportanceMatrix load_imatrix(const std::string& path);

// llama-quantize's --include-weights / --exclude-weights: keep only the entries whose name
// contains one of `include` (when not empty), then drop those containing one of `exclude`.
void filter_imatrix(ImportanceMatrix& m, const std::vector<std::string>& include,
                    const std::vector<std::string>& exclude);

}  // namespace fitllm::gguf
