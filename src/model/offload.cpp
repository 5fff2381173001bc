#include "model/offload.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "io/mapped_file.h"

namespace fitllm::model {

Placement place_layers(const Hparams& hp, const LoadOptions& options) {
    const int n = options.n_offload_layers;
    if (n < 0) throw std::invalid_argument("cannot offload " + std::to_string(n) + " layers");
    if (n > 0 && options.offload == nullptr) {
        throw std::invalid_argument("cannot offload " + std::to_string(n) + " layers: no device given");
    }
    Placement p;
    p.first_device_layer = hp.n_layer;
    if (n == 0 || options.offload == nullptr) return p;
    p.device = options.offload;
    p.first_device_layer = hp.n_layer - std::min(n, hp.n_layer);
    p.output_on_device = n > hp.n_layer;
    p.kv_on_device = options.offload_kv;
    if (options.n_streamed_layers > p.first_device_layer) {
        throw std::invalid_argument("cannot stream " + std::to_string(options.n_streamed_layers) + " layers with " +
                                    std::to_string(hp.n_layer - p.first_device_layer) + " of " +
                                    std::to_string(hp.n_layer) + " offloaded to " + p.device->name() + ": only the " +
                                    std::to_string(p.first_device_layer) + " layers left on the host can stream");
    }
    return p;
}

std::vector<int> cache_layer_devices(const Hparams& hp, int n_offload_layers, bool offload_kv) {
    std::vector<int> devices(static_cast<size_t>(hp.n_layer), 0);
    if (!offload_kv || n_offload_layers <= 0) return devices;
    for (int il = hp.n_layer - std::min(n_offload_layers, hp.n_layer); il < hp.n_layer; ++il)
        devices[static_cast<size_t>(il)] = 1;
    return devices;
}

std::vector<std::string> device_tensor_names(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers) {
    std::vector<std::string> names;
    if (n_offload_layers <= 0) return names;
    const int first = hp.n_layer - std::min(n_offload_layers, hp.n_layer);
    for (const gguf::TensorInfo& t : file.tensors()) {
        const std::string_view name = t.name;
        if (name.substr(0, 4) != "blk.") continue;
        int il = 0;
        size_t i = 4;
        for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) il = il * 10 + (name[i] - '0');
        if (i == 4 || i >= name.size() || name[i] != '.') continue;
        if (il >= first && il < hp.n_layer) names.emplace_back(name);
    }
    if (n_offload_layers > hp.n_layer) {
        names.emplace_back("output_norm.weight");
        names.emplace_back(file.find_tensor("output.weight") ? "output.weight" : "token_embd.weight");
    }
    // Global tensors the layers read (Llama 3.1's RoPE frequency factors, Phi-3's LongRoPE ones).
    for (const char* global : {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}) {
        if (file.find_tensor(global)) names.emplace_back(global);
    }
    return names;
}

namespace {

uint64_t aligned(uint64_t n) {
    return (n + backend::kBufferAlign - 1) / backend::kBufferAlign * backend::kBufferAlign;
}

}  // namespace

uint64_t device_weight_bytes(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers, bool unified) {
    if (unified) return 0;
    uint64_t bytes = 0;
    for (const std::string& name : device_tensor_names(file, hp, n_offload_layers))
        bytes += aligned(file.find_tensor(name)->n_bytes + kWeightSkew);
    return bytes;
}

uint64_t device_scratch_bytes(const Hparams& hp, int n_offload_layers, int n_tok, int n_out) {
    if (n_offload_layers <= 0) return 0;
    const auto n = static_cast<uint64_t>(n_tok);
    const uint64_t rows[] = {
        static_cast<uint64_t>(hp.n_embd),
        static_cast<uint64_t>(hp.n_embd),
        static_cast<uint64_t>(hp.n_head) * static_cast<uint64_t>(hp.head_dim),
        static_cast<uint64_t>(hp.n_head_kv) * static_cast<uint64_t>(hp.head_dim),
        static_cast<uint64_t>(hp.n_head_kv) * static_cast<uint64_t>(hp.head_dim_v),
        static_cast<uint64_t>(hp.n_head) * static_cast<uint64_t>(hp.head_dim_v),
        static_cast<uint64_t>(hp.n_ff),
        static_cast<uint64_t>(hp.n_ff),
    };
    uint64_t bytes = 0;
    for (const uint64_t row : rows) bytes += aligned(n * row * sizeof(float));
    if (n_offload_layers > hp.n_layer && n_out > 0)
        bytes += aligned(static_cast<uint64_t>(n_out) * static_cast<uint64_t>(hp.n_vocab) * sizeof(float));
    return bytes;
}

