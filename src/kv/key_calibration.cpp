// The query-aware K transform's fit (kv/key_transform.h): from the first rows a layer stores, the
// centre c, the map T and the error-feedback factor U of each kv head. Dense linear algebra on d x d
// matrices (Eigen, in double); runs once per layer.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <complex>
#include <numbers>

#include "kv/hadamard.h"
#include "kv/key_transform.h"

namespace fitllm::kv {
namespace {

// The fit works in float (twice the speed of double, and its matrices are regularized well
// enough); the moments' means in double.
using Mat = Eigen::MatrixXf;
using Vec = Eigen::VectorXd;

// T^T T = Ck^-1/2 (Ck^1/2 Cq Ck^1/2)^(2 kHalfPower) Ck^-1/2: 1/2 is the optimum for plain rounding,
// 1/4 was better with the error feedback on Gemma 3 270M's keys (per-layer attention KL of q4_0
// keys, summed: 0.037 at 1/4, 0.041 at 0.1, 0.058 at 1/2).
constexpr double kPower = 0.25;
// Few rows estimate a d x d covariance badly: both are pulled towards their diagonals by
// kShrinkRows / (kShrinkRows + rows) (at 16 rows, 0.8: the attention KL of q4_0 keys calibrated on
// 16 rows 0.051 with it, 0.245 without).
constexpr double kShrinkRows = 64.0;
// GPTQ's damping of the metric, as a fraction of its mean diagonal.
constexpr double kDamping = 0.01;
// Rows a fit reads at most (evenly spread when a batch has more): enough for the covariances,
// and a bound on the fit's time and memory.
constexpr int64_t kMaxKeyRows = 512;
constexpr int64_t kMaxQueryRows = 512;

// A head's dims as RoPE moves them: a pair (turned by theta) or a single dim (never turned).
struct Unit {
    int a, b;  // b < 0: a single dim
    double theta;
};

std::vector<Unit> units_of(const RopeFrame& rope, int d) {
    std::vector<Unit> units;
    std::vector<char> paired(static_cast<size_t>(d), 0);
    for (size_t j = 0; j < rope.theta.size(); ++j) {
        units.push_back({rope.first[j], rope.second[j], rope.theta[j]});
        paired[static_cast<size_t>(rope.first[j])] = paired[static_cast<size_t>(rope.second[j])] = 1;
    }
    for (int i = 0; i < d; ++i) {
        if (!paired[static_cast<size_t>(i)]) units.push_back({i, -1, 0.0});
    }
    return units;
}

// Means over positions p < P of rotations by RoPE's angles: for a rotation by w per position,
// (1 / P) sum over p of e^(i w p) = (1 - e^(i w P)) / (P (1 - e^(i w))). Per unit, e^(i theta) and
// e^(i theta P) are computed once; sums and differences of two units' angles come from products.
class RotationMean {
public:
    RotationMean(const std::vector<Unit>& units, int positions) : units_(units), positions_(std::max(positions, 1)) {
        for (const Unit& u : units) {
            step_.push_back(std::polar(1.0, u.theta));
            whole_.push_back(std::polar(1.0, u.theta * positions_));
        }
    }

    // mean of R(p) m.
    Vec of_vector(const Vec& m) const {
        Vec out = m;
        for (size_t j = 0; j < units_.size(); ++j) {
            const Unit& u = units_[j];
            if (u.b < 0) continue;
            const std::complex<double> g = mean(step_[j], whole_[j]);
            out(u.a) = g.real() * m(u.a) - g.imag() * m(u.b);
            out(u.b) = g.imag() * m(u.a) + g.real() * m(u.b);
        }
        return out;
    }

