#include "model/offload.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_set>

#include "io/mapped_file.h"
#include "model/activations.h"
#include "model/expert_cache.h"

namespace fitllm::model {

namespace {

HostKept kept_of(const Placement& p) {
    return HostKept{p.experts_on_host, p.host_matrices, false};  // n_offload counts the output layer when it is there
}

}  // namespace

Placement place_layers(const gguf::GgufFile& file, const Hparams& hp, const LoadOptions& options) {
    const int n = options.n_offload_layers;
    if (n < 0) throw std::invalid_argument("cannot offload " + std::to_string(n) + " layers");
    if (n > 0 && options.offload == nullptr) {
        throw std::invalid_argument("cannot offload " + std::to_string(n) + " layers: no device given");
    }
    Placement p;
    p.first_device_layer = hp.n_layer;
    if (n == 0 || options.offload == nullptr) {
        if (!options.tensor_overrides.empty())  // checks the rules (CPU only without a device)
            host_kept_tensors(tensor_entries(file), hp, 0, "", options.tensor_overrides);
        return p;
    }
    p.device = options.offload;
    p.first_device_layer = hp.n_layer - std::min(n, hp.n_layer);
    p.output_on_device = n > hp.n_layer;
    HostKept kept;
    if (!options.tensor_overrides.empty())
        kept = host_kept_tensors(tensor_entries(file), hp, n, p.device->name(), options.tensor_overrides);
    p.output_on_device = p.output_on_device && !kept.output;
    p.experts_on_host = std::move(kept.experts);
    p.host_matrices = std::move(kept.matrices);
    p.kv_on_device = options.offload_kv;
    if (options.n_streamed_layers > p.first_device_layer) {
        throw std::invalid_argument("cannot stream " + std::to_string(options.n_streamed_layers) + " layers with " +
                                    std::to_string(hp.n_layer - p.first_device_layer) + " of " +
                                    std::to_string(hp.n_layer) + " offloaded to " + p.device->name() + ": only the " +
                                    std::to_string(p.first_device_layer) + " layers left on the host can stream");
    }
    return p;
}

std::vector<std::string> tensor_names(const gguf::GgufFile& file) {
    std::vector<std::string> names;
    names.reserve(file.tensors().size());
    for (const gguf::TensorInfo& t : file.tensors()) names.emplace_back(t.name);
    return names;
}

std::vector<TensorEntry> tensor_entries(const gguf::GgufFile& file) {
    std::vector<TensorEntry> entries;
    entries.reserve(file.tensors().size());
    for (const gguf::TensorInfo& t : file.tensors()) entries.push_back({std::string(t.name), int(t.n_dims)});
    return entries;
}

bool is_routed_block_tensor(std::string_view name) {
    if (is_expert_tensor(name)) return true;
    if (!name.starts_with("blk.")) return false;
    return name.ends_with(".ffn_gate_inp.weight") || name.ends_with(".exp_probs_b.bias") ||
           name.ends_with(".ffn_gate_inp.bias") || name.ends_with(".ffn_gate_exps.bias") ||
           name.ends_with(".ffn_up_exps.bias") || name.ends_with(".ffn_down_exps.bias");  // gpt-oss's biases
}

bool is_router_tensor(std::string_view name) {
    return name.starts_with("blk.") && (name.ends_with(".ffn_gate_inp.weight") ||
                                        name.ends_with(".ffn_gate_inp.bias") || name.ends_with(".exp_probs_b.bias"));
}

namespace {

// The layer of "blk.<il>.<rest>", or -1.
int layer_of(std::string_view name) {
    if (name.substr(0, 4) != "blk.") return -1;
    int il = 0;
    size_t i = 4;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && il < 1'000'000; ++i) il = il * 10 + (name[i] - '0');
    if (i == 4 || i >= name.size() || name[i] != '.') return -1;
    return il;
}

std::string lower(std::string_view s) {
    std::string r(s);
    for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return r;
}

std::string rule_text(const TensorOverride& o) {
    return o.flag.empty() ? "'" + o.pattern + "=" + o.device + "'" : o.flag;
}

}  // namespace

