#include "ops/attention_kv.h"

#include <immintrin.h>

// GCC 12 warns about the deliberately undefined pass-through operands inside its own AVX-512
// intrinsics (_mm512_undefined_*) once they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>

#include "kv/hadamard.h"
#include "ops/attention_f16_kernel.h"
#include "ops/attention_f16_tiled_kernel.h"
#include "quant/blocks.h"
#include "quant/dequantize.h"
#include "quant/dot.h"
#include "quant/quantize.h"

namespace fitllm::ops {
namespace {

namespace fa = f16_attention;
using quant::GgmlType;

constexpr int kMaxQueries = fa::kMaxQueries;  // queries (tokens x heads of one kv group) per work item
constexpr int kTiledRows = 32;                // queries per work item of the tiled kernel
constexpr int kTile = 64;                     // visible cells scored per step of the online softmax
constexpr float kMasked = -std::numeric_limits<float>::infinity();

// Up to kTile visible cells of one sequence: which tokens of the work item see each (bit t).
// slot: the cell's place among the tile's kTile cells of the sequence (visible or not).
struct Tile {
    int32_t cell[kTile];
    int32_t pos[kTile];
    uint32_t mask[kTile];
    uint8_t slot[kTile];
    int n;
};

// Walks a sequence's block table and hands out its cells that some token of a work item sees, a
// tile at a time. Tiles end after every kTile cells of the sequence, visible or not, or with
// by_position, where the position / kTile changes (slot: position % kTile) or a position does not
// follow the tile's last one: the tiles of llama.cpp's cache, whose cells are a single sequence's
// positions in order. Either way which cells share a tile (and so each query's rounding) depends
// on the sequence and the query only, not on the other tokens of the item or batch: a sequence
// decoded in a batch gives the same bits as decoded alone. A block none of whose cells the item's
// tokens can see (all after the last token's position, or all before the first token's window) is
// passed over after one scan of its positions, counted but not tested cell by cell.
class VisibleCells {
public:
    VisibleCells(const kv::KvCache& cache, kv::SeqId seq, const int32_t* token_pos, int n_tokens, int window,
                 bool by_position = false)
        : by_position_(by_position),
          blocks_(cache.seq_blocks(seq)),
          positions_(cache.cell_positions()),
          seq_masks_(cache.cell_seq_masks()),
          seq_bit_(uint64_t{1} << seq),
          block_size_(cache.params().block_size),
          token_pos_(token_pos),
          n_tokens_(n_tokens),
          window_(window) {
        max_pos_ = *std::max_element(token_pos, token_pos + n_tokens);
        min_pos_ = *std::min_element(token_pos, token_pos + n_tokens);
        all_tokens_ = n_tokens >= 32 ? ~0u : (uint32_t{1} << n_tokens) - 1;
        // Cells at or after `oldest` are in every token's window.
        oldest_ = window > 0 ? static_cast<int64_t>(max_pos_) - window + 1 : std::numeric_limits<int64_t>::min();
        // Cells before `first_seen` are in no token's window.
        first_seen_ = window > 0 ? static_cast<int64_t>(min_pos_) - window + 1 : std::numeric_limits<int64_t>::min();
    }