    // mean of R(p) S R(p)^T: a pair block of S splits into a part that commutes with rotations
    // (turned by the difference of the two angles) and a reflection part (turned by their sum).
    template <class M>
    M of_moment(const M& s) const {
        using Scalar = typename M::Scalar;
        M out = s;
        for (size_t i = 0; i < units_.size(); ++i) {
            const Unit& u = units_[i];
            for (size_t j = 0; j < units_.size(); ++j) {
                const Unit& v = units_[j];
                if (u.b >= 0 && v.b >= 0) {
                    const double s00 = s(u.a, v.a), s01 = s(u.a, v.b), s10 = s(u.b, v.a), s11 = s(u.b, v.b);
                    const std::complex<double> c =
                        std::complex<double>((s00 + s11) / 2, (s10 - s01) / 2) *
                        mean(step_[i] * std::conj(step_[j]), whole_[i] * std::conj(whole_[j]));
                    const std::complex<double> g = mean(step_[i] * step_[j], whole_[i] * whole_[j]);
                    const double z = (s00 - s11) / 2, w = (s01 + s10) / 2;
                    out(u.a, v.a) = static_cast<Scalar>(c.real() + g.real() * z - g.imag() * w);
                    out(u.a, v.b) = static_cast<Scalar>(-c.imag() + g.real() * w + g.imag() * z);
                    out(u.b, v.a) = static_cast<Scalar>(c.imag() + g.imag() * z + g.real() * w);
                    out(u.b, v.b) = static_cast<Scalar>(c.real() + g.imag() * w - g.real() * z);
                } else if (u.b >= 0) {  // pair rows, single column
                    const std::complex<double> g = mean(step_[i], whole_[i]);
                    const double s0 = s(u.a, v.a), s1 = s(u.b, v.a);
                    out(u.a, v.a) = static_cast<Scalar>(g.real() * s0 - g.imag() * s1);
                    out(u.b, v.a) = static_cast<Scalar>(g.imag() * s0 + g.real() * s1);
                } else if (v.b >= 0) {  // single row, pair columns
                    const std::complex<double> g = mean(step_[j], whole_[j]);
                    const double t0 = s(u.a, v.a), t1 = s(u.a, v.b);
                    out(u.a, v.a) = static_cast<Scalar>(g.real() * t0 - g.imag() * t1);
                    out(u.a, v.b) = static_cast<Scalar>(g.imag() * t0 + g.real() * t1);
                }
            }
        }
        return out;
    }

private:
    // The mean phase of a rotation whose per-position factor is `step` and whose P-th power is `whole`.
    std::complex<double> mean(std::complex<double> step, std::complex<double> whole) const {
        if (std::norm(1.0 - step) < 1e-24 || positions_ == 1) return 1.0;
        return (1.0 - whole) / (static_cast<double>(positions_) * (1.0 - step));
    }

