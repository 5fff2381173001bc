#pragma once
// The scale searches of llama.cpp's k-quant quantizers (make_qx_quants, make_q3_quants,
// make_qkx2_quants, make_qkx3_quants, make_qp_quants), written from their description in its order
// of float operations, so that quant/quantize_ref.cpp (and IQ2_XXS's first scale in
// quant/quantize_iq.cpp) write llama-quantize's bytes. Each fits n values x to integer levels L and
// returns the scale.
#include <cstdint>
#include <cstring>

namespace fitllm::quant::fit {

// Below this a group is flat: all levels 0, scale 0.
constexpr float kGroupEps = 1e-15f;

// Round to nearest, ties to even, for |v| < 2^22: the bits of v + 1.5 * 2^23.
inline int nearest(float v) {
    const float shifted = v + 12582912.0f;
    int bits;
    std::memcpy(&bits, &shifted, sizeof bits);
    return (bits & 0x007FFFFF) - 0x00400000;
}

// Symmetric fit of n values to L in [0, 2 nmax): the first guess maps the value of largest
// magnitude to -nmax, then 18 neighbouring scales are tried and the best by weighted squared
// error (weights x^2) kept. Returns the scale.
float symmetric(int n, int nmax, const float* x, int8_t* L);

// Q3_K's fit: the first guess as above, then up to 5 rounds moving single values to the level
// that improves the weighted (x^2) fit. L in [0, 2 nmax). Returns the scale.
float q3(int n, int nmax, const float* x, int8_t* L);

// Affine fit x ~ scale * L - min (min >= 0, L in [0, nmax]) with weights: the range's fit, then
// nstep + 1 scales around it, each with the least-squares scale and offset for its levels; the
// smallest weighted error (|e| with use_abs, else e^2) wins. Returns the scale; *neg_min = min.
float affine_search(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min, float rmin,
                    float rdelta, int nstep, bool use_abs);

// make_qx_quants with rmse_type 1: symmetric's search, the error weighted by qw (x^2 without).
float symmetric_weighted(int n, int nmax, const float* x, int8_t* L, const float* qw);

// make_qkx3_quants: the affine fit of affine_search, squared errors, weights (x^2 without),
// steps from rmin; `max <= min` counts as flat.
float affine_weighted(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min, float rmin,
                      float rdelta, int nstep);

// make_qp_quants: n non-negative values (sub-block scales or mins) to levels 0..nmax with a
// positive scale: 8 scales around max / nmax tried by weighted squared error, then up to 5 rounds
// moving single levels as q3 does. Returns the scale.
float positive(int n, int nmax, const float* x, uint8_t* L, const float* w);

// sigma^2 of a row or block: the mean of x^2 times `factor`.
float mean_square(const float* x, int64_t n, float factor);

// The importance of each value: qw * sqrt(sigma2 + x^2).
void importance(const float* qw, const float* x, int n, float sigma2, float* w);

}  // namespace fitllm::quant::fit
