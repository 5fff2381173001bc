#pragma once
// The query-aware K transform's arithmetic (kv/key_transform.h): a few rows times a triangular
// d x d matrix, and the error-feedback rounding, in a scalar reference and an AVX2 + FMA variant
// (chosen at run time; tests/kv/key_transform_kernels_test.cpp holds them to each other).
//
// The triangles are stored row by row, each row padded to whole groups of 8 columns so that any
// 8 columns a product reads from a row are stored (the padding holds zeros):
//   upper: row i holds columns 8 floor(i / 8) .. d - 1;   lower: row i holds columns 0 .. 8 ceil((i + 1) / 8) - 1.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "quant/ggml_type.h"

namespace fitllm::kv {

class PaddedTriangle {
public:
    PaddedTriangle() = default;
    // From a dense row-major d x d matrix (d a multiple of 8); the other triangle is taken as 0.
    PaddedTriangle(const float* dense, int d, bool upper);
    // All zeros, for packed() to be filled (from a file that keeps a K transform); zero_padding()
    // after that keeps the padding at zero whatever the file held there.
    PaddedTriangle(int d, bool upper);
    void zero_padding();

    int size() const { return d_; }
    bool upper() const { return upper_; }
    // Row i, indexed by column: element (i, j) is row(i)[j] for every stored j.
    const float* row(int i) const { return data_.data() + offset_[static_cast<size_t>(i)]; }
    float at(int i, int j) const;  // 0 outside the triangle
    size_t floats() const { return data_.size(); }
    static size_t floats_for(int d);  // either triangle
    // The stored floats, row after row (floats_for(d) of them, padding included).
    std::span<const float> packed() const { return data_; }
    std::span<float> packed() { return data_; }

private:
    int d_ = 0;
    bool upper_ = true;
    std::vector<float> data_;
    std::vector<ptrdiff_t> offset_;  // row i's column 0 (perhaps before its first stored float)
};

// Up to kRows rows of d floats (stride d) at once.
namespace key_kernels {

inline constexpr int kRows = 8;

// out = x * B for n rows x (n x d), B upper (queries: x T^-1) or lower (keys: x T^T).
void rows_times(const float* x, int n, const PaddedTriangle& b, float* out);

// Rounds n rows w (n x d; changed: the feedback moves them) to `type` blocks at dst[r], each
// value after the errors of those before it: with U upper (the metric's factor, kv/key_transform.h),
// value j's error e_j = (w_j - rounded_j) / U_jj moves every later w_k by -e_j U_jk. Each block's
// grid is fitted to its values as they are when the block starts (quant::BlockGrid, searched).
// err: kRows * 32 floats of scratch.
void round_with_feedback(float* w, int n, const PaddedTriangle& u, quant::GgmlType type, std::byte* const* dst,
                         float* err);

// The reference versions (the functions above call the AVX2 + FMA ones where the CPU has them).
void rows_times_reference(const float* x, int n, const PaddedTriangle& b, float* out);
void round_with_feedback_reference(float* w, int n, const PaddedTriangle& u, quant::GgmlType type,
                                   std::byte* const* dst, float* err);
bool has_avx2();

}  // namespace key_kernels
}  // namespace fitllm::kv
