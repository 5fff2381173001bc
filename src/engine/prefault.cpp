#include "engine/prefault.h"

#include <algorithm>
#include <vector>

#include "io/mapped_file.h"

namespace fitllm::engine {
namespace {

constexpr uint64_t kChunk = uint64_t{16} << 20;  // read ahead and report per 16 MiB

// [begin, end) minus the skip ranges, page-rounded outward (a page that holds any byte outside
// the skip ranges is kept).
std::vector<model::FileRange> wanted_ranges(uint64_t begin, uint64_t end, std::span<const model::FileRange> skip,
                                            uint64_t page) {
    std::vector<model::FileRange> sorted(skip.begin(), skip.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const model::FileRange& a, const model::FileRange& b) { return a.offset < b.offset; });
    std::vector<model::FileRange> out;
    uint64_t at = begin;
    const auto keep = [&](uint64_t from, uint64_t to) {
        from = std::max(from / page * page, begin);
        to = std::min((to + page - 1) / page * page, end);
        if (from >= to) return;
        if (!out.empty() && out.back().offset + out.back().length >= from) {
            out.back().length = std::max(out.back().length, to - out.back().offset);
        } else {
            out.push_back({from, to - from});
        }
    };
    for (const model::FileRange& r : sorted) {
        if (r.offset > at) keep(at, r.offset);
        at = std::max(at, r.offset + r.length);
    }
    if (at < end) keep(at, end);
    return out;
}

}  // namespace

uint64_t prefault(gguf::GgufFile& file, const ProgressFn& progress, std::span<const model::FileRange> skip) {
    const uint64_t begin = std::min(file.data_offset(), file.size());
    const uint64_t page = io::MappedFile::page_size();
    const std::vector<model::FileRange> ranges = wanted_ranges(begin, file.size(), skip, page);
    uint64_t total = 0;
    for (const model::FileRange& r : ranges) total += r.length;
    io::MappedFile* mapping = file.mapping();
    if (mapping != nullptr && mapping->is_file_mapping() && total > 0) {
        const std::byte* bytes = file.bytes().data();
        uint64_t done = 0;
        for (const model::FileRange& r : ranges) {
            const uint64_t end = r.offset + r.length;
            mapping->advise(r.offset, std::min(kChunk, r.length), io::Advice::willneed);
            for (uint64_t at = r.offset; at < end;) {
                const uint64_t n = std::min(kChunk, end - at);
                if (at + n < end) mapping->advise(at + n, std::min(kChunk, end - at - n), io::Advice::willneed);
                // One read per page faults it in; the volatile sum keeps the reads from being dropped.
                unsigned sum = 0;
                for (uint64_t off = at; off < at + n; off += page) {
                    sum += static_cast<unsigned>(*static_cast<const volatile std::byte*>(bytes + off));
                }
                // A range that starts inside a page ends inside one the loop's stride stepped over.
                sum += static_cast<unsigned>(*static_cast<const volatile std::byte*>(bytes + at + n - 1));
                [[maybe_unused]] volatile unsigned sink = sum;
                at += n;
                done += n;
                if (progress && done < total) progress(done, total);
            }
        }
    }
    if (progress) progress(total, total);
    return total;
}

uint64_t prefault(gguf::GgufFile& file, const model::Model& model, const ProgressFn& progress) {
    std::vector<model::FileRange> skip = model.streamed_ranges();
    for (const model::FileRange& r : model.offloaded_ranges()) skip.push_back(r);  // on the device
    // A model short of memory reads the token embedding a row per token: faulting in all of it
    // would cost a layer's worth of page cache (64 MiB for a 32k-token vocabulary) for a few rows.
    // Not when the output matrix is the same tensor (tied): that reads every row.
    const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
    if (model.n_streamed_layers() > 0 && embd != nullptr && file.find_tensor("output.weight") != nullptr) {
        skip.push_back({file.data_offset() + embd->offset, embd->n_bytes});
        // And no read-around when a row faults in: the kernel would read megabytes of rows around
        // it (read_ahead_kb), page cache charged to us that the next token rarely needs.
        if (io::MappedFile* mapping = file.mapping(); mapping != nullptr && mapping->is_file_mapping()) {
            mapping->advise(skip.back().offset, skip.back().length, io::Advice::random);
        }
    }
    return prefault(file, progress, skip);
}

}  // namespace fitllm::engine
