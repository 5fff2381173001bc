#pragma once
// Layers on a device (docs/architecture.md, idea 6; model::LoadOptions::offload): which layers run where, the
// device's copies of their weights, and the bytes a plan must count for them. Internal to model/,
// except the *_bytes functions, which memory::plan mirrors.
//
// As llama.cpp's -ngl: the last n_offload_layers layers run on the device; more than n_layer also
// puts the output layer (output_norm, output matrix) there. The token embedding stays on the host.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "model/model.h"

namespace fitllm::model {

struct Placement {
    backend::Backend* device = nullptr;  // nullptr: everything on the host
    int first_device_layer = 0;          // layers [first_device_layer, n_layer) run on the device
    bool output_on_device = false;
    bool kv_on_device = false;  // the device layers' K/V in the device's memory
    bool on_device(int il) const { return device != nullptr && il >= first_device_layer; }
};

// Throws std::invalid_argument for n_offload_layers < 0, a count without a device, or streamed
// layers that are not among the layers left on the host (n_streamed <= n_layer - offloaded).
Placement place_layers(const Hparams& hp, const LoadOptions& options);

// The device's copies of the tensors it needs, one Buffer each (charged to its "weights" pool),
// found by the address of their mapped bytes (a unified device's "copies" are the mapped tensors
// themselves, read through Backend::map_host: nothing copied, charged or given back). The mapped pages of the copied
// tensors are given back (io::MappedFile::release, file mappings only), except the token embedding's and rope_freqs'
// (the host still reads them).
class DeviceWeights {
public:
    DeviceWeights() = default;
    // Copies "blk.<il>.*" for the device's layers, and output_norm / the output matrix (token_embd
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

    void map_in_place(const gguf::GgufFile& file, const Hparams& hp, const Placement& placement);
    const void* find(const void* host) const;
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

// The names of the tensors DeviceWeights copies (for plans).
std::vector<std::string> device_tensor_names(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers);
// What the device's "weights" pool holds for n_offload_layers: every tensor of
// device_tensor_names(), its n_bytes + kWeightSkew rounded up to backend::kBufferAlign.
// A unified device copies nothing: 0.
uint64_t device_weight_bytes(const gguf::GgufFile& file, const Hparams& hp, int n_offload_layers, bool unified = false);
// What the device's "scratch" pool holds for batches of up to n_tok tokens of which up to n_out
// want logits (the virtual device's op scratch aside): the activations, and n_out logits rows
// when the output is on the device.
uint64_t device_scratch_bytes(const Hparams& hp, int n_offload_layers, int n_tok, int n_out);

}  // namespace fitllm::model
