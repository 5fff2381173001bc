// kv::KvCache's K/V rows (kv/cache.h): each head coded into the pool's types on the way in and
// back to floats on the way out, the K transform's calibration, and the RoPE shift of stored K.
// The cells, blocks and sequences the rows belong to are kv/cache.cpp's.
#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/cache_impl.h"
#include "kv/hadamard.h"
#include "quant/dequantize.h"
#include "quant/quantize.h"

namespace fitllm::kv {

using namespace cache_detail;

namespace {

// One head per row of `type`: shaped by `key` (K of a quantized cache, else nullptr) and rotated
// first when asked (into scratch, KeyTransform::kScratchRows * head_dim floats; the source stays as
// it is). The query-aware kind rotates and rounds by itself.
void write_heads(GgmlType type, const float* row, int n_head, int head_dim, size_t head_bytes, bool rotate,
                 const KeyTransform* key, float* scratch, std::byte* dst) {
    for (int h = 0; h < n_head; ++h) {
        const float* head = row + static_cast<int64_t>(h) * head_dim;
        if (key != nullptr && key->query_aware()) {
            key->encode(head, h, type, dst + static_cast<size_t>(h) * head_bytes, scratch);
            continue;
        }
        if (key != nullptr && key->active()) {
            key->apply(head, h, head_dim, scratch);
            head = scratch;
        }
        if (rotate) {
            if (head != scratch) std::copy(head, head + head_dim, scratch);
            hadamard_transform(scratch, head_dim);
            head = scratch;
        }
        quant::quantize_row(type, head, dst + static_cast<size_t>(h) * head_bytes, head_dim);
    }
}

void read_heads(GgmlType type, const std::byte* src, int n_head, int head_dim, size_t head_bytes, bool rotated,
                const KeyTransform* key, float* row) {
    for (int h = 0; h < n_head; ++h) {
        float* head = row + static_cast<int64_t>(h) * head_dim;
        if (key != nullptr && key->query_aware()) {
            key->decode(src + static_cast<size_t>(h) * head_bytes, h, type, head);
            continue;
        }
        quant::dequantize_row(type, src + static_cast<size_t>(h) * head_bytes, head, head_dim);
        if (rotated) hadamard_transform(head, head_dim);  // its own inverse
        if (key != nullptr) key->undo(head, h, head_dim);
    }
}

}  // namespace

size_t KvCache::key_transform_bytes(const std::vector<LayerShape>& shapes, const CacheParams& p) {
    if (!p.rotate || !is_quantized(p.type_k) || shapes.empty()) return 0;
    const bool query_aware = keys_fit_queries(p.type_k);
    size_t n = 0;
    int widest = 0;
    for (const LayerShape& shape : shapes) {
        const int n_head_q = query_aware ? (shape.n_head_q > 0 ? shape.n_head_q : shape.n_head_kv) : 0;
        const auto head = static_cast<size_t>(shape.n_head_kv) * static_cast<size_t>(shape.head_dim_k);
        const auto rows = static_cast<size_t>(kMinKeyRows - 1);  // K (and Q) kept until the fit
        n += (query_aware ? KeyTransform::bytes_for(shape.n_head_kv, shape.head_dim_k) : 3 * head * sizeof(float)) +
             rows * (static_cast<size_t>(shape.n_head_kv + n_head_q) * static_cast<size_t>(shape.head_dim_k) *
                         sizeof(float) +
                     2 * sizeof(int32_t));
        widest = std::max(widest, shape.head_dim_k);
    }
    return n + (query_aware && p.charge_key_fit ? query_aware_fit_bytes(widest) : 0);  // one fit at a time
}

bool KvCache::needs_key_calibration(int layer) const {
    const Impl& m = *impl_;
    m.check_layer(layer, "needs_key_calibration");
    return m.shape_keys && !m.layers[static_cast<size_t>(layer)].key_fitted;
}

void KvCache::limit_key_transform() {
    impl_->limit_keys = true;
}

bool KvCache::key_transform_limited() const {
    return impl_->limit_keys;
}

const KeyTransform* KvCache::key_transform(int layer) const {
    const Impl& m = *impl_;
    m.check_layer(layer, "key_transform");
    const LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    return m.shape_keys && L.key_fitted ? &L.key : nullptr;
}

bool KvCache::accepts_key_transform(int layer, const KeyTransform& key) const {
    const Impl& m = *impl_;
    m.check_layer(layer, "accepts_key_transform");
    const LayerShape& s = m.layers[static_cast<size_t>(layer)].shape;
    switch (key.kind()) {
        case KeyTransform::Kind::Identity:
            return s.head_dim_k % 4 != 0;
        case KeyTransform::Kind::Diagonal:
            return key.n_head_kv() == s.n_head_kv && key.head_dim() == s.head_dim_k;
        case KeyTransform::Kind::QueryAware:
            return key.n_head_kv() == s.n_head_kv && key.head_dim() == s.head_dim_k &&
                   keys_fit_queries(m.params.type_k) && !m.limit_keys && !m.params.external_storage;
    }
    return false;
}

void KvCache::set_key_transform(int layer, KeyTransform key) {
    Impl& m = *impl_;
    m.check_layer(layer, "set_key_transform");
    LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    if (!m.shape_keys || m.params.external_storage || L.key_fitted || L.stored_unshaped || L.staged.rows() > 0) {
        throw std::logic_error("KvCache::set_key_transform: layer " + std::to_string(layer) +
                               " does not shape K on the host, or has fitted or stored K already");
    }
    if (!accepts_key_transform(layer, key)) {
        throw std::logic_error("KvCache::set_key_transform: the transform does not fit layer " + std::to_string(layer));
    }
    L.key = std::move(key);
    L.key_fitted = true;
    L.key_given = true;
    L.staged = LayerStorage::Staged{};
}

void KvCache::forget_fitted_key_transforms() {
    Impl& m = *impl_;
    if (m.n_used != 0) throw std::logic_error("KvCache::forget_fitted_key_transforms: the cache holds cells");
    if (!m.shape_keys || m.params.external_storage) return;
    for (LayerStorage& L : m.layers) {
        if (L.key_given) continue;
        L.key = KeyTransform{};
        L.key_fitted = false;
        L.stored_unshaped = false;  // nothing is stored
        L.staged = LayerStorage::Staged{};
    }
}

void KvCache::calibrate_keys(int layer, const KeySample& sample) {
    Impl& m = *impl_;
    m.check_layer(layer, "calibrate_keys");
    LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    if (!m.shape_keys || L.key_fitted || sample.n_rows <= 0) return;
    const LayerShape& s = L.shape;
    if (m.params.external_storage) {
        // The device stores K itself, shaped from its first batch on: fit from that batch or never.
        L.key_fitted = true;
        if (sample.n_rows >= kMinKeyRows) L.key.calibrate_diagonal(sample.k, sample.n_rows, s.n_head_kv, s.head_dim_k);
        return;
    }
    const int n_head_q = sample.q != nullptr ? sample.n_head_q : 0;
    const int64_t k_row = int64_t{s.n_head_kv} * s.head_dim_k;
    const int64_t q_row = int64_t{n_head_q} * s.head_dim_k;
    LayerStorage::Staged& st = L.staged;
    const bool with_q = !m.limit_keys && st.all_q && sample.q != nullptr &&
                        (st.rows() == 0 || st.q.size() == static_cast<size_t>(st.rows() * q_row));
    const int64_t n = st.rows() + sample.n_rows;
    if (n < kMinKeyRows) {  // too few rows yet: keep them (store() records their cells)
        st.k.insert(st.k.end(), sample.k, sample.k + sample.n_rows * k_row);
        if (with_q) st.q.insert(st.q.end(), sample.q, sample.q + sample.n_rows * q_row);
        st.all_q = with_q;
        if (sample.pos != nullptr) {
            st.pos.insert(st.pos.end(), sample.pos, sample.pos + sample.n_rows);
        } else {
            st.pos.insert(st.pos.end(), static_cast<size_t>(sample.n_rows), Pos{0});  // only the Q fit reads them
        }
        st.cell.insert(st.cell.end(), static_cast<size_t>(sample.n_rows), int32_t{-1});
        st.pending = static_cast<int>(sample.n_rows);
        return;
    }
    KeySample all = sample;
    std::vector<float> k_all, q_all;
    std::vector<int32_t> pos_all;
    if (st.rows() > 0) {  // the kept rows first, then this batch's
        k_all = st.k;
        k_all.insert(k_all.end(), sample.k, sample.k + sample.n_rows * k_row);
        pos_all = st.pos;
        if (sample.pos != nullptr) pos_all.insert(pos_all.end(), sample.pos, sample.pos + sample.n_rows);
        pos_all.resize(static_cast<size_t>(n), Pos{0});
        if (with_q) {
            q_all = st.q;
            q_all.insert(q_all.end(), sample.q, sample.q + sample.n_rows * q_row);
        }
        all.k = k_all.data();
        all.q = with_q ? q_all.data() : nullptr;
        all.pos = pos_all.data();
        all.n_rows = n;
    }
    if (with_q) {  // (false after limit_key_transform() and for q8_0 K)
        L.key.calibrate(all, s.n_head_kv, s.head_dim_k, m.n_positions);
    } else {
        L.key.calibrate_diagonal(all.k, all.n_rows, s.n_head_kv, s.head_dim_k);
    }
    L.key_fitted = true;
    if (L.stored_unshaped) m.store_shaped_again(layer);
    st = LayerStorage::Staged{};  // gives its memory back
}

void KvCache::Impl::store_shaped_again(int layer) {
    LayerStorage& L = layers[static_cast<size_t>(layer)];
    const LayerShape& s = L.shape;
    const int64_t k_row = int64_t{s.n_head_kv} * s.head_dim_k;
    float* row = shift_rows.data();
    for (int32_t c = 0; c < capacity; ++c) {
        if (cell_free(c)) continue;
        std::byte* dst = L.k + static_cast<size_t>(c) * L.k_row_bytes;
        const auto kept = std::find(L.staged.cell.rbegin(), L.staged.cell.rend(), c);
        if (kept != L.staged.cell.rend()) {
            const auto r = static_cast<int64_t>(L.staged.cell.rend() - kept) - 1;
            std::copy(L.staged.k.begin() + r * k_row, L.staged.k.begin() + (r + 1) * k_row, row);
        } else {
            read_heads(params.type_k, dst, s.n_head_kv, s.head_dim_k, L.k_head_bytes, rotated, nullptr, row);
        }
        write_heads(params.type_k, row, s.n_head_kv, s.head_dim_k, L.k_head_bytes, rotated, &L.key, L.scratch.data(),
                    dst);
    }
    L.stored_unshaped = false;
    in_memory[static_cast<size_t>(layer)] = 1;
}

void KvCache::store(int layer, std::span<const int32_t> cells, const float* k, const float* v) {
    Impl& m = *impl_;
    m.check_layer(layer, "store");
    m.check_storage("store");
    LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    const LayerShape& s = L.shape;
    const int64_t k_row = int64_t{s.n_head_kv} * s.head_dim_k;
    const int64_t v_row = int64_t{s.n_head_kv} * s.head_dim_v;
    const KeyTransform* key = m.shape_keys ? &L.key : nullptr;
    if (m.shape_keys && !L.key_fitted && !cells.empty()) {
        // Stored unshaped for now; calibrate_keys() stores these cells again once it has fitted.
        L.stored_unshaped = true;
        LayerStorage::Staged& st = L.staged;
        for (int32_t c : cells) st.forget_cell(c);
        if (static_cast<size_t>(st.pending) == cells.size()) {
            std::copy(cells.begin(), cells.end(), st.cell.end() - st.pending);
        }
        st.pending = 0;
    }
    for (int32_t cell : cells) m.check_cell(cell, "store");
    if (key != nullptr && key->query_aware()) {
        // K kv head by kv head, KeyTransform::kRows rows at a time (they share its reads of T and U).
        std::array<const float*, KeyTransform::kRows> heads{};
        std::array<std::byte*, KeyTransform::kRows> dst{};
        for (size_t i0 = 0; i0 < cells.size(); i0 += KeyTransform::kRows) {
            const int n = static_cast<int>(std::min<size_t>(KeyTransform::kRows, cells.size() - i0));
            for (int h = 0; h < s.n_head_kv; ++h) {
                for (int r = 0; r < n; ++r) {
                    const size_t i = i0 + static_cast<size_t>(r);
                    heads[static_cast<size_t>(r)] = k + static_cast<int64_t>(i) * k_row + int64_t{h} * s.head_dim_k;
                    dst[static_cast<size_t>(r)] =
                        L.k + static_cast<size_t>(cells[i]) * L.k_row_bytes + static_cast<size_t>(h) * L.k_head_bytes;
                }
                key->encode(heads.data(), n, h, m.params.type_k, dst.data(), L.scratch.data());
            }
        }
    }
    for (size_t i = 0; i < cells.size(); ++i) {
        const int32_t cell = cells[i];
        const auto row = static_cast<int64_t>(i);
        if (key == nullptr || !key->query_aware()) {
            write_heads(m.params.type_k, k + row * k_row, s.n_head_kv, s.head_dim_k, L.k_head_bytes, m.rotated, key,
                        L.scratch.data(), L.k + static_cast<size_t>(cell) * L.k_row_bytes);
        }
        write_heads(m.params.type_v, v + row * v_row, s.n_head_kv, s.head_dim_v, L.v_head_bytes, m.rotated, nullptr,
                    L.scratch.data(), L.v + static_cast<size_t>(cell) * L.v_row_bytes);
    }
    if (!cells.empty()) m.in_memory[static_cast<size_t>(layer)] = 1;
}

// Reads K of the shifted cells back to floats kShiftChunk at a time, lets fn re-rotate them and
// stores them again.
void KvCache::for_shifted_cells(int layer, void (*fn)(void*, float*, const int32_t*, int), void* ctx) {
    Impl& m = *impl_;
    m.check_layer(layer, "apply_k_shift");
    if (!m.has_shift) return;
    m.check_storage("apply_k_shift");
    LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    const LayerShape& s = L.shape;
    const int64_t row = int64_t{s.n_head_kv} * s.head_dim_k;
    int n = 0;
    auto flush = [&] {
        fn(ctx, m.shift_rows.data(), m.shift_deltas.data(), n);
        for (int i = 0; i < n; ++i) {
            write_heads(m.params.type_k, m.shift_rows.data() + i * row, s.n_head_kv, s.head_dim_k, L.k_head_bytes,
                        m.rotated, m.shape_keys ? &L.key : nullptr, L.scratch.data(),
                        L.k + static_cast<size_t>(m.shift_cells[static_cast<size_t>(i)]) * L.k_row_bytes);
        }
        n = 0;
    };
    for (int32_t c = 0; c < m.capacity; ++c) {
        const Pos delta = m.shift[static_cast<size_t>(c)];
        if (m.cell_free(c) || delta == 0) continue;
        L.staged.forget_cell(c);  // its K changes
        read_heads(m.params.type_k, L.k + static_cast<size_t>(c) * L.k_row_bytes, s.n_head_kv, s.head_dim_k,
                   L.k_head_bytes, m.rotated, m.shape_keys ? &L.key : nullptr, m.shift_rows.data() + n * row);
        m.shift_cells[static_cast<size_t>(n)] = c;
        m.shift_deltas[static_cast<size_t>(n)] = delta;
        if (++n == kShiftChunk) flush();
    }
    if (n > 0) flush();
    // A shift may touch every row of the layer: a streamed one leaves memory right away.
    if (L.streamed) m.release_layer(layer);
}

KvCache::LayerView KvCache::layer_view(int layer) const {
    const Impl& m = *impl_;
    m.check_layer(layer, "layer_view");
    const LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    return LayerView{.type_k = m.params.type_k,
                     .type_v = m.params.type_v,
                     .n_head_kv = L.shape.n_head_kv,
                     .head_dim_k = L.shape.head_dim_k,
                     .head_dim_v = L.shape.head_dim_v,
                     .rotated = m.rotated,
                     .key = m.shape_keys && L.key.query_aware() ? &L.key : nullptr,
                     .q_scale = m.shape_keys ? L.key.q_scale() : nullptr,
                     .k_center = m.shape_keys ? L.key.center() : nullptr,
                     .k_scale = m.shape_keys ? L.key.scale() : nullptr,
                     .k = L.k,
                     .v = L.v,
                     .k_row_bytes = L.k_row_bytes,
                     .k_head_bytes = L.k_head_bytes,
                     .v_row_bytes = L.v_row_bytes,
                     .v_head_bytes = L.v_head_bytes};
}

size_t KvCache::cell_bytes() const {
    size_t bytes = 0;
    for (const LayerStorage& L : impl_->layers) bytes += L.k_row_bytes + L.v_row_bytes;
    return bytes;
}

bool KvCache::rows_stable() const {
    const Impl& m = *impl_;
    if (m.params.external_storage) return false;
    return std::all_of(m.layers.begin(), m.layers.end(),
                       [&](const LayerStorage& L) { return !m.shape_keys || (L.key_fitted && !L.stored_unshaped); });
}

void KvCache::copy_rows_out(std::span<const int32_t> cells, std::byte* out) const {
    const Impl& m = *impl_;
    m.check_storage("copy_rows_out");
    for (const int32_t c : cells) {
        m.check_cell(c, "copy_rows_out");
        for (const LayerStorage& L : m.layers) {
            out = std::copy_n(L.k + static_cast<size_t>(c) * L.k_row_bytes, L.k_row_bytes, out);
            out = std::copy_n(L.v + static_cast<size_t>(c) * L.v_row_bytes, L.v_row_bytes, out);
        }
    }
}

void KvCache::copy_rows_in(std::span<const int32_t> cells, const std::byte* in) {
    Impl& m = *impl_;
    m.check_storage("copy_rows_in");
    for (const int32_t c : cells) {
        m.check_cell(c, "copy_rows_in");
        for (size_t l = 0; l < m.layers.size(); ++l) {
            LayerStorage& L = m.layers[l];
            std::copy_n(in, L.k_row_bytes, L.k + static_cast<size_t>(c) * L.k_row_bytes);
            in += L.k_row_bytes;
            std::copy_n(in, L.v_row_bytes, L.v + static_cast<size_t>(c) * L.v_row_bytes);
            in += L.v_row_bytes;
            L.staged.forget_cell(c);  // what calibration kept for this cell is not what it holds now
            m.in_memory[l] = 1;
        }
    }
}

void KvCache::read_k(int layer, int32_t cell, float* out) const {
    const Impl& m = *impl_;
    m.check_layer(layer, "read_k");
    m.check_cell(cell, "read_k");
    m.check_storage("read_k");
    const LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    read_heads(m.params.type_k, L.k + static_cast<size_t>(cell) * L.k_row_bytes, L.shape.n_head_kv, L.shape.head_dim_k,
               L.k_head_bytes, m.rotated, m.shape_keys ? &L.key : nullptr, out);
}

void KvCache::read_v(int layer, int32_t cell, float* out) const {
    const Impl& m = *impl_;
    m.check_layer(layer, "read_v");
    m.check_cell(cell, "read_v");
    m.check_storage("read_v");
    const LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    read_heads(m.params.type_v, L.v + static_cast<size_t>(cell) * L.v_row_bytes, L.shape.n_head_kv, L.shape.head_dim_v,
               L.v_head_bytes, m.rotated, nullptr, out);
}

}  // namespace fitllm::kv