    // Fills `tile` with the next visible cells; false once there are none.
    bool next(Tile& tile) {
        tile.n = 0;
        const auto capacity = static_cast<int32_t>(positions_.size());
        while (block_ < blocks_.size()) {
            const int32_t begin = blocks_[block_] * block_size_;
            const int32_t end = std::min(begin + block_size_, capacity);
            if (offset_ == 0) {
                int32_t n_cells = 0;
                if (!may_see(begin, end, n_cells)) {
                    const int64_t before = seen_;
                    seen_ += n_cells;
                    ++block_;
                    if (tile.n > 0 && !by_position_ && seen_ / kTile != before / kTile) return true;
                    continue;
                }
            }
            for (int32_t c = begin + offset_; c < end; ++c) {
                if (!(seq_masks_[c] & seq_bit_)) continue;
                const bool tile_ends = ++seen_ % kTile == 0;
                const kv::Pos pos = positions_[c];
                if (pos <= max_pos_ && pos >= first_seen_) {
                    uint32_t mask = all_tokens_;
                    if (pos > min_pos_ || pos < oldest_) {  // some token does not see it
                        mask = 0;
                        for (int t = 0; t < n_tokens_; ++t) {
                            mask |= static_cast<uint32_t>(fa::visible(pos, token_pos_[t], window_)) << t;
                        }
                    }
                    if (mask != 0) {
                        int slot = static_cast<int>((seen_ - 1) % kTile);
                        if (by_position_) {
                            const int64_t tile_id =
                                pos >= 0 ? pos / kTile : (static_cast<int64_t>(pos) - kTile + 1) / kTile;
                            slot = static_cast<int>(pos - tile_id * kTile);
                            if (tile.n > 0 && (tile_id != tile_id_ || slot <= tile.slot[tile.n - 1])) {
                                offset_ = c - begin;  // this cell starts the next tile
                                --seen_;
                                return true;
                            }
                            tile_id_ = tile_id;
                        }
                        tile.cell[tile.n] = c;
                        tile.pos[tile.n] = pos;
                        tile.mask[tile.n] = mask;
                        tile.slot[tile.n] = static_cast<uint8_t>(slot);
                        ++tile.n;
                    }
                }
                if (tile_ends && tile.n > 0 && !by_position_) {
                    offset_ = c + 1 - begin;
                    return true;
                }
            }
            ++block_;
            offset_ = 0;
        }
        return tile.n > 0;
    }

private:
    // Whether a token may see a cell of the sequence in [begin, end); n_cells: the sequence's cells.
    bool may_see(int32_t begin, int32_t end, int32_t& n_cells) const {
        kv::Pos lo = std::numeric_limits<kv::Pos>::max(), hi = std::numeric_limits<kv::Pos>::min();
        int32_t n = 0;
        for (int32_t c = begin; c < end; ++c) {
            const bool in = (seq_masks_[c] & seq_bit_) != 0;
            n += in;
            lo = in ? std::min(lo, positions_[c]) : lo;
            hi = in ? std::max(hi, positions_[c]) : hi;
        }
        n_cells = n;
        return n > 0 && lo <= max_pos_ && hi >= first_seen_;
    }

    bool by_position_;
    int64_t tile_id_ = 0;  // by_position: the position / kTile of the tile being filled
    std::span<const int32_t> blocks_;
    std::span<const kv::Pos> positions_;
    std::span<const uint64_t> seq_masks_;
    uint64_t seq_bit_;
    int32_t block_size_;
    const int32_t* token_pos_;
    int n_tokens_, window_;
    kv::Pos max_pos_, min_pos_;
    uint32_t all_tokens_;
    int64_t oldest_, first_seen_;
    int64_t seen_ = 0;  // cells of the sequence walked so far
    size_t block_ = 0;
    int32_t offset_ = 0;  // next cell inside blocks_[block_]
};

// Everything a work item needs; built once per call.
struct Plan {
    const float* q;
    const int32_t* q_pos;
    const kv::SeqId* q_seq;
    float* out;
    const kv::KvCache* cache;
    kv::KvCache::LayerView view;
    AttentionParams p;
    int64_t d, token_stride;
    int group;                   // query heads per kv head
    int heads;                   // query heads per work item (a divisor of group)
    int64_t head_blocks;         // n_head / heads
    int64_t n_blocks;            // token blocks
    const int32_t* order;        // token indices grouped by sequence
    const int32_t* block_begin;  // token block b is order[block_begin[b] .. block_begin[b + 1])
    // The generic path.
    quant::DotFn dot = nullptr;  // nullptr: K rows are dequantized and dotted in f32
    GgmlType act_type = GgmlType::F32;
    size_t act_row_bytes = 0;
    int64_t per_thread_floats = 0;
    const f16_attention::BlockKernel* f16_kernel = nullptr;  // K and V f16, head_dim % 32 == 0, AVX2+
    // llama.cpp's tiled flash attention (attention_f16_tiled_kernel.h) for the sequences of
    // exact_seq; nullptr where the K/V types are not its.
    fa_tiled::TileFn exact_tile = nullptr;
    bool exact_seq[kv::kMaxSequences];
    bool f16c = false;  // the CPU converts halves (F16C)
};

// The layout of one thread's working memory, in floats.
struct ThreadBuffers {
    float* q;        // [kMaxQueries][d]: rotated queries (or f16 state: q16 then acc)
    float* acc;      // [kMaxQueries][d]
    std::byte* act;  // [kMaxQueries][act_row_bytes] (room for d floats each)
    float* scores;   // [kMaxQueries][kTile]
    float* k_row;    // [d]
    float* v_row;    // [d]
    Tile* tile;

