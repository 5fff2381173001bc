#pragma once
// Layers on a device (docs/architecture.md, idea 6; model::LoadOptions::offload): which layers run where, the
// device's copies of their weights, and the bytes a plan must count for them. Internal to model/,
// except the *_bytes functions, which memory::plan mirrors.
//
// As llama.cpp's -ngl: the last n_offload_layers layers run on the device; more than n_layer also
// puts the output layer (output_norm, output matrix) there. The token embedding stays on the host.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "model/model.h"
#include "model/tensor_override.h"

namespace fitllm::model {

struct Placement {
    backend::Backend* device = nullptr;  // nullptr: everything on the host
    int first_device_layer = 0;          // layers [first_device_layer, n_layer) run on the device
    bool output_on_device = false;
    bool kv_on_device = false;  // the device layers' K/V in the device's memory
    // Per layer (n_layer, or empty: none): the routed-expert block of an offloaded layer (router and
    // ffn_{gate,up,down}_exps) stays in host memory and runs on the host (experts_on_host()); an
    // offloaded layer without the flag runs its experts on the device (model/moe.h
    // moe_experts_on_device), routed on the host (is_router_tensor).
    std::vector<bool> experts_on_host;
    // Other weight matrices of offloaded layers that stay in host memory (host_kept_tensors()): the
    // device's Exec multiplies by them on the host (its input rows copied there, the product back).
    std::vector<std::string> host_matrices;
    bool on_device(int il) const { return device != nullptr && il >= first_device_layer; }
    bool host_experts(int il) const {
        return il >= 0 && static_cast<size_t>(il) < experts_on_host.size() && experts_on_host[size_t(il)];
    }
};

// Throws std::invalid_argument for n_offload_layers < 0, a count without a device, streamed
// layers that are not among the layers left on the host (n_streamed <= n_layer - offloaded), or
// tensor overrides experts_on_host() refuses.
Placement place_layers(const gguf::GgufFile& file, const Hparams& hp, const LoadOptions& options);

// The names of the file's tensors, in its order.
std::vector<std::string> tensor_names(const gguf::GgufFile& file);

// A tensor of a layer's routed-expert block: blk.<i>.ffn_{gate,up,down}_exps.weight and the router
// blk.<i>.ffn_gate_inp.weight (with its selection bias exp_probs_b.bias where a file has one, and
// gpt-oss's router and per-expert biases, ffn_gate_inp.bias and ffn_{gate,up,down}_exps.bias).
bool is_routed_block_tensor(std::string_view name);

// The router of a layer's routed-expert block: blk.<i>.ffn_gate_inp.weight (gpt-oss's bias
// ffn_gate_inp.bias, a selection bias exp_probs_b.bias). An offloaded layer's router stays in host
// memory wherever its experts run: the host routes, from the device's hidden state when the experts
// are on the device, so the experts chosen are the CPU run's.
bool is_router_tensor(std::string_view name);

// A tensor's name and dimensions (a weight matrix has 2 or more), in the file's order.
struct TensorEntry {
    std::string name;
    int n_dims = 1;
};
std::vector<TensorEntry> tensor_entries(const gguf::GgufFile& file);

// What tensor overrides (-ot REGEX=CPU, --cpu-moe) keep on the host of what -ngl offloads.
struct HostKept {
    std::vector<bool> experts;          // per layer (n_layer): its routed-expert block (with its router)
    std::vector<std::string> matrices;  // other weight matrices (2-D and more) of offloaded layers
    bool output = false;                // the output matrix: the output layer (norm too) runs on the host
};

// Which tensors of the last n_offload_layers layers (on device `device_name`; empty: none) stay on
// the host under `overrides` (tensor_override.h; the first rule that matches a name decides):
//  - a layer's routed-expert block, all of it (its three ffn_{gate,up,down}_exps tensors, and the
//    router with them: the host routes, so the experts chosen are the CPU run's on any device);
//  - any other weight matrix of an offloaded layer (attn_q, ffn_down, ..., '.*=CPU' all of them):
//    the device multiplies by it on the host, everything else of the layer (norms, RoPE, the KV
//    store, attention, element-wise ops) stays on the device;
//  - the output matrix (output.weight, or token_embd.weight when tied): the output layer stays on
//    the host.
// 1-D tensors (norm weights, biases) and the global tensors the layers read (rope_freqs) follow
// their layer whatever a rule says. Throws std::invalid_argument naming the rule's flag and
// pattern for a device that is neither CPU nor device_name, a rule that keeps some of a layer's
// expert tensors but not all three, and one that sends a tensor of a layer left on the host to the
// device (-ngl moves whole layers).
HostKept host_kept_tensors(const std::vector<TensorEntry>& tensors, const Hparams& hp, int n_offload_layers,
                           std::string_view device_name, const std::vector<TensorOverride>& overrides);

// host_kept_tensors(...).experts for tensors known by name only (each counted as a matrix).
std::vector<bool> experts_on_host(const std::vector<std::string>& tensor_names, const Hparams& hp, int n_offload_layers,
                                  std::string_view device_name, const std::vector<TensorOverride>& overrides);

// The device's copies of the tensors it needs, one Buffer each (charged to its "weights" pool),
// found by the address of their mapped bytes (a unified device's "copies" are the mapped tensors
// themselves, read through Backend::map_host: nothing copied, charged or given back). The mapped pages of the copied
// tensors are given back (io::MappedFile::release, file mappings only), except the token embedding's and rope_freqs'
// (the host still reads them).
class DeviceWeights {
public:
    DeviceWeights() = default;
    // Copies "blk.<il>.*" for the device's layers (less the routed-expert blocks the placement keeps
    // on the host: on_device() gives their mapped address back), and output_norm / the output matrix (token_embd
    // when the file has no output.weight) when the output is on the device, and rope_freqs.weight
    // for a llama file that has it. memory::BudgetError when the device has no room.
    DeviceWeights(const gguf::GgufFile& file, const Hparams& hp, const Placement& placement);

