#include "ops/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "quant/dot.h"
#include "quant/gemm.h"
#include "quant/quantize.h"

namespace fitllm::ops {
namespace {

// Tile sizes for n_tok > 1. A tile of kRowTile weight rows is read from memory once and then
// stays in L2 while kTokTile activation rows stream past it; within the tile each weight row is
// reused for all kTokTile tokens while it is in L1. For a 4096-wide Q4_K layer: 16 rows = 36 KiB
// of weights, 8 Q8_K activation rows = 35 KiB.
constexpr int64_t kRowTile = 16;
constexpr int64_t kTokTile = 8;

// The tiled kernels (quant/gemm.h), n_tok > 1: a task is up to kGemmRowBlock weight rows times up
// to kGemmTokChunk tokens. A kernel call unpacks each tile of rows (a chunk of the row at a time)
// once and streams all its tokens past it: for the blocks of 32, 256 tokens' 1024-value chunks of
// Q8_0 are 272 KiB, which stay in L2 for the next tile. Row blocks are as large as still gives each
// thread kGemmTasksPerThread tasks to balance. FITLLM_NO_GEMM=1 in the environment turns the tiled
// kernels off (the dots then run), for A/B measurements.
constexpr int64_t kGemmRowBlock = 64;
constexpr int64_t kGemmTokChunk = 256;
constexpr int64_t kGemmTasksPerThread = 4;

// Rows per parallel_for task for matrix-vector: small enough to balance, large enough that a
// task's weights stream through the prefetchers.
constexpr int64_t kMatvecRowsPerTask = 8;

// Small batches (quant::select_small_batch): rows per task a multiple of kSmallBatchMinRows, and
// at least kSmallBatchTasksPerThread tasks per thread where the matrix has the rows.
constexpr int64_t kSmallBatchMinRows = 16;
constexpr int64_t kSmallBatchTasksPerThread = 8;

uint64_t checked_row_bytes(quant::GgmlType type, int64_t n, const char* what) {
    const auto bytes = quant::row_bytes(type, static_cast<uint64_t>(n));
    if (!bytes) {
        throw std::invalid_argument(std::string("matmul: ") + what + " of " + std::to_string(n) + " values is not a " +
                                    "whole number of " + std::string(quant::traits(type).name) + " blocks");
    }
    return *bytes;
}

// The activations of n_tok tokens in `type` (the kernel's format), in scratch; F32 kernels read x
// as it is.
struct Activations {
    const std::byte* data;
    size_t stride;  // bytes per token
};
Activations activations(quant::GgmlType type, const WeightView& w, const float* x, int n_tok, ThreadPool& pool,
                        Scratch& scratch) {
    if (type == quant::GgmlType::F32)
        return {reinterpret_cast<const std::byte*>(x), static_cast<size_t>(w.cols) * sizeof(float)};
    const size_t stride = checked_row_bytes(type, w.cols, "an activation row");
    std::byte* quantized = scratch.bytes(stride * static_cast<size_t>(n_tok));
    pool.parallel_for(n_tok, [&](int64_t begin, int64_t end, int) {
        for (int64_t t = begin; t < end; ++t) quant::quantize_row(type, x + t * w.cols, quantized + t * stride, w.cols);
    });
    return {quantized, stride};
}

// A tiled kernel over all rows and n_tok tokens: tasks of (row block, token chunk). A call repacks
// each tile of gemm.row_tile weight rows once and runs all the chunk's tokens over it, so rows per
// task should be many; but both threads need several tasks to balance.
void run_tiles(const quant::GemmKernel& gemm, const WeightView& w, const Activations& act, int n_tok, float* y,
               ThreadPool& pool) {
    const int cols = static_cast<int>(w.cols);
    const size_t w_stride = w.stride();
    const auto* w_data = static_cast<const std::byte*>(w.data);
    const int64_t n_tok_chunks = (n_tok + kGemmTokChunk - 1) / kGemmTokChunk;
    const int64_t tok_chunk = (n_tok + n_tok_chunks - 1) / n_tok_chunks;
    const int64_t row_tile = std::max(1, gemm.row_tile);
    int64_t row_block = kGemmRowBlock;
    const int64_t min_tasks = kGemmTasksPerThread * pool.size();
    while (row_block > row_tile && ((w.rows + row_block - 1) / row_block) * n_tok_chunks < min_tasks) row_block /= 2;
    row_block = std::max(row_tile, row_block / row_tile * row_tile);
    const int64_t n_row_blocks = (w.rows + row_block - 1) / row_block;
    pool.parallel_for(n_row_blocks * n_tok_chunks, [&](int64_t begin, int64_t end, int) {
        for (int64_t task = begin; task < end; ++task) {
            const int64_t r0 = (task % n_row_blocks) * row_block;
            const int64_t r1 = std::min(w.rows, r0 + row_block);
            const int64_t t0 = (task / n_row_blocks) * tok_chunk;
            const int64_t t1 = std::min<int64_t>(n_tok, t0 + tok_chunk);
            gemm.fn(cols, static_cast<int>(r1 - r0), static_cast<int>(t1 - t0), w_data + r0 * w_stride, w_stride,
                    act.data + t0 * act.stride, act.stride, y + t0 * w.rows + r0, static_cast<size_t>(w.rows));
        }
    });
}

// Every token in the single-token (dot) order: matrix-vector, the small-batch kernels or the tiles.
// exact: each token gets its one-token floats bit for bit, so tiles that sum in another order than
// the dots (quant::GemmKernel::dot_order false) are left to the dots.
void matmul_dot_order(const WeightView& w, const quant::DotKernel& kernel, const float* x, int n_tok, float* y,
                      ThreadPool& pool, Scratch& scratch, bool exact) {
    const int cols = static_cast<int>(w.cols);
    const Activations acts = activations(kernel.act_type, w, x, n_tok, pool, scratch);
    const std::byte* act = acts.data;
    const size_t act_stride = acts.stride;

    const size_t w_stride = w.stride();
    const auto* w_data = static_cast<const std::byte*>(w.data);
    const quant::DotFn dot = kernel.fn;

    if (n_tok == 1) {
        const int64_t n_tasks = (w.rows + kMatvecRowsPerTask - 1) / kMatvecRowsPerTask;
        // FITLLM_NO_DOT_ROWS=1 computes one row at a time instead (A/B measurements).
        static const bool rows_off = std::getenv("FITLLM_NO_DOT_ROWS") != nullptr;
        const quant::DotRowsFn rows = rows_off ? nullptr : kernel.rows;
        pool.parallel_for(n_tasks, [&](int64_t begin, int64_t end, int) {
            const int64_t r0 = begin * kMatvecRowsPerTask;
            const int64_t r_end = std::min(w.rows, end * kMatvecRowsPerTask);
            if (rows != nullptr) {
                rows(cols, static_cast<int>(r_end - r0), y + r0, w_data + r0 * w_stride, w_stride, act);
                return;
            }
            for (int64_t r = r0; r < r_end; ++r) dot(cols, y + r, w_data + r * w_stride, act);
        });
        return;
    }

    // Small batches (a token of each of a few decoding sequences): each weight row loaded once for
    // all the tokens, with the dot's own arithmetic, so a sequence's results do not depend on its
    // batch. Tasks of rows large enough that a call's preparation of the activations is shared by
    // many rows, yet several per thread to balance. FITLLM_NO_SMALL_BATCH=1 turns it off (A/B).
    static const bool small_off = std::getenv("FITLLM_NO_SMALL_BATCH") != nullptr;
    const quant::GemmKernel small = small_off || n_tok > quant::small_batch_max_tok(w.type)
                                        ? quant::GemmKernel{}
                                        : quant::select_small_batch(w.type, scratch.features());
    if (small.fn != nullptr && small.act_type == kernel.act_type) {
        const int64_t min_tasks = kSmallBatchTasksPerThread * pool.size();
        const int64_t rows_per_task =
            std::max(kSmallBatchMinRows, (w.rows + min_tasks - 1) / min_tasks + kSmallBatchMinRows - 1) /
            kSmallBatchMinRows * kSmallBatchMinRows;
        const int64_t n_tasks = (w.rows + rows_per_task - 1) / rows_per_task;
        pool.parallel_for(n_tasks, [&](int64_t begin, int64_t end, int) {
            const int64_t r0 = begin * rows_per_task;
            const int64_t r1 = std::min(w.rows, end * rows_per_task);
            small.fn(cols, static_cast<int>(r1 - r0), n_tok, w_data + r0 * w_stride, w_stride, act, act_stride, y + r0,
                     static_cast<size_t>(w.rows));
        });
        return;
    }

    static const bool gemm_off = std::getenv("FITLLM_NO_GEMM") != nullptr;
    const quant::GemmKernel gemm = gemm_off ? quant::GemmKernel{} : quant::select_gemm(w.type, scratch.features());
    if (gemm.fn != nullptr && gemm.act_type == kernel.act_type && (gemm.dot_order || !exact)) {
        run_tiles(gemm, w, acts, n_tok, y, pool);
        return;
    }
    const int64_t n_row_tiles = (w.rows + kRowTile - 1) / kRowTile;
    pool.parallel_for(n_row_tiles, [&](int64_t begin, int64_t end, int) {
        for (int64_t tile = begin; tile < end; ++tile) {
            const int64_t r0 = tile * kRowTile;
            const int64_t r1 = std::min(w.rows, r0 + kRowTile);
            for (int64_t t0 = 0; t0 < n_tok; t0 += kTokTile) {
                const int64_t t1 = std::min<int64_t>(n_tok, t0 + kTokTile);
                for (int64_t r = r0; r < r1; ++r) {
                    const std::byte* w_row = w_data + r * w_stride;
                    for (int64_t t = t0; t < t1; ++t) dot(cols, y + t * w.rows + r, w_row, act + t * act_stride);
                }
            }
        }
    });
}

}  // namespace

void matmul(const WeightView& w, const float* x, int n_tok, float* y, ThreadPool& pool, Scratch& scratch,
            std::span<const TokenPlace> places) {
    if (n_tok <= 0 || w.rows <= 0) return;
    const quant::DotKernel kernel = quant::select_dot(w.type, scratch.features());
    if (kernel.fn == nullptr) {
        throw std::invalid_argument("matmul: no dot kernel for weight type " + std::string(quant::traits(w.type).name));
    }
    checked_row_bytes(w.type, w.cols, "a weight row");
    if (!places.empty() && places.size() != static_cast<size_t>(n_tok)) {
        throw std::invalid_argument("matmul: " + std::to_string(places.size()) + " token places for " +
                                    std::to_string(n_tok) + " tokens");
    }
    // No places: every token alone, in the one-token floats.
    if (places.empty()) return matmul_dot_order(w, kernel, x, n_tok, y, pool, scratch, true);
    // FITLLM_NO_BATCH_ORDER=1 keeps every token in the single-token order (A/B measurements).
    static const bool batch_order_off = std::getenv("FITLLM_NO_BATCH_ORDER") != nullptr;
    const quant::BatchOrderGemm order =
        batch_order_off ? quant::BatchOrderGemm{} : quant::select_batch_order_gemm(w.type, scratch.features());
    // Where the type's tiles sum in another order than its dots, a run of 1 (decode, or a row in
    // the one-token arithmetic: model::Batch::token_order_rows) keeps its one-token floats, and
    // the rest of a prompt's tokens take the tiles.
    const quant::GemmKernel tiles = quant::select_gemm(w.type, scratch.features());
    const bool exact_runs_of_1 = tiles.fn != nullptr && !tiles.dot_order;
    if (order.kernel.fn == nullptr && !exact_runs_of_1)
        return matmul_dot_order(w, kernel, x, n_tok, y, pool, scratch, false);

    // Maximal ranges of consecutive tokens on which the path agrees, each run by its kernel.
    enum class Path { kBatchOrder, kExact, kDotOrder };
    const auto path_of = [&](int t) {
        const TokenPlace& p = places[static_cast<size_t>(t)];
        if (order.kernel.fn != nullptr && order.applies(w.rows, w.cols, p.run_len, p.run_pos)) return Path::kBatchOrder;
        return exact_runs_of_1 && p.run_len == 1 ? Path::kExact : Path::kDotOrder;
    };
    for (int t0 = 0; t0 < n_tok;) {
        const Path path = path_of(t0);
        int t1 = t0 + 1;
        while (t1 < n_tok && path_of(t1) == path) ++t1;
        const float* xs = x + static_cast<int64_t>(t0) * w.cols;
        float* ys = y + static_cast<int64_t>(t0) * w.rows;
        if (path == Path::kBatchOrder) {
            run_tiles(order.kernel, w, activations(order.kernel.act_type, w, xs, t1 - t0, pool, scratch), t1 - t0, ys,
                      pool);
        } else {
            matmul_dot_order(w, kernel, xs, t1 - t0, ys, pool, scratch, path == Path::kExact);
        }
        t0 = t1;
    }
}

}  // namespace fitllm::ops