    static int64_t floats(int64_t d) {
        const int64_t tile_floats = (static_cast<int64_t>(sizeof(Tile)) + 3) / 4;
        const int64_t n = 3 * kMaxQueries * d + kMaxQueries * kTile + 2 * d + tile_floats;
        return (n + 15) / 16 * 16;  // whole cache lines, so threads never share one
    }
    ThreadBuffers(float* base, int64_t d)
        : q(base),
          acc(q + kMaxQueries * d),
          act(reinterpret_cast<std::byte*>(acc + kMaxQueries * d)),
          scores(reinterpret_cast<float*>(act) + kMaxQueries * d),
          k_row(scores + kMaxQueries * kTile),
          v_row(k_row + d),
          tile(reinterpret_cast<Tile*>(v_row + d)) {}
};

// The tiled kernel's working memory (attention_kv_tiled.inc), in floats.
struct TiledBuffers {
    float* qt;      // [d][kTiledRows]: the queries, transposed
    float* acc;     // [kTiledRows][d]
    float* k;       // [kTile][d]: a tile's K rows as floats
    float* v;       // [kTile][d]
    float* scores;  // [kTile][kTiledRows]
    Tile* tile;

    static int64_t floats(int64_t d) {
        const int64_t tile_floats = (static_cast<int64_t>(sizeof(Tile)) + 3) / 4;
        const int64_t n = 2 * kTiledRows * d + 2 * kTile * d + kTile * kTiledRows + tile_floats;
        return (n + 15) / 16 * 16;  // whole cache lines, so threads never share one
    }
    TiledBuffers(float* base, int64_t d)
        : qt(base),
          acc(qt + kTiledRows * d),
          k(acc + kTiledRows * d),
          v(k + kTile * d),
          scores(v + kTile * d),
          tile(reinterpret_cast<Tile*>(scores + kTile * kTiledRows)) {}
};

// The work item `task`: its sequence, tokens (t = 0 .. n_tokens - 1 are order[first + t]) and heads.
struct Item {
    kv::SeqId seq;
    const int32_t* tokens;
    int n_tokens;
    int64_t h0;  // first query head
    int64_t g;   // kv head
    int32_t pos[kTiledRows];
};

// Under a causal mask a token's cost grows with its position. Tasks go out in the order first
// block, last block, second block, second to last, ..., so that any run of consecutive tasks
// (what the pool hands a thread at a time) carries about the same work.
int64_t block_of(const Plan& pl, int64_t task) {
    const int64_t o = task / pl.head_blocks;
    return o % 2 == 0 ? o / 2 : pl.n_blocks - 1 - o / 2;
}
Item item_of(const Plan& pl, int64_t task) {
    const int64_t b = block_of(pl, task);
    Item it;
    it.tokens = pl.order + pl.block_begin[b];
    it.n_tokens = pl.block_begin[b + 1] - pl.block_begin[b];
    it.seq = pl.q_seq[it.tokens[0]];
    it.h0 = task % pl.head_blocks * pl.heads;
    it.g = it.h0 / pl.group;
    for (int t = 0; t < it.n_tokens; ++t) it.pos[t] = pl.q_pos[it.tokens[t]];
    return it;
}

// Query r of an item is token r / heads, head h0 + r % heads.
const float* q_row(const Plan& pl, const Item& it, int r) {
    return pl.q + it.tokens[r / pl.heads] * pl.token_stride + (it.h0 + r % pl.heads) * pl.d;
}
float* out_row(const Plan& pl, const Item& it, int r) {
    return pl.out + it.tokens[r / pl.heads] * pl.token_stride + (it.h0 + r % pl.heads) * pl.d;
}

// Query r of the item as the stored keys want it (kv/key_transform.h): through the query-aware
// transform, or multiplied by the kv head's q_scale (the diagonal kind) and then rotated when the
// layer is stored rotated, into dst (d floats); the query row itself when none of these.
const float* shaped_query(const Plan& pl, const Item& it, int r, float* dst) {
    const float* src = q_row(pl, it, r);
    if (pl.view.key != nullptr) {  // the query-aware kind: H T^-T q, rotation included
        pl.view.key->shape_query(src, it.g, dst);
        return dst;
    }
    if (pl.view.q_scale == nullptr && !pl.view.rotated) return src;
    if (pl.view.q_scale != nullptr) {
        const float* s = pl.view.q_scale + it.g * pl.d;
        for (int64_t i = 0; i < pl.d; ++i) dst[i] = src[i] * s[i];
    } else {
        std::copy(src, src + pl.d, dst);
    }
    if (pl.view.rotated) kv::hadamard_transform(dst, static_cast<int>(pl.d));
    return dst;
}

// What centred keys (kv/key_transform.h) take off query r's scores: q . c times the scale. Only
// soft-capping needs it back (the softmax cancels it); 0 when K is not centred.
float center_bias(const Plan& pl, const Item& it, int r) {
    if (pl.view.k_center == nullptr) return 0.0f;
    const float* q = q_row(pl, it, r);
    const float* c = pl.view.k_center + it.g * pl.d;
    float dot = 0.0f;
    for (int64_t i = 0; i < pl.d; ++i) dot += q[i] * c[i];
    return dot * pl.p.scale;
}

// The item's queries' attention sinks (AttentionParams::sinks, query r's head's in row_sinks[r]),
// in the frame of the scores the kernels compute: centred keys take q . c times the scale off every
// score of a query (center_bias), so off its sink too. nullptr when the layer has no sinks.
const float* item_sinks(const Plan& pl, const Item& it, float* row_sinks) {
    if (pl.p.sinks == nullptr) return nullptr;
    const int n_queries = it.n_tokens * pl.heads;
    for (int r = 0; r < n_queries; ++r) row_sinks[r] = pl.p.sinks[it.h0 + r % pl.heads] - center_bias(pl, it, r);
    return row_sinks;
}

// The query-aware kind (kv/key_transform.h): the item's query rows, gathered into tmp, shaped into
// out (row r at r * d), all at once (the transform is read once for several rows).
void shape_all_queries(const Plan& pl, const Item& it, float* tmp, float* out) {
    const int n_queries = it.n_tokens * pl.heads;
    for (int r = 0; r < n_queries; ++r) {
        const float* q = q_row(pl, it, r);
        std::copy(q, q + pl.d, tmp + r * pl.d);
    }
    pl.view.key->shape_queries(tmp, n_queries, it.g, out);
}

// The item's query rows, shaped into buf (shaped_query).
void prepare_queries(const Plan& pl, const Item& it, float* buf, const float** rows) {
    const int n_queries = it.n_tokens * pl.heads;
    for (int r = 0; r < n_queries; ++r) rows[r] = shaped_query(pl, it, r, buf + r * pl.d);
}

void finish_outputs(const Plan& pl, const Item& it) {
    if (!pl.view.rotated) return;
    const int n_queries = it.n_tokens * pl.heads;
    for (int r = 0; r < n_queries; ++r) kv::hadamard_transform(out_row(pl, it, r), static_cast<int>(pl.d));
}

// Active query rows of a cell seen by the tokens of `mask`.
[[gnu::always_inline]] inline int rows_of(uint32_t mask, int n_tokens, int heads, int* rows) {
    int n = 0;
    for (int t = 0; t < n_tokens; ++t) {
        if (!(mask >> t & 1u)) continue;
        for (int h = 0; h < heads; ++h) rows[n++] = t * heads + h;
    }
    return n;
}

const std::byte* k_head(const Plan& pl, int32_t cell, int64_t g) {
    return pl.view.k + static_cast<size_t>(cell) * pl.view.k_row_bytes + static_cast<size_t>(g) * pl.view.k_head_bytes;
}
const std::byte* v_head(const Plan& pl, int32_t cell, int64_t g) {
    return pl.view.v + static_cast<size_t>(cell) * pl.view.v_row_bytes + static_cast<size_t>(g) * pl.view.v_head_bytes;
}

// ---- K and V f16 without AVX2: llama.cpp's f16 arithmetic (attention_f16_kernel.h) ------------

// attention_f16's blocked kernel (AVX-512 or AVX2), fed a tile of f16 rows at a time.
void item_f16_blocked(const Plan& pl, int64_t task, float* base) {
    const Item it = item_of(pl, task);
    const ThreadBuffers buf(base, pl.d);
    const int d = static_cast<int>(pl.d);
    const int n_queries = it.n_tokens * pl.heads;
    const float* q_rows[kMaxQueries];
    prepare_queries(pl, it, reinterpret_cast<float*>(buf.act), q_rows);
    const fa::BlockKernel& kernel = *pl.f16_kernel;
    fa::BlockState st;
    st.q16 = buf.q;
    st.acc = reinterpret_cast<uint16_t*>(buf.q + kMaxQueries * pl.d);
    kernel.begin(st, q_rows, n_queries, d);
    VisibleCells cells(*pl.cache, it.seq, it.pos, it.n_tokens, pl.p.sliding_window);
    Tile& tile = *buf.tile;
    const uint16_t* k_rows[kTile];
    const uint16_t* v_rows[kTile];
    while (cells.next(tile)) {
        for (int j = 0; j < tile.n; ++j) {
            k_rows[j] = reinterpret_cast<const uint16_t*>(k_head(pl, tile.cell[j], it.g));
            v_rows[j] = reinterpret_cast<const uint16_t*>(v_head(pl, tile.cell[j], it.g));
        }
        kernel.keys(st, tile.n, k_rows, v_rows, tile.mask, it.n_tokens, pl.heads, pl.p);
    }
    float* out_rows[kMaxQueries];
    for (int r = 0; r < n_queries; ++r) out_rows[r] = out_row(pl, it, r);
    float row_sinks[kMaxQueries];
    kernel.end(st, out_rows, n_queries, d, item_sinks(pl, it, row_sinks));
    finish_outputs(pl, it);
}

// One query at a time (the one-query kernels of attention_f16, the dot in the order of ggml's
// kLanes-lane build): each K and V row is converted to floats (exactly) once for the item's queries.
template <bool kFma, int kLanes>
[[gnu::always_inline]] inline void item_f16_one_impl(const Plan& pl, int64_t task, float* base) {
    const Item it = item_of(pl, task);
    const ThreadBuffers buf(base, pl.d);
    const int d = static_cast<int>(pl.d);
    const int n_queries = it.n_tokens * pl.heads;
    const float* q_rows[kMaxQueries];
    prepare_queries(pl, it, reinterpret_cast<float*>(buf.act), q_rows);
    fa::OneState st[kMaxQueries];
    for (int r = 0; r < n_queries; ++r) {
        st[r].q16 = buf.q + r * pl.d;
        st[r].acc = buf.acc + r * pl.d;
        fa::begin_one(st[r], q_rows[r], d);
    }
    VisibleCells cells(*pl.cache, it.seq, it.pos, it.n_tokens, pl.p.sliding_window);
    Tile& tile = *buf.tile;
    while (cells.next(tile)) {
        for (int j = 0; j < tile.n; ++j) {
            const auto* kj = reinterpret_cast<const uint16_t*>(k_head(pl, tile.cell[j], it.g));
            const auto* vj = reinterpret_cast<const uint16_t*>(v_head(pl, tile.cell[j], it.g));
            for (int i = 0; i < d; ++i) buf.k_row[i] = fa::half_to_float(kj[i]);
            for (int i = 0; i < d; ++i) buf.v_row[i] = fa::half_to_float(vj[i]);
            int rows[kMaxQueries];
            const int n_active = rows_of(tile.mask[j], it.n_tokens, pl.heads, rows);
            for (int a = 0; a < n_active; ++a) fa::step_one<kFma, kLanes>(st[rows[a]], buf.k_row, buf.v_row, d, pl.p);
        }
    }
    float row_sinks[kMaxQueries];
    const float* sinks = item_sinks(pl, it, row_sinks);
    for (int r = 0; r < n_queries; ++r) fa::end_one(st[r], out_row(pl, it, r), d, sinks ? sinks + r : nullptr);
    finish_outputs(pl, it);
}

__attribute__((target("avx512f,avx512vl,avx2,fma,f16c"))) void item_f16_one_avx512(const Plan& pl, int64_t task,
                                                                                   float* base) {
    item_f16_one_impl<true, 16>(pl, task, base);
}
__attribute__((target("avx2,fma,f16c"))) void item_f16_one_avx2(const Plan& pl, int64_t task, float* base) {
    item_f16_one_impl<true, 8>(pl, task, base);
}
void item_f16_one_baseline(const Plan& pl, int64_t task, float* base) {
    item_f16_one_impl<false, 8>(pl, task, base);
}

// llama.cpp runs its tiled flash attention (f32 q, f32 sums, one rescale per tile of 64 cells)
// for batches of this many queries and more, with f16 or f32 K/V; below, its one-query kernel.
constexpr int kExactTiledQueries = 64;

// d halves to floats (exact), 8 at a time with F16C.
__attribute__((target("avx2,f16c"))) void halves_to_floats_f16c(const uint16_t* src, float* dst, int d) {
    int i = 0;
    for (; i + 8 <= d; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    }
    for (; i < d; ++i) dst[i] = fa::half_to_float(src[i]);
}
void halves_to_floats(const uint16_t* src, float* dst, int d) {
    for (int i = 0; i < d; ++i) dst[i] = fa::half_to_float(src[i]);
}

// The tiled kernel of llama.cpp (fa_tiled): K and V rows (f16 or f32) converted to floats once
// per tile for the item's queries; the tiles are VisibleCells' (64 cells of the sequence each),
// and a cell's slot is its place in its tile.
void item_exact_tiled(const Plan& pl, int64_t task, float* base) {
    const Item it = item_of(pl, task);
    const TiledBuffers buf(base, pl.d);
    const int d = static_cast<int>(pl.d);
    const int n_queries = it.n_tokens * pl.heads;
    const float* q_rows[kTiledRows];
    float* out_rows[kTiledRows];
    for (int r = 0; r < n_queries; ++r) {
        q_rows[r] = q_row(pl, it, r);
        out_rows[r] = out_row(pl, it, r);
    }
    fa_tiled::State st;
    fa_tiled::begin(st, buf.qt, buf.acc, buf.scores, q_rows, n_queries, d);
    const uint32_t head_bits = pl.heads >= 32 ? ~0u : (uint32_t{1} << pl.heads) - 1;
    const bool f16 = pl.view.type_k == GgmlType::F16;
    const auto to_floats = pl.f16c ? halves_to_floats_f16c : halves_to_floats;
    VisibleCells cells(*pl.cache, it.seq, it.pos, it.n_tokens, pl.p.sliding_window, /*by_position=*/true);
    Tile& tile = *buf.tile;
    uint32_t rows[kTile];
    while (cells.next(tile)) {
        for (int j = 0; j < tile.n; ++j) {
            float* kj = buf.k + j * d;
            float* vj = buf.v + j * d;
            if (f16) {
                const auto* ks = reinterpret_cast<const uint16_t*>(k_head(pl, tile.cell[j], it.g));
                const auto* vs = reinterpret_cast<const uint16_t*>(v_head(pl, tile.cell[j], it.g));
                to_floats(ks, kj, d);
                to_floats(vs, vj, d);
            } else {
                std::memcpy(kj, k_head(pl, tile.cell[j], it.g), static_cast<size_t>(d) * sizeof(float));
                std::memcpy(vj, v_head(pl, tile.cell[j], it.g), static_cast<size_t>(d) * sizeof(float));
            }
            uint32_t mask = 0;
            for (int t = 0; t < it.n_tokens; ++t) {
                if (tile.mask[j] >> t & 1u) mask |= head_bits << (t * pl.heads);
            }
            rows[j] = mask;
        }
        pl.exact_tile(st, fa_tiled::TileKeys{tile.n, tile.slot, buf.k, buf.v, rows}, pl.p);
    }
    float row_sinks[kTiledRows];
    fa_tiled::end(st, out_rows, item_sinks(pl, it, row_sinks));
    finish_outputs(pl, it);
}

// ---- The tiled kernel (every type, AVX2 and AVX-512): f32 scores and sums ---------------------

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx2,fma,f16c")
namespace avx512 {
#include "ops/lanes_avx512.inc"
inline Vec finite_or_zero(Vec x) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, set1(kMasked), _CMP_EQ_OQ), x, zero());
}
// exp(x) for x <= 0 (-inf gives 0): x = n ln2 + r with |r| <= ln2 / 2, exp(r) by Cephes' expf
// polynomial (about 1 ulp), times 2^n built in the exponent bits; below -87 the result is 0.
inline Vec exp_nonpositive(Vec x) {
    const __mmask16 normal = _mm512_cmp_ps_mask(x, set1(-87.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, set1(-87.0f));
    const Vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(1.44269504088896341f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Vec r = _mm512_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    Vec p = set1(1.9875691500e-4f);
    p = fma(p, r, set1(1.3981999507e-3f));
    p = fma(p, r, set1(8.3334519073e-3f));
    p = fma(p, r, set1(4.1665795894e-2f));
    p = fma(p, r, set1(1.6666665459e-1f));
    p = fma(p, r, set1(5.0000001201e-1f));
    p = fma(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, set1(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(normal, p, _mm512_castsi512_ps(e));
}
inline void int8_to_floats(__m128i q, float d, float m, float* dst) {
    _mm512_storeu_ps(dst, fma(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), set1(d), set1(m)));
}
inline void f16_to_floats(const uint16_t* src, float* dst) {
    _mm512_storeu_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
}
#include "ops/attention_kv_tiled.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#include "ops/lanes_avx2.inc"
inline Vec finite_or_zero(Vec x) {
    return _mm256_blendv_ps(x, zero(), _mm256_cmp_ps(x, set1(kMasked), _CMP_EQ_OQ));
}
// As avx512::exp_nonpositive, 8 lanes.
inline Vec exp_nonpositive(Vec x) {
    const Vec is_tiny = _mm256_cmp_ps(x, set1(-87.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, set1(-87.0f));
    const Vec n =
        _mm256_round_ps(_mm256_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    Vec r = _mm256_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    Vec p = set1(1.9875691500e-4f);
    p = fma(p, r, set1(1.3981999507e-3f));
    p = fma(p, r, set1(8.3334519073e-3f));
    p = fma(p, r, set1(4.1665795894e-2f));
    p = fma(p, r, set1(1.6666665459e-1f));
    p = fma(p, r, set1(5.0000001201e-1f));
    p = fma(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, set1(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(is_tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
inline void int8_to_floats(__m128i q, float d, float m, float* dst) {
    _mm256_storeu_ps(dst, fma(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), set1(d), set1(m)));
    _mm256_storeu_ps(dst + 8, fma(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), set1(d), set1(m)));
}
inline void f16_to_floats(const uint16_t* src, float* dst) {
    _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
}
#include "ops/attention_kv_tiled.inc"
}  // namespace avx2
#pragma GCC pop_options

// ---- Without AVX2: quantized q, select_dot scores, f32 V sums ----------------------------------

namespace baseline {
inline float exp_shifted(float* x, int n, float m) {
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) sum += x[j] = std::exp(x[j] - m);
    return sum;
}
#include "ops/attention_kv_generic.inc"
}  // namespace baseline

using ItemFn = void (*)(const Plan&, int64_t, float*);

// K and V f16: llama.cpp's f16 flash-attention arithmetic (blocked kernel, else one query at a
// time). Every other type: the tiled kernel of the widest instruction set the CPU and the head
// size allow, else the baseline one.
ItemFn select_item(const Plan& pl, const quant::CpuFeatures& f) {
    const bool avx2 = f.avx2 && f.fma && f.f16c;
    const bool avx512 = avx2 && f.avx512f && f.avx512vl && f.avx512bw;
    if (pl.view.type_k == GgmlType::F16 && pl.view.type_v == GgmlType::F16) {
        if (pl.f16_kernel != nullptr) return item_f16_blocked;
        if (f16_attention::dot_lanes(f) == 16) return item_f16_one_avx512;
        return avx2 ? item_f16_one_avx2 : item_f16_one_baseline;
    }
    if (avx512 && pl.d % avx512::kLanes == 0) return avx512::item_tiled;
    if (avx2 && pl.d % avx2::kLanes == 0) return avx2::item_tiled;
    return baseline::item_generic;
}

// Query heads per item: the largest divisor of the group up to max_rows that still leaves every
// thread two items (decode has one token), or 1.
int heads_per_item(int64_t n_tok, int n_head_kv, int group, int n_threads, int max_rows) {
    for (int m = std::min(group, max_rows); m > 1; --m) {
        if (group % m == 0 && n_tok * n_head_kv * (group / m) >= 2 * static_cast<int64_t>(n_threads)) return m;
    }
    return 1;
}

std::string type_name_of(GgmlType t) {
    return std::string(quant::type_name(static_cast<uint32_t>(t)));
}

void check_layer(const AttentionParams& p, const kv::KvCache::LayerView& view, int layer) {
    if (view.n_head_kv != p.n_head_kv || view.head_dim_k != p.head_dim || view.head_dim_v != p.head_dim) {
        throw std::invalid_argument(
            "attention_kv: layer " + std::to_string(layer) + " of the cache holds " + std::to_string(view.n_head_kv) +
            " kv heads of K " + std::to_string(view.head_dim_k) + " / V " + std::to_string(view.head_dim_v) +
            ", the attention expects " + std::to_string(p.n_head_kv) + " of " + std::to_string(p.head_dim));
    }
    if (!quant::can_dequantize(view.type_k)) {
        throw std::invalid_argument("attention_kv: no kernel for K type " + type_name_of(view.type_k));
    }
    if (!quant::can_dequantize(view.type_v)) {
        throw std::invalid_argument("attention_kv: no kernel for V type " + type_name_of(view.type_v));
    }
}

// Per-thread floats: room for whichever kernel runs.
int64_t per_thread_floats(int64_t head_dim) {
    return std::max(ThreadBuffers::floats(head_dim), TiledBuffers::floats(head_dim));
}

// Scratch layout: per-thread buffers, then the token order and the token blocks.
size_t scratch_bytes_for(int64_t n_tok, int64_t head_dim, int n_threads) {
    return static_cast<size_t>(per_thread_floats(head_dim) * n_threads) * sizeof(float) +
           static_cast<size_t>(2 * n_tok + 2) * sizeof(int32_t);
}

}  // namespace

size_t attention_kv_scratch_bytes(int64_t n_tok, const AttentionParams& params, int n_threads) {
    return scratch_bytes_for(std::max<int64_t>(n_tok, 0), params.head_dim, std::max(n_threads, 1));
}

void attention_kv(const float* q, const int32_t* q_pos, const kv::SeqId* q_seq, int64_t n_tok, const kv::KvCache& cache,
                  int layer, const AttentionParams& params, float* out, ThreadPool& pool, Scratch& scratch) {
    check_attention_params("attention_kv", params);
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    check_layer(params, view, layer);
    if (n_tok <= 0) return;
    const int n_seq = cache.params().n_seq_max;
    for (int64_t t = 0; t < n_tok; ++t) {
        if (q_seq[t] < 0 || q_seq[t] >= n_seq) {
            throw std::invalid_argument("attention_kv: token " + std::to_string(t) + " has sequence " +
                                        std::to_string(q_seq[t]) + ", the cache has " + std::to_string(n_seq));
        }
    }

    Plan pl;
    pl.q = q;
    pl.q_pos = q_pos;
    pl.q_seq = q_seq;
    pl.out = out;
    pl.cache = &cache;
    pl.view = view;
    pl.p = params;
    pl.d = params.head_dim;
    pl.token_stride = static_cast<int64_t>(params.n_head) * params.head_dim;
    pl.group = params.n_head / params.n_head_kv;
    if (view.type_k == GgmlType::F16 && view.type_v == GgmlType::F16) {
        pl.f16_kernel = f16_attention::block_kernel(params.head_dim, scratch.features());
    }
    const ItemFn item = select_item(pl, scratch.features());
    const bool plain_kv = view.key == nullptr && view.q_scale == nullptr && view.k_center == nullptr && !view.rotated;
    if (view.type_k == view.type_v && (view.type_k == GgmlType::F16 || view.type_k == GgmlType::F32) && plain_kv) {
        const fa_tiled::Isa isa =
            params.head_dim % 16 == 0 ? fa_tiled::best_isa(scratch.features()) : fa_tiled::Isa::Reference;
        pl.exact_tile = fa_tiled::tile_fn(isa);
        pl.f16c = scratch.features().f16c && scratch.features().avx2;
    }
    const bool tiled = item == avx512::item_tiled || item == avx2::item_tiled;
    const int max_rows = tiled ? kTiledRows : kMaxQueries;
    pl.heads = heads_per_item(n_tok, params.n_head_kv, pl.group, pool.size(), max_rows);
    pl.head_blocks = params.n_head / pl.heads;
    pl.per_thread_floats = per_thread_floats(pl.d);
    const quant::DotKernel kernel =
        quant::has_dot(view.type_k) ? quant::select_dot(view.type_k, scratch.features()) : quant::DotKernel{};
    pl.dot = kernel.fn;
    pl.act_type = kernel.act_type;
    pl.act_row_bytes = pl.dot != nullptr ? static_cast<size_t>(*quant::row_bytes(pl.act_type, pl.d)) : 0;
    if (pl.act_row_bytes > static_cast<size_t>(pl.d) * sizeof(float)) {
        throw std::invalid_argument("attention_kv: activation rows of " + type_name_of(pl.act_type) +
                                    " larger than float rows");
    }

    // Tokens per item: fill max_rows, but keep enough items for every thread.
    int64_t tokens = std::max(1, max_rows / pl.heads);
    while (tokens > 1 && (n_tok + tokens - 1) / tokens * pl.head_blocks < 4 * static_cast<int64_t>(pool.size())) {
        --tokens;
    }

    std::byte* region = scratch.bytes(scratch_bytes_for(n_tok, pl.d, pool.size()));
    auto* thread_scratch = reinterpret_cast<float*>(region);
    auto* order = reinterpret_cast<int32_t*>(thread_scratch + pl.per_thread_floats * pool.size());
    int32_t* block_begin = order + n_tok;

    // Tokens grouped by sequence (a counting sort, stable), then cut into blocks of `tokens` that
    // stay inside one sequence.
    int32_t count[kv::kMaxSequences + 1] = {};
    for (int64_t t = 0; t < n_tok; ++t) ++count[q_seq[t] + 1];
    // llama.cpp runs its tiled kernel for a batch (ubatch) of kExactTiledQueries queries or more,
    // counted here per sequence so that a sequence's results do not depend on the rest of the
    // batch. Sliding-window layers too: llama.cpp's full-size SWA cache (its default) holds a
    // sequence's cells in position order, as the position tiles assume.
    for (int s = 0; s < kv::kMaxSequences; ++s) {
        pl.exact_seq[s] = pl.exact_tile != nullptr && count[s + 1] >= kExactTiledQueries;
    }
    for (int s = 0; s < kv::kMaxSequences; ++s) count[s + 1] += count[s];
    int64_t n_blocks = 0;
    for (int s = 0; s < kv::kMaxSequences; ++s) {
        for (int32_t i = count[s]; i < count[s + 1]; i += static_cast<int32_t>(tokens)) block_begin[n_blocks++] = i;
    }
    block_begin[n_blocks] = static_cast<int32_t>(n_tok);
    for (int64_t t = 0; t < n_tok; ++t) order[count[q_seq[t]]++] = static_cast<int32_t>(t);
    pl.order = order;
    pl.block_begin = block_begin;
    pl.n_blocks = n_blocks;

    pool.parallel_for(n_blocks * pl.head_blocks, [&](int64_t begin, int64_t end, int thread_idx) {
        float* base = thread_scratch + thread_idx * pl.per_thread_floats;
        for (int64_t task = begin; task < end; ++task) {
            const kv::SeqId seq = pl.q_seq[pl.order[pl.block_begin[block_of(pl, task)]]];
            (pl.exact_seq[seq] ? item_exact_tiled : item)(pl, task, base);
        }
    });
}

}  // namespace fitllm::ops