    // The device copy of the tensor whose mapped data starts at `host`; nullptr stays nullptr.
    // Throws std::logic_error for an address that was not copied.
    template <class T>
    const T* on_device(const T* host) const {
        return static_cast<const T*>(find(host));
    }
    // The copied tensors' bytes in the file (prefault leaves them alone).
    const std::vector<FileRange>& ranges() const { return ranges_; }
    // True when `p` lies in a weight matrix the placement keeps on the host (Placement::
    // host_matrices; a view of part of one, e.g. Phi-3's fused QKV rows, too).
    bool on_host(const void* p) const {
        if (host_ranges_.empty()) return false;
        const auto* b = static_cast<const std::byte*>(p);
        auto it = std::upper_bound(host_ranges_.begin(), host_ranges_.end(), b,
                                   [](const std::byte* v, const HostRange& r) { return v < r.begin; });
        return it != host_ranges_.begin() && b < std::prev(it)->end;
    }
    uint64_t bytes() const;  // charged to the device's "weights" pool

private:
    // The ranges a unified device mapped (Backend::map_host), unmapped when they go.
    class HostMappings {
    public:
        HostMappings() = default;
        HostMappings(HostMappings&& o) noexcept
            : device_(std::exchange(o.device_, nullptr)), hosts_(std::move(o.hosts_)) {}
        HostMappings& operator=(HostMappings&& o) noexcept {
            if (this != &o) {
                reset();
                device_ = std::exchange(o.device_, nullptr);
                hosts_ = std::move(o.hosts_);
            }
            return *this;
        }
        ~HostMappings() { reset(); }
        const void* map(backend::Backend& device, const void* host, size_t bytes);

    private:
        void reset() noexcept;
        backend::Backend* device_ = nullptr;
        std::vector<const void*> hosts_;
    };

    // std::invalid_argument naming the first matrix bound for the device whose type its matmul
    // does not take (Backend::matmul_supports), before anything is copied.
    static void refuse_unsupported_matrices(const gguf::GgufFile& file, const Hparams& hp, const Placement& placement);
    void map_in_place(const gguf::GgufFile& file, const Hparams& hp, const Placement& placement);
    void keep_on_host(const gguf::GgufFile& file, const Hparams& hp, const Placement& placement);
    const void* find(const void* host) const;
    struct HostRange {
        const std::byte* begin;
        const std::byte* end;
    };
    std::vector<HostRange> host_ranges_;  // sorted by begin
    HostMappings mappings_;
    std::vector<backend::Buffer> buffers_;
    std::unordered_map<const void*, const void*> copies_;
    std::vector<FileRange> ranges_;
};

// A copy sits at the same offset modulo kWeightSkew as the mapped tensor (its buffer has that many
// bytes more): the CPU's SIMD dot kernels peel to the weight's alignment, so the order of their
// sums, and the last bits of the result, depend on it; this way the virtual device gives the host's
// bits.
inline constexpr size_t kWeightSkew = 64;

// The layer_device list make_cache() gives kv::ModelCache (and a plan gives
// kv::ModelCache::bytes_per_device): 1 for the offloaded layers when offload_kv, else 0.
std::vector<int> cache_layer_devices(const Hparams& hp, int n_offload_layers, bool offload_kv);

// The names of the tensors DeviceWeights copies (for plans): those of the offloaded layers less the
// routed-expert blocks that experts_on_host (n_layer flags, or empty) keeps on the host and less the
// routers (is_router_tensor: on the host always).
std::vector<std::string> device_tensor_names(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers,
                                             const std::vector<bool>& experts_on_host = {});
// The same less everything `kept` keeps on the host (its matrices; the output layer when kept.output).
std::vector<std::string> device_tensor_names(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers,
                                             const HostKept& kept);
// What the device's "weights" pool holds for n_offload_layers: every tensor of
// device_tensor_names(), device_copy_bytes() of each. A unified device copies nothing: 0.
uint64_t device_weight_bytes(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers, bool unified = false,
                             const std::vector<bool>& experts_on_host = {});
uint64_t device_weight_bytes(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers, bool unified,
                             const HostKept& kept);
// The device buffer of one copied tensor of n_bytes: n_bytes + kWeightSkew rounded up to
// backend::kBufferAlign.
uint64_t device_copy_bytes(uint64_t n_bytes);
// What the device's "scratch" pool holds for batches of up to n_tok tokens of which up to n_out
// want logits (the virtual device's op scratch aside): the activations, n_out logits rows
// when the output is on the device (n_offload_layers > n_layer and not output_on_host), and, when
// some offloaded layer runs its routed experts there (experts_on_device), their buffers for one FFN
// slice (model/moe.h DeviceMoeBuffers).
uint64_t device_scratch_bytes(const Hparams& hp, int n_offload_layers, int n_tok, int n_out,
                              bool output_on_host = false, bool experts_on_device = false);

}  // namespace fitllm::model