    const std::vector<Unit>& units_;
    int positions_;
    std::vector<std::complex<double>> step_, whole_;
};

// cos and sin of every unit's angle at each token of a sample (pairs only; singles get 1, 0).
struct Angles {
    std::vector<float> cos, sin;  // [token][unit]
};

// Rows of one head (token t's at src + t * stride + offset) for the tokens `tokens`, turned back
// by RoPE to position 0.
Mat unrotated_rows(const float* src, const std::vector<int64_t>& tokens, int64_t stride, int64_t offset,
                   const std::vector<Unit>& units, const Angles& angles, int d) {
    Mat out(static_cast<Eigen::Index>(tokens.size()), d);
    const size_t n_units = units.size();
    for (size_t r = 0; r < tokens.size(); ++r) {
        const float* x = src + tokens[r] * stride + offset;
        const float* c = angles.cos.data() + r * n_units;
        const float* s = angles.sin.data() + r * n_units;
        for (size_t j = 0; j < n_units; ++j) {
            const Unit& u = units[j];
            if (u.b < 0) {
                out(static_cast<Eigen::Index>(r), u.a) = x[u.a];
                continue;
            }
            out(static_cast<Eigen::Index>(r), u.a) = x[u.a] * c[j] + x[u.b] * s[j];  // the angle's negative
            out(static_cast<Eigen::Index>(r), u.b) = -x[u.a] * s[j] + x[u.b] * c[j];
        }
    }
    return out;
}

Angles angles_of(const std::vector<int64_t>& tokens, const int32_t* pos, const std::vector<Unit>& units) {
    Angles a;
    a.cos.reserve(tokens.size() * units.size());
    a.sin.reserve(tokens.size() * units.size());
    for (int64_t t : tokens) {
        for (const Unit& u : units) {
            const double angle = u.theta * static_cast<double>(pos[t]);
            a.cos.push_back(static_cast<float>(std::cos(angle)));
            a.sin.push_back(static_cast<float>(std::sin(angle)));
        }
    }
    return a;
}

// count tokens of n, evenly spread.
std::vector<int64_t> spread(int64_t n, int64_t count) {
    std::vector<int64_t> tokens(static_cast<size_t>(count));
    for (int64_t r = 0; r < count; ++r) tokens[static_cast<size_t>(r)] = r * n / count;
    return tokens;
}

// A^T A / rows, from the lower half (half the products of A^T A).
Mat gram(const Mat& a) {
    Mat g = Mat::Zero(a.cols(), a.cols());
    g.selfadjointView<Eigen::Lower>().rankUpdate(a.transpose(), 1.0f / static_cast<float>(a.rows()));
    return g.selfadjointView<Eigen::Lower>();
}

void shrink_to_diagonal(Mat& c, float lambda) {
    const Eigen::VectorXf diagonal = c.diagonal();
    c *= 1.0f - lambda;
    c.diagonal() = diagonal;
}

// x <- H x H for the normalized Walsh-Hadamard H (symmetric, its own inverse).
void hadamard_both_sides(Mat& x) {
    const auto d = static_cast<int>(x.rows());
    std::vector<float> line(static_cast<size_t>(d));
    for (int pass = 0; pass < 2; ++pass) {
        for (int c = 0; c < d; ++c) {
            for (int r = 0; r < d; ++r) line[static_cast<size_t>(r)] = static_cast<float>(x(r, c));
            hadamard_transform(line.data(), d);
            for (int r = 0; r < d; ++r) x(r, c) = line[static_cast<size_t>(r)];
        }
        x.transposeInPlace();
    }
}

// m as the row-major floats PaddedTriangle takes.
PaddedTriangle triangle(const Mat& m, bool upper) {
    const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rows = m;
    return PaddedTriangle(rows.data(), static_cast<int>(m.rows()), upper);
}

}  // namespace

std::optional<KeyTransform::Head> fit_query_aware_head(const KeySample& sample, int h, int n_head_kv, int d,
                                                       int n_positions, bool rotate) {
    if (sample.n_rows < 1 || sample.q == nullptr || sample.n_head_q < n_head_kv || sample.n_head_q % n_head_kv != 0) {
        return std::nullopt;
    }
    const std::vector<Unit> units = units_of(sample.rope, d);
    const int positions = std::max(n_positions, 1);

    // Keys and queries of head h (the query heads of its group), in RoPE's unrotated frame.
    const int64_t n = sample.n_rows;
    const std::vector<int64_t> key_tokens = spread(n, std::min(n, kMaxKeyRows));
    const Angles key_angles = angles_of(key_tokens, sample.pos, units);
    Mat keys = unrotated_rows(sample.k, key_tokens, int64_t{n_head_kv} * d, int64_t{h} * d, units, key_angles, d);
    const int group = sample.n_head_q / n_head_kv;
    const std::vector<int64_t> query_tokens = spread(n, std::min(n, std::max<int64_t>(1, kMaxQueryRows / group)));
    const Angles query_angles = angles_of(query_tokens, sample.pos, units);
    Mat queries(static_cast<Eigen::Index>(query_tokens.size()) * group, d);
    for (int g = 0; g < group; ++g) {
        queries.middleRows(g * static_cast<Eigen::Index>(query_tokens.size()),
                           static_cast<Eigen::Index>(query_tokens.size())) =
            unrotated_rows(sample.q, query_tokens, int64_t{sample.n_head_q} * d, int64_t{h * group + g} * d, units,
                           query_angles, d);
    }
    if (!keys.allFinite() || !queries.allFinite()) return std::nullopt;

    // Their moments at every position the cache will hold: c, Ck (the centred keys' covariance)
    // and Cq (the queries' second moment: a score's error is q . e whatever q's mean). The mean m
    // comes off the keys before their moment (it is most of each key), and goes back as
    // mean(R m m^T R^T) - c c^T, in double.
    const Vec mean = keys.colwise().mean().transpose().cast<double>();
    keys.rowwise() -= mean.transpose().cast<float>();
    const RotationMean over_positions(units, positions);
    const Vec center = over_positions.of_vector(mean);
    const Eigen::MatrixXd spread_of_mean =
        over_positions.of_moment(Eigen::MatrixXd(mean * mean.transpose())) - center * center.transpose();
    Mat ck = over_positions.of_moment(gram(keys)) + spread_of_mean.cast<float>();
    Mat cq = over_positions.of_moment(gram(queries));
    const float lambda = static_cast<float>(kShrinkRows / (kShrinkRows + static_cast<double>(n)));
    shrink_to_diagonal(ck, lambda);
    shrink_to_diagonal(cq, lambda);
    const float ck_trace = ck.trace(), cq_trace = cq.trace();
    if (!(ck_trace > 0.0f) || !(cq_trace > 0.0f)) return std::nullopt;
    ck.diagonal().array() += 1e-5f * ck_trace / static_cast<float>(d);
    cq.diagonal().array() += 1e-6f * cq_trace / static_cast<float>(d);

    // T^T T = P = L^-T W diag(w^kPower) W^T L^-1 with Ck = L L^T and L^T Cq L = W diag(w) W^T (the
    // same P as with Ck^1/2 in place of L); T is P's Cholesky factor, scaled so that the stored
    // values are as large as the keys'.
    const Eigen::LLT<Mat> ck_llt(ck);
    if (ck_llt.info() != Eigen::Success) return std::nullopt;
    const Mat l = ck_llt.matrixL();
    const Mat lt_cq = l.transpose().triangularView<Eigen::Upper>() * cq;
    const Mat b = lt_cq * l.triangularView<Eigen::Lower>();
    const Eigen::SelfAdjointEigenSolver<Mat> eig((b + b.transpose()) / 2);
    if (eig.info() != Eigen::Success) return std::nullopt;
    const Eigen::VectorXf w = eig.eigenvalues().cwiseMax(1e-7f * eig.eigenvalues().maxCoeff());
    const Mat g = l.transpose().triangularView<Eigen::Upper>().solve(
        eig.eigenvectors() * w.array().pow(static_cast<float>(kPower / 2)).matrix().asDiagonal());
    const Eigen::LLT<Mat> p_llt(gram(g.transpose()));  // G G^T / d: the scale of P does not matter
    if (p_llt.info() != Eigen::Success) return std::nullopt;
    Mat t = p_llt.matrixU();
    const Mat tl = t.triangularView<Eigen::Upper>() * l;  // ||T L||^2 = tr(T Ck T^T)
    t *= std::sqrt(ck_trace / tl.squaredNorm());

    // The scores' error metric in the stored frame, M = H T^-T Cq T^-1 H, and U with
    // U^T U = (M + damping)^-1 for the error feedback.
    const Mat y = t.transpose().triangularView<Eigen::Lower>().solve(cq);                   // T^-T Cq
    Mat m = t.transpose().triangularView<Eigen::Lower>().solve(y.transpose()).transpose();  // T^-T Cq T^-1
    m = (m + m.transpose()) / 2;
    if (rotate) hadamard_both_sides(m);
    m.diagonal().array() += static_cast<float>(kDamping) * m.trace() / static_cast<float>(d);
    // M = V V^T with V upper (Cholesky of M with its rows and columns reversed), so
    // (M + damping)^-1 = V^-T V^-1 and U = V^-1.
    const Mat reversed = m.reverse();
    const Eigen::LLT<Mat> m_llt(reversed);
    if (m_llt.info() != Eigen::Success) return std::nullopt;
    const Mat v = Mat(m_llt.matrixL()).reverse();
    const Mat u = v.triangularView<Eigen::Upper>().solve(Mat::Identity(d, d));
    if (!t.allFinite() || !u.allFinite() || !center.allFinite()) return std::nullopt;

    KeyTransform::Head head;
    head.center.resize(static_cast<size_t>(d));
    for (int i = 0; i < d; ++i) head.center[static_cast<size_t>(i)] = static_cast<float>(center(i));
    head.t_transposed = triangle(t.transpose(), /*upper=*/false);
    head.t_inverse = triangle(t.triangularView<Eigen::Upper>().solve(Mat::Identity(d, d)), /*upper=*/true);
    head.u = triangle(u, /*upper=*/true);
    return head;
}

std::vector<double> rotation_mean(const std::vector<double>& m, const RopeFrame& rope, int n_positions) {
    const auto d = static_cast<int>(m.size());
    const std::vector<Unit> units = units_of(rope, d);
    const Vec out = RotationMean(units, n_positions).of_vector(Eigen::Map<const Vec>(m.data(), d));
    return {out.data(), out.data() + d};
}

std::vector<double> rotation_mean_moment(const std::vector<double>& s, int d, const RopeFrame& rope, int n_positions) {
    using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const std::vector<Unit> units = units_of(rope, d);
    const RowMajor out =
        RotationMean(units, n_positions).of_moment(RowMajor(Eigen::Map<const RowMajor>(s.data(), d, d)));
    return {out.data(), out.data() + static_cast<size_t>(d) * static_cast<size_t>(d)};
}

size_t query_aware_fit_bytes(int d) {
    const auto n = static_cast<size_t>(d);
    // The key and query rows, and about a dozen d x d matrices alive at once (Eigen's solver included).
    return (static_cast<size_t>(kMaxKeyRows + kMaxQueryRows) * n + 12 * n * n) * sizeof(float) +
           2 * n * n * sizeof(double);
}

}  // namespace fitllm::kv
