#include "gguf/gguf_quantize.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "gguf/gguf_writer.h"
#include "quant/dequantize.h"
#include "quant/quantize.h"
#include "quant/quantize_ref.h"

namespace fitllm::gguf {

using quant::GgmlType;

namespace {

class OutFile {
public:
    explicit OutFile(std::string path) : path_(std::move(path)) {
        f_ = std::fopen(path_.c_str(), "wb");
        if (!f_) throw Error(path_ + ": cannot create: " + std::strerror(errno));
    }
    ~OutFile() {
        if (f_) {
            std::fclose(f_);
            std::remove(path_.c_str());
        }
    }
    OutFile(const OutFile&) = delete;
    OutFile& operator=(const OutFile&) = delete;
    void write(const void* p, size_t n) {
        if (n != 0 && std::fwrite(p, 1, n, f_) != n) throw Error(path_ + ": write failed: " + std::strerror(errno));
    }
    void zeros(size_t n) {
        static const char kZero[64] = {};
        while (n > 0) {
            const size_t k = std::min(n, sizeof kZero);
            write(kZero, k);
            n -= k;
        }
    }
    // Closes the file and renames it to `final_path`.
    void commit(const std::string& final_path) {
        std::FILE* f = f_;
        f_ = nullptr;
        if (std::fclose(f) != 0) {
            std::remove(path_.c_str());
            throw Error(path_ + ": write failed: " + std::strerror(errno));
        }
        if (std::rename(path_.c_str(), final_path.c_str()) != 0) {
            const int e = errno;
            std::remove(path_.c_str());
            throw Error(final_path + ": cannot rename " + path_ + " over it: " + std::strerror(e));
        }
    }

private:
    std::string path_;
    std::FILE* f_ = nullptr;
};

// Rows [r0, r1) of a tensor from `src` (type from) to `dst` (type to); row r is global row
// first_row + r, weighted by the imatrix slice of its expert (rows_per_expert rows each) if any.
void convert_rows(GgmlType from, GgmlType to, const std::byte* src, std::byte* dst, int64_t n_per_row, int64_t r0,
                  int64_t r1, std::vector<float>& scratch, const float* imatrix, int64_t first_row,
                  int64_t rows_per_expert) {
    const uint64_t in_row = *quant::row_bytes(from, n_per_row), out_row = *quant::row_bytes(to, n_per_row);
    scratch.resize(static_cast<size_t>(n_per_row));
    for (int64_t r = r0; r < r1; ++r) {
        const std::byte* in = src + r * in_row;
        const float* x;
        if (from == GgmlType::F32) {
            std::memcpy(scratch.data(), in, n_per_row * sizeof(float));  // alignment-safe
        } else {
            quant::dequantize_row(from, in, scratch.data(), n_per_row);
        }
        x = scratch.data();
        const float* weights = imatrix ? imatrix + ((first_row + r) / rows_per_expert) * n_per_row : nullptr;
        quant::quantize_model_row(to, x, dst + r * out_row, n_per_row, weights);
    }
}

}  // namespace

QuantizeResult quantize_file(const std::string& input_path, const std::string& output_path,
                             const QuantizeParams& params,
                             const std::function<void(size_t, const TensorChoice&)>& progress) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (input_path == output_path || (fs::exists(output_path, ec) && fs::equivalent(input_path, output_path, ec)))
        throw Error(output_path + ": is the input file; write the output elsewhere");
    GgufFile in = GgufFile::open(input_path);
    QuantizeResult result;
    result.tensors = plan_quantization(in, params);
    for (const TensorChoice& c : result.tensors) result.n_fallback += c.fallback ? 1 : 0;

