#include "runtime/prefault.h"

#include <algorithm>

#include "io/mapped_file.h"

namespace fitllm::runtime {
namespace {

constexpr uint64_t kChunk = uint64_t{16} << 20;  // read ahead and report per 16 MiB

}  // namespace

uint64_t prefault(gguf::GgufFile& file, const ProgressFn& progress) {
    const uint64_t begin = std::min(file.data_offset(), file.size());
    const uint64_t total = file.size() - begin;
    io::MappedFile* mapping = file.mapping();
    if (mapping != nullptr && mapping->is_file_mapping() && total > 0) {
        const std::byte* bytes = file.bytes().data();
        const uint64_t page = io::MappedFile::page_size();
        mapping->advise(begin, std::min(kChunk, total), io::Advice::willneed);
        for (uint64_t done = 0; done < total;) {
            const uint64_t n = std::min(kChunk, total - done);
            if (done + n < total)
                mapping->advise(begin + done + n, std::min(kChunk, total - done - n), io::Advice::willneed);
            // One read per page faults it in; the volatile sum keeps the reads from being dropped.
            unsigned sum = 0;
            for (uint64_t off = begin + done; off < begin + done + n; off += page) {
                sum += static_cast<unsigned>(*static_cast<const volatile std::byte*>(bytes + off));
            }
            [[maybe_unused]] volatile unsigned sink = sum;
            done += n;
            if (progress && done < total) progress(done, total);
        }
    }
    if (progress) progress(total, total);
    return total;
}

}  // namespace fitllm::runtime