DeviceWeights::DeviceWeights(const gguf::GgufFile& file, const Hparams& hp, const Placement& placement) {
    if (placement.device == nullptr) return;
    backend::Backend& dev = *placement.device;
    if (dev.unified()) {
        map_in_place(file, hp, placement);
        return;
    }
    const int n_offload = hp.n_layer - placement.first_device_layer + (placement.output_on_device ? 1 : 0);
    // Giving pages back changes no content of a file mapping (they fault in again from the file);
    // a file read into memory would lose them, and other models may share it: left alone.
    auto* mapping = const_cast<io::MappedFile*>(file.mapping());
    const bool release = mapping != nullptr && mapping->is_file_mapping();
    for (const std::string& name : device_tensor_names(file, hp, n_offload)) {
        const gguf::TensorInfo& t = *file.find_tensor(name);
        backend::Buffer& b = buffers_.emplace_back(
            dev.alloc(memory::pool_names::kWeights, t.n_bytes + kWeightSkew, name + " on " + dev.name()));
        const auto skew = reinterpret_cast<uintptr_t>(t.data.data()) % kWeightSkew;
        std::byte* copy = static_cast<std::byte*>(b.data()) + skew;
        dev.copy_to_device(copy, t.data.data(), t.n_bytes);
        copies_[t.data.data()] = copy;
        // The host still reads these: it embeds with token_embd, its layers rotate with rope_freqs
        // (or LongRoPE's factors).
        if (name == "token_embd.weight" || name == "rope_freqs.weight" || name == "rope_factors_long.weight" ||
            name == "rope_factors_short.weight")
            continue;
        ranges_.push_back({file.data_offset() + t.offset, t.n_bytes});
    }
    dev.synchronize();
    // Neighbouring tensors (apart by their alignment padding at most) as one range, so the pages
    // between them go back too and prefault does not touch them.
    std::sort(ranges_.begin(), ranges_.end(),
              [](const FileRange& a, const FileRange& b) { return a.offset < b.offset; });
    std::vector<FileRange> merged;
    for (const FileRange& r : ranges_) {
        if (!merged.empty() && r.offset <= merged.back().offset + merged.back().length + file.alignment()) {
            merged.back().length = std::max(merged.back().length, r.offset + r.length - merged.back().offset);
        } else {
            merged.push_back(r);
        }
    }
    ranges_ = std::move(merged);
    if (release) {
        for (const FileRange& r : ranges_) mapping->release(r.offset, r.length);
    }
}

// One memory: the device reads the tensors where the file's bytes are, through the ranges
// Backend::map_host() maps: whole pages (within the file's bytes), neighbours that share a page
// merged, so that no page is mapped twice.
void DeviceWeights::map_in_place(const gguf::GgufFile& file, const Hparams& hp, const Placement& placement) {
    const auto page = static_cast<uintptr_t>(io::MappedFile::page_size());
    const auto file_begin = reinterpret_cast<uintptr_t>(file.bytes().data());
    const uintptr_t file_end = file_begin + file.bytes().size();
    struct Span {
        uintptr_t begin, end;
        std::vector<const std::byte*> tensors;
    };
    std::vector<Span> spans;
    const int n_offload = hp.n_layer - placement.first_device_layer + (placement.output_on_device ? 1 : 0);
    for (const std::string& name : device_tensor_names(file, hp, n_offload)) {
        const gguf::TensorInfo& t = *file.find_tensor(name);
        const auto at = reinterpret_cast<uintptr_t>(t.data.data());
        spans.push_back({std::max(file_begin, at / page * page),
                         std::min(file_end, (at + t.n_bytes + page - 1) / page * page),
                         {t.data.data()}});
    }
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    std::vector<Span> merged;
    for (Span& s : spans) {
        if (!merged.empty() && s.begin <= merged.back().end) {
            merged.back().end = std::max(merged.back().end, s.end);
            merged.back().tensors.insert(merged.back().tensors.end(), s.tensors.begin(), s.tensors.end());
        } else {
            merged.push_back(std::move(s));
        }
    }
    for (const Span& s : merged) {
        const auto* host = reinterpret_cast<const std::byte*>(s.begin);
        const auto* mapped =
            s.end > s.begin ? static_cast<const std::byte*>(mappings_.map(*placement.device, host, s.end - s.begin))
                            : host;
        for (const std::byte* t : s.tensors) copies_[t] = mapped + (t - host);
    }
}

const void* DeviceWeights::HostMappings::map(backend::Backend& device, const void* host, size_t bytes) {
    const void* mapped = device.map_host(host, bytes);
    device_ = &device;
    hosts_.push_back(host);
    return mapped;
}

void DeviceWeights::HostMappings::reset() noexcept {
    for (const void* h : hosts_) device_->unmap_host(h);
    hosts_.clear();
    device_ = nullptr;
}

const void* DeviceWeights::find(const void* host) const {
    if (host == nullptr) return nullptr;
    const auto it = copies_.find(host);
    if (it == copies_.end()) throw std::logic_error("DeviceWeights: a weight of an offloaded layer was not copied");
    return it->second;
}

uint64_t DeviceWeights::bytes() const {
    uint64_t n = 0;
    for (const backend::Buffer& b : buffers_) n += b.charged_bytes();
    return n;
}

}  // namespace fitllm::model
