#include "cli/generation_options.h"

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

#include "kv/cache.h"
#include "memory/budget.h"
#include "quant/ggml_type.h"
#include "sampling/sampler.h"

namespace fitllm::cli {

float parse_float(const std::string& name, const std::string& text) {
    size_t used = 0;
    float v = 0.0f;
    try {
        v = std::stof(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != text.size()) throw UsageError(name + ": '" + text + "' is not a number");
    return v;
}

void add_sampling_options(ArgParser& p, sampling::SamplingParams& sp) {
    p.option("--temp", "T", "temperature; 0 or less: greedy (default 0.8)",
             [&sp](const std::string& v) { sp.temperature = parse_float("--temp", v); });
    p.option("--top-k", "K", "keep the K most likely tokens; 0: off (default 40)",
             [&sp](const std::string& v) { sp.top_k = static_cast<int32_t>(parse_integer("--top-k", v)); });
    p.option("--top-p", "P", "nucleus sampling; 1: off (default 0.95)",
             [&sp](const std::string& v) { sp.top_p = parse_float("--top-p", v); });
    p.option("--min-p", "P", "drop tokens below P times the most likely; 0: off (default 0.05)",
             [&sp](const std::string& v) { sp.min_p = parse_float("--min-p", v); });
    p.option("--seed", "S", "random seed (default: random)", [&sp](const std::string& v) {
        const long long s = parse_integer("--seed", v);
        if (s < 0) throw UsageError("--seed: '" + v + "' must not be negative");
        sp.seed = static_cast<uint64_t>(s);
    });
    p.option("--repeat-penalty", "R", "penalize repeats of the last 64 tokens; 1: off (default 1)",
             [&sp](const std::string& v) { sp.repeat_penalty = parse_float("--repeat-penalty", v); });
}

void validate_sampling_options(const sampling::SamplingParams& sp) {
    try {
        sampling::validate_sampling_params(sp);
    } catch (const sampling::SamplingError& e) {
        throw UsageError(e.what());
    }
}

namespace {

quant::GgmlType kv_type(const std::string& name, const std::string& value) {
    try {
        return kv::kv_type_from_name(value);
    } catch (const std::invalid_argument& e) {
        throw UsageError(name + ": " + e.what());
    }
}

bool quantized(quant::GgmlType t) {
    return t != quant::GgmlType::F32 && t != quant::GgmlType::F16 && t != quant::GgmlType::BF16;
}

}  // namespace

void add_kv_options(ArgParser& p, runtime::SessionParams& sp) {
    p.option("-ctk, --cache-type-k", "TYPE",
             "KV cache type of K: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (default f16)",
             [&sp](const std::string& v) { sp.type_k = kv_type("-ctk", v); });
    p.option("-ctv, --cache-type-v", "TYPE", "KV cache type of V, as -ctk (default f16)",
             [&sp](const std::string& v) { sp.type_v = kv_type("-ctv", v); });
    p.option("--no-kv-rotation", "", "store quantized K/V heads without the Hadamard rotation",
             [&sp](const std::string&) { sp.kv_rotation = false; });
    p.option("--kv-spill-dir", "DIR",
             "a directory on disk where the KV cache spills the layers that do not fit in --kv-resident: they "
             "stream through memory around their attention (slower decoding, same results)",
             &sp.kv_spill_dir);
    p.option("--kv-resident", "SIZE", "with --kv-spill-dir: the K/V bytes that may stay in memory (900M, 1.5G)",
             [&sp](const std::string& v) {
                 try {
                     sp.kv_resident_limit = memory::parse_size(v);
                 } catch (const memory::SizeError& e) {
                     throw UsageError(std::string("--kv-resident: ") + e.what());
                 }
             });
}

void add_context_shift_options(ArgParser& p, runtime::SessionParams& sp) {
    p.option("--context-shift", "",
             "when the context is full, drop the oldest half of the tokens after --keep and go on "
             "(default: stop)",
             [&sp](const std::string&) { sp.context_shift = true; });
    p.option("--keep", "N", "with --context-shift: the first N tokens always stay (default 0)", &sp.n_keep);
}

void validate_context_shift_options(const runtime::SessionParams& sp) {
    if (sp.n_keep < 0) throw UsageError("--keep: " + std::to_string(sp.n_keep) + " must not be negative");
    if (sp.context_shift && sp.n_keep >= sp.n_ctx - 1) {
        throw UsageError("--keep " + std::to_string(sp.n_keep) + " leaves no room to shift in -c " +
                         std::to_string(sp.n_ctx));
    }
}

void add_memory_options(ArgParser& p, MemoryOptions& mo) {
    p.option("--mem", "SIZE",
             "host memory budget: 900M, 1.5G, 2GiB, bytes (default: the cgroup limit, else MemAvailable, "
             "less 5% or 64 MiB); a plan over it is refused before loading",
             &mo.mem);
    p.flag("--fit", &mo.fit,
           "when the plan does not fit --mem: quantize the KV cache, stream weights, shorten the context (in "
           "that order) until it does, and say why");
    p.flag("--mlock", &mo.mlock, "lock the resident weights in RAM (within --mem and RLIMIT_MEMLOCK, or refused)");
    p.option("--stream-layers", "N",
             "stream the weights of the last N layers from the file instead of keeping them "
             "resident (default: none, or what --fit picks)",
             [&mo](const std::string& v) {
                 const long long n = parse_integer("--stream-layers", v);
                 if (n < 0 || n > 1'000'000) throw UsageError("--stream-layers: '" + v + "' must be 0 or more");
                 mo.stream_layers = static_cast<int>(n);
             });
    add_offload_options(p, mo);
}

void add_offload_options(ArgParser& p, MemoryOptions& mo) {
    p.option("--device", "NAME",
             "the device offloaded layers run on: cuda0 (cuda1, ...), or virtual (CPU-executed, with its own "
             "--vram budget, for testing placements), or virtual-unified (virtual with --unified); default: the "
             "first CUDA device when -ngl asks for one",
             &mo.device);
    p.option("-ngl, --n-gpu-layers", "N",
             "run the last N layers on the device (more than the model's layers: the output layer too; "
             "default with --device: as many as fit --vram)",
             [&mo](const std::string& v) {
                 const long long n = parse_integer("-ngl", v);
                 if (n < 0 || n > 1'000'000) throw UsageError("-ngl: '" + v + "' must be 0 or more");
                 mo.n_gpu_layers = static_cast<int>(n);
             });
    p.option("--vram", "SIZE",
             "the device's memory budget (default: its free memory; the virtual device: no limit; a unified "
             "device has none of its own: --mem)",
             &mo.vram);
    p.flag("--no-kv-offload", &mo.no_kv_offload, "keep the KV cache of offloaded layers in host memory");
    p.flag("--unified", &mo.unified,
           "the device shares the host's memory (integrated GPUs; automatic for a CUDA device that reports itself "
           "integrated): offloaded layers read their weights in place from the mapped file, no copies, and the "
           "device's KV cache and activations come out of --mem (one budget; default with it: every layer)");
}

std::string describe_kv(const runtime::SessionParams& sp) {
    const auto name = [](quant::GgmlType t) { return std::string(quant::type_name(static_cast<uint32_t>(t))); };
    std::string s = "K " + name(sp.type_k) + ", V " + name(sp.type_v);
    if (quantized(sp.type_k) || quantized(sp.type_v)) s += sp.kv_rotation ? ", rotated" : ", not rotated";
    return s;
}

}  // namespace fitllm::cli