std::vector<TensorOverride> parse_tensor_overrides(std::string_view list, std::string_view flag) {
    std::vector<TensorOverride> rules;
    size_t start = 0;
    while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        const std::string_view item = list.substr(start, comma - start);
        const size_t eq = item.rfind('=');
        const std::string where = std::string(flag) + " '" + std::string(item) + "'";
        if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
            throw std::invalid_argument(where + ": expected REGEX=DEVICE (DEVICE: CPU or the -ngl device's name), " +
                                        "several separated by commas");
        }
        TensorOverride o{std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)), where};
        try {
            const std::regex check(o.pattern);
        } catch (const std::regex_error& e) {
            throw std::invalid_argument(where + ": '" + o.pattern + "' is not a regular expression (" + e.what() + ")");
        }
        rules.push_back(std::move(o));
        start = comma + 1;
    }
    return rules;
}

std::vector<TensorOverride> cpu_moe_overrides(int n_layers) {
    if (n_layers < 0) return {{"\\.ffn_(up|down|gate)_exps", "CPU", "--cpu-moe"}};
    std::vector<TensorOverride> rules;
    for (int il = 0; il < n_layers; ++il) {
        rules.push_back({"blk\\." + std::to_string(il) + "\\.ffn_(up|down|gate)_exps", "CPU",
                         "--n-cpu-moe " + std::to_string(n_layers)});
    }
    return rules;
}

HostKept host_kept_tensors(const std::vector<TensorEntry>& tensors, const Hparams& hp, int n_offload_layers,
                           std::string_view device_name, const std::vector<TensorOverride>& overrides) {
    const std::string device = lower(device_name);
    const std::string device_base = lower(backend::strip_unified_suffix(device_name).first);
    std::vector<std::regex> patterns;
    std::vector<bool> to_host;
    for (const TensorOverride& o : overrides) {
        const std::string d = lower(o.device);
        if (d == "cpu") {
            to_host.push_back(true);
        } else if (!device.empty() && (d == device || d == device_base)) {
            to_host.push_back(false);
        } else {
            throw std::invalid_argument(rule_text(o) + ": unknown device '" + o.device + "': " +
                                        (device.empty()
                                             ? std::string("without an offload device (--device, -ngl) only CPU is one")
                                             : "CPU or " + std::string(device_name) + " (the -ngl device)"));
        }
        try {
            patterns.emplace_back(o.pattern);
        } catch (const std::regex_error& e) {
            throw std::invalid_argument(rule_text(o) + ": '" + o.pattern + "' is not a regular expression (" +
                                        e.what() + ")");
        }
    }
    const int n = std::max(n_offload_layers, 0);
    const int first = device.empty() ? hp.n_layer : hp.n_layer - std::min(n, hp.n_layer);
    const bool output_on_device = !device.empty() && n > hp.n_layer;
    bool has_output = false;
    for (const TensorEntry& t : tensors) has_output = has_output || t.name == "output.weight";
    const std::string output_matrix = has_output ? "output.weight" : "token_embd.weight";
    HostKept kept;
    kept.experts.assign(static_cast<size_t>(hp.n_layer), false);
    std::vector<bool>& host = kept.experts;
    std::vector<int> experts_kept(static_cast<size_t>(hp.n_layer), 0);  // of the three expert tensors
    std::vector<int> experts_in_file(static_cast<size_t>(hp.n_layer), 0);
    std::vector<const TensorOverride*> kept_by(static_cast<size_t>(hp.n_layer), nullptr);
    for (const TensorEntry& t : tensors) {
        const std::string& name = t.name;
        const int il = layer_of(name);
        const bool layer_tensor = il >= 0 && il < hp.n_layer;
        if (layer_tensor && is_expert_tensor(name)) ++experts_in_file[size_t(il)];
        size_t r = 0;
        while (r < patterns.size() && !std::regex_search(name, patterns[r])) ++r;
        if (r == patterns.size()) continue;
        const TensorOverride& o = overrides[r];
        const bool output_tensor = name == "output.weight" || name == "output_norm.weight";
        const bool on_device = layer_tensor ? il >= first : output_tensor && output_on_device;
        if (!to_host[r]) {
            if (on_device) continue;  // where -ngl puts it
            throw std::invalid_argument(
                rule_text(o) + " would put " + name + " on " + std::string(device_name) + ", but " +
                (layer_tensor ? "layer " + std::to_string(il) : std::string("it")) +
                " runs on the host: -ngl moves whole layers (the last N), and a rule may only keep tensors of "
                "offloaded layers on the host (=CPU)");
        }
        if (!layer_tensor) {
            // The output matrix (the token embedding when tied) keeps the output layer on the host.
            if (output_on_device && name == output_matrix) kept.output = true;
            continue;  // the rest outside the layers: on the host already, or read by the device's layers
        }
        if (il < first) continue;  // on the host already
        if (is_routed_block_tensor(name)) {
            host[size_t(il)] = true;
            if (is_expert_tensor(name)) ++experts_kept[size_t(il)];
            if (!kept_by[size_t(il)]) kept_by[size_t(il)] = &o;
            continue;
        }
        if (t.n_dims >= 2) kept.matrices.push_back(name);  // 1-D tensors follow their layer
    }
    for (int il = first; il < hp.n_layer; ++il) {
        const auto i = static_cast<size_t>(il);
        if (host[i] && (experts_kept[i] == 0 || experts_kept[i] < experts_in_file[i])) {
            throw std::invalid_argument(
                rule_text(*kept_by[i]) + " keeps " + std::to_string(experts_kept[i]) + " of the " +
                std::to_string(experts_in_file[i]) + " expert tensors of offloaded layer " + std::to_string(il) +
                " on the host: the routed experts stay together (ffn_{gate,up,down}_exps, with their router)");
        }
    }
    return kept;
}