    GgufWriter writer(in.version());
    bool wrote_qv = false, wrote_ft = false;
    const bool imatrix_keys = params.imatrix && !params.imatrix->weights.empty();
    for (const Value& v : in.metadata()) {
        const std::string_view key = v.key();
        if (key == "general.quantization_version") {
            writer.add<uint32_t>(key, 2);
            wrote_qv = true;
        } else if (key == "general.file_type") {
            writer.add<uint32_t>(key, params.ftype);
            wrote_ft = true;
        } else if (key == "split.no" || key == "split.count" || key == "split.tensors.count") {
            continue;
        } else if (imatrix_keys && (key == "quantize.imatrix.file" || key == "quantize.imatrix.entries_count" ||
                                    (key == "quantize.imatrix.dataset" && !params.imatrix->datasets.empty()) ||
                                    (key == "quantize.imatrix.chunks_count" && params.imatrix->chunk_count > 0))) {
            continue;  // replaced by this run's, below
        } else {
            writer.add_value(v);
        }
    }
    if (!wrote_qv) writer.add<uint32_t>("general.quantization_version", 2);
    if (!wrote_ft) writer.add<uint32_t>("general.file_type", params.ftype);
    if (imatrix_keys) {  // as llama-quantize records its --imatrix (strings cut at 127 bytes)
        const ImportanceMatrix& m = *params.imatrix;
        writer.add_string("quantize.imatrix.file", m.path.substr(0, 127));
        if (!m.datasets.empty()) writer.add_string("quantize.imatrix.dataset", m.datasets[0].substr(0, 127));
        writer.add<uint32_t>("quantize.imatrix.entries_count", static_cast<uint32_t>(m.weights.size()));
        if (m.chunk_count > 0)
            writer.add<uint32_t>("quantize.imatrix.chunks_count", static_cast<uint32_t>(m.chunk_count));
    }
    if (writer.alignment() != in.alignment())
        throw Error(input_path + ": alignment " + std::to_string(in.alignment()) + " not carried over");
    for (size_t i = 0; i < in.tensors().size(); ++i) {
        const TensorInfo& t = in.tensors()[i];
        writer.add_tensor_info(t.name, result.tensors[i].to, std::span<const int64_t>(t.ne.data(), t.n_dims));
    }

    OutFile out(output_path + ".tmp");
    const std::vector<std::byte> header = writer.header_bytes();
    out.write(header.data(), header.size());
    io::MappedFile* map = in.mapping();
    const uint64_t align = in.alignment();
    const int threads = std::max(1, params.threads);
    std::vector<std::byte> buffer;
    std::vector<std::vector<float>> scratch(static_cast<size_t>(threads));
    constexpr uint64_t kSlabBytes = 16ull << 20;  // bytes in or out converted at a time

    for (size_t i = 0; i < in.tensors().size(); ++i) {
        const TensorInfo& t = in.tensors()[i];
        const TensorChoice& c = result.tensors[i];
        const uint64_t file_offset = in.data_offset() + t.offset;
        uint64_t written = 0;
        if (c.to == c.from) {
            for (uint64_t off = 0; off < t.n_bytes; off += kSlabBytes) {
                const uint64_t n = std::min<uint64_t>(kSlabBytes, t.n_bytes - off);
                out.write(t.data.data() + off, n);
                if (map) map->release(file_offset + off, n);
            }
            written = t.n_bytes;
        } else {
            const int64_t n_per_row = t.ne[0];
            const int64_t rows = static_cast<int64_t>(t.n_elements / static_cast<uint64_t>(n_per_row));
            const uint64_t in_row = *quant::row_bytes(c.from, n_per_row);
            const uint64_t out_row = *quant::row_bytes(c.to, n_per_row);
            const uint64_t widest = std::max<uint64_t>(std::max(in_row, out_row), 1);
            const int64_t slab = std::max<int64_t>(1, static_cast<int64_t>(kSlabBytes / widest));
            for (int64_t r0 = 0; r0 < rows; r0 += slab) {
                const int64_t nr = std::min(slab, rows - r0);
                buffer.resize(static_cast<size_t>(nr) * out_row);
                const std::byte* src = t.data.data() + r0 * in_row;
                const int nt = static_cast<int>(std::min<int64_t>(threads, nr));
                std::vector<std::thread> workers;
                std::vector<std::exception_ptr> failures(static_cast<size_t>(nt));
                auto work = [&](int w) {
                    try {
                        const int64_t a = nr * w / nt, b = nr * (w + 1) / nt;
                        convert_rows(c.from, c.to, src, buffer.data(), n_per_row, a, b, scratch[w], c.imatrix, r0,
                                     std::max<int64_t>(1, t.ne[1]));
                    } catch (...) {
                        failures[w] = std::current_exception();
                    }
                };
                for (int w = 1; w < nt; ++w) workers.emplace_back(work, w);
                work(0);
                for (std::thread& th : workers) th.join();
                for (const std::exception_ptr& f : failures) {
                    if (f) std::rethrow_exception(f);
                }
                out.write(buffer.data(), buffer.size());
                if (map) map->release(file_offset + r0 * in_row, nr * in_row);
            }
            written = static_cast<uint64_t>(rows) * out_row;
        }
        out.zeros((written + align - 1) / align * align - written);
        result.bytes_in += t.n_bytes;
        result.bytes_out += written;
        if (progress) progress(i, c);
    }
    out.commit(output_path);
    return result;
}

}  // namespace fitllm::gguf