std::vector<bool> experts_on_host(const std::vector<std::string>& names, const Hparams& hp, int n_offload_layers,
                                  std::string_view device_name, const std::vector<TensorOverride>& overrides) {
    std::vector<TensorEntry> tensors;
    tensors.reserve(names.size());
    for (const std::string& name : names) tensors.push_back({name, 2});
    return host_kept_tensors(tensors, hp, n_offload_layers, device_name, overrides).experts;
}

std::vector<int> cache_layer_devices(const Hparams& hp, int n_offload_layers, bool offload_kv) {
    std::vector<int> devices(static_cast<size_t>(hp.n_layer), 0);
    if (!offload_kv || n_offload_layers <= 0) return devices;
    for (int il = hp.n_layer - std::min(n_offload_layers, hp.n_layer); il < hp.n_layer; ++il)
        devices[static_cast<size_t>(il)] = 1;
    return devices;
}

std::vector<std::string> device_tensor_names(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers,
                                             const std::vector<bool>& experts_on_host) {
    return device_tensor_names(file, hp, n_offload_layers, HostKept{experts_on_host, {}, false});
}

std::vector<std::string> device_tensor_names(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers,
                                             const HostKept& kept) {
    const std::vector<bool>& experts_on_host = kept.experts;
    const std::unordered_set<std::string_view> host_matrices(kept.matrices.begin(), kept.matrices.end());
    std::vector<std::string> names;
    if (n_offload_layers <= 0) return names;
    const int first = hp.n_layer - std::min(n_offload_layers, hp.n_layer);
    for (const gguf::TensorInfo& t : file.tensors()) {
        const int il = layer_of(t.name);
        if (il < first || il >= hp.n_layer) continue;
        if (static_cast<size_t>(il) < experts_on_host.size() && experts_on_host[size_t(il)] &&
            is_routed_block_tensor(t.name))
            continue;                            // stays on the host
        if (is_router_tensor(t.name)) continue;  // the host routes (experts on the device too)
        if (host_matrices.contains(t.name)) continue;
        names.emplace_back(t.name);
    }
    if (n_offload_layers > hp.n_layer && !kept.output) {
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

uint64_t device_copy_bytes(uint64_t n_bytes) {
    return aligned(n_bytes + kWeightSkew);
}

uint64_t device_weight_bytes(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers, bool unified,
                             const std::vector<bool>& experts_on_host) {
    return device_weight_bytes(file, hp, n_offload_layers, unified, HostKept{experts_on_host, {}, false});
}

uint64_t device_weight_bytes(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers, bool unified,
                             const HostKept& kept) {
    if (unified) return 0;
    uint64_t bytes = 0;
    for (const std::string& name : device_tensor_names(file, hp, n_offload_layers, kept))
        bytes += device_copy_bytes(file.find_tensor(name)->n_bytes);
    return bytes;
}

uint64_t device_scratch_bytes(const Hparams& hp, int n_offload_layers, int n_tok, int n_out, bool output_on_host,
                              bool experts_on_device) {
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
    if (experts_on_device && hp.is_moe()) {  // DeviceMoeBuffers for one FFN slice
        const auto slice = static_cast<uint64_t>(std::min(ffn_slice_tokens(n_tok), std::max(n_tok, 0)));
        const auto E = static_cast<uint64_t>(hp.n_embd);
        const auto F = static_cast<uint64_t>(hp.n_ff_exp);
        const auto k = static_cast<uint64_t>(hp.n_expert_used);
        for (const uint64_t floats : {slice * E, slice * F, slice * F, k * slice * E})
            bytes += aligned(floats * sizeof(float));
    }
    if (n_offload_layers > hp.n_layer && !output_on_host && n_out > 0)
        bytes += aligned(static_cast<uint64_t>(n_out) * static_cast<uint64_t>(hp.n_vocab) * sizeof(float));
    return bytes;
}

DeviceWeights::DeviceWeights(const gguf::GgufFile& file, const Hparams& hp, const Placement& placement) {
    if (placement.device == nullptr) return;
    backend::Backend& dev = *placement.device;
    refuse_unsupported_matrices(file, hp, placement);
    if (dev.unified()) {
        map_in_place(file, hp, placement);
        return;
    }
    const int n_offload = hp.n_layer - placement.first_device_layer + (placement.output_on_device ? 1 : 0);
    // Giving pages back changes no content of a file mapping (they fault in again from the file);
    // a file read into memory would lose them, and other models may share it: left alone.
    auto* mapping = const_cast<io::MappedFile*>(file.mapping());
    const bool release = mapping != nullptr && mapping->is_file_mapping();
    keep_on_host(file, hp, placement);
    for (const std::string& name : device_tensor_names(file, hp, n_offload, kept_of(placement))) {
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

void DeviceWeights::refuse_unsupported_matrices(const gguf::GgufFile& file, const Hparams& hp,
                                                const Placement& placement) {
    const backend::Backend& dev = *placement.device;
    const int n_offload = hp.n_layer - placement.first_device_layer + (placement.output_on_device ? 1 : 0);
    const bool tied = file.find_tensor("output.weight") == nullptr;  // the output is token_embd
    for (const std::string& name : device_tensor_names(file, hp, n_offload, kept_of(placement))) {
        const gguf::TensorInfo& t = *file.find_tensor(name);
        // The matrices the device multiplies with: not the vectors, not the rope factors, and the
        // token embeddings only as a tied output (the host embeds).
        if (t.n_dims < 2 || name.starts_with("rope_") || (name == "token_embd.weight" && !tied)) continue;
        if (dev.matmul_supports(t.type)) continue;
        throw std::invalid_argument(file.source() + ": tensor '" + name + "' is " +
                                    std::string(quant::traits(t.type).name) + ", which " + dev.name() +
                                    " has no matmul for; keep it on the host (-ot '" + name +
                                    "=CPU', --cpu-moe for routed experts) or offload fewer layers (-ngl)");
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
    keep_on_host(file, hp, placement);
    for (const std::string& name : device_tensor_names(file, hp, n_offload, kept_of(placement))) {
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

// The routed-expert blocks and the matrices the placement keeps on the host: "copies" that are the
// mapped tensors (the matrices' ranges listed for on_host()).
void DeviceWeights::keep_on_host(const gguf::GgufFile& file, const Hparams& hp, const Placement& placement) {
    for (const gguf::TensorInfo& t : file.tensors()) {
        const int il = layer_of(t.name);
        if (il >= placement.first_device_layer && il < hp.n_layer &&
            ((placement.host_experts(il) && is_routed_block_tensor(t.name)) || is_router_tensor(t.name)))
            copies_[t.data.data()] = t.data.data();
    }
    for (const std::string& name : placement.host_matrices) {
        const gguf::TensorInfo& t = *file.find_tensor(name);
        copies_[t.data.data()] = t.data.data();
        host_ranges_.push_back({t.data.data(), t.data.data() + t.n_bytes});
    }
    std::sort(host_ranges_.begin(), host_ranges_.end(),
              [](const HostRange& a, const HostRange& b) { return a.begin < b.begin; });
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
