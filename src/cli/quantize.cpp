// fitllm quantize IN.gguf OUT.gguf TYPE [options]: llama-quantize's job, with or without an
// importance matrix (gguf/gguf_quantize.h, gguf/imatrix.h).
#include "quant/quantize.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "gguf/gguf_quantize.h"
#include "ops/thread_pool.h"
#include "quant/file_type.h"
#include "quant/quantize_ref.h"

namespace fitllm::cli {
namespace {

quant::GgmlType parse_type(const std::string& option, const std::string& text) {
    const std::optional<quant::GgmlType> t = quant::type_from_name(text);
    if (!t) throw UsageError(option + ": unknown tensor type '" + text + "' (q8_0, q4_k, f16, ...)");
    return *t;
}

}  // namespace

int run_quantize(const std::vector<std::string>& args) {
    std::string input, output, type_name, imatrix;
    gguf::QuantizeParams params;
    params.threads = 0;
    bool force = false, dry_run = false;
    std::vector<std::string> include_weights, exclude_weights;
    std::string types;
    for (const std::string& s : gguf::supported_file_types()) types += (types.empty() ? "" : ", ") + s;
    ArgParser p(
        "fitllm quantize [options] IN.gguf OUT.gguf TYPE",
        "Rewrite a GGUF model with its weight matrices quantized to TYPE, choosing each tensor's type by\n"
        "llama.cpp's rules (llama-quantize's: norms and 1-D tensors stay, output.weight in Q6_K, the\n"
        "k-quant mixes of Q4_K_M and others), with the bytes llama-quantize writes. Streams tensor by\n"
        "tensor. TYPE: " +
            types +
            " (Q4_K = Q4_K_M, Q5_K = Q5_K_M, Q3_K = Q3_K_M; a number is a llama_ftype).\n"
            "IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ3_XXS, IQ3_XS and Q2_K_S need --imatrix, as in\n"
            "llama-quantize; IQ3_S and IQ3_M do not. With --imatrix (llama-imatrix's file, GGUF or legacy .dat)\n"
            "the rows of Q4_0, Q4_1, Q5_0, Q5_1, the k-quants and the i-quants are fitted to it, as\n"
            "llama-quantize --imatrix does, byte for byte.");
    p.positional("IN.gguf", "the model to read (F32, F16 or BF16 weights; quantized ones with --allow-requantize)",
                 &input);
    p.positional("OUT.gguf", "the file to write (refused if it exists, unless --force)", &output);
    p.positional("TYPE", "the file type: Q4_K_M, Q8_0, F16, ...", &type_name);
    p.flag("--allow-requantize", &params.allow_requantize,
           "accept already-quantized tensors (dequantized, then quantized: quality drops)");
    p.flag("--leave-output-tensor", &params.leave_output_tensor, "keep output.weight as it is");
    p.flag("--pure", &params.pure, "every quantized tensor in TYPE's type: no k-quant mixes, no Q6_K output");
    p.option("--output-tensor-type", "TYPE", "the type of output.weight (a tensor type: q8_0, f16, ...)",
             [&](const std::string& v) { params.output_tensor_type = parse_type("--output-tensor-type", v); });
    p.option("--token-embedding-type", "TYPE", "the type of token_embd.weight",
             [&](const std::string& v) { params.token_embedding_type = parse_type("--token-embedding-type", v); });
    p.option("--tensor-type", "PATTERN=TYPE",
             "tensors whose name matches the regex PATTERN get TYPE (repeatable; the first match wins)",
             [&](const std::string& v) {
                 const size_t eq = v.rfind('=');
                 if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
                     throw UsageError("--tensor-type: expected PATTERN=TYPE, got '" + v + "'");
                 params.tensor_types.emplace_back(v.substr(0, eq), parse_type("--tensor-type", v.substr(eq + 1)));
             });
    p.option("--imatrix", "FILE", "an importance matrix from llama-imatrix (GGUF, or the legacy .dat format)",
             &imatrix);
    p.option("--include-weights", "NAME", "use the imatrix only for tensors whose name contains NAME (repeatable)",
             [&](const std::string& v) { include_weights.push_back(v); });
    p.option("--exclude-weights", "NAME", "do not use the imatrix for tensors whose name contains NAME (repeatable)",
             [&](const std::string& v) { exclude_weights.push_back(v); });
    p.option("-t, --threads", "N", "threads quantizing rows (default: the physical cores)", &params.threads);
    p.flag("--force", &force, "overwrite OUT.gguf if it exists (never the input)");
    p.flag("--dry-run", &dry_run, "print each tensor's type and the sizes, write nothing");
    if (!p.parse(args)) return 0;

    if (!include_weights.empty() && !exclude_weights.empty())
        throw UsageError("--include-weights and --exclude-weights: give one or the other");
    if (imatrix.empty() && (!include_weights.empty() || !exclude_weights.empty()))
        throw UsageError("--include-weights / --exclude-weights need --imatrix");
    const std::optional<uint32_t> ftype = gguf::parse_file_type(type_name);
    if (!ftype) throw UsageError("TYPE: unknown file type '" + type_name + "' (one of " + types + ")");
    params.ftype = *ftype;
    gguf::check_file_type(params.ftype);
    if (params.threads < 0) throw UsageError("--threads: must be >= 0");
    if (params.threads == 0) params.threads = ops::physical_core_count();

    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(input, ec)) throw Error(input + ": no such file");
    if (input == output || (fs::exists(output, ec) && fs::equivalent(input, output, ec)))
        throw UsageError("OUT.gguf is the input file; write the output elsewhere");
    if (!dry_run && fs::exists(output, ec) && !force)
        throw UsageError(output + " exists; pass --force to overwrite it");

    gguf::ImportanceMatrix importance;
    if (!imatrix.empty()) {
        importance = gguf::load_imatrix(imatrix);
        const size_t loaded = importance.weights.size();
        gguf::filter_imatrix(importance, include_weights, exclude_weights);
        std::fprintf(stderr, "imatrix %s: %zu entries%s, %lld chunks%s%s\n", imatrix.c_str(), importance.weights.size(),
                     loaded != importance.weights.size() ? (" of " + std::to_string(loaded)).c_str() : "",
                     static_cast<long long>(importance.chunk_count), importance.legacy ? " (legacy format)" : "",
                     importance.datasets.empty() ? "" : (", dataset " + importance.datasets[0]).c_str());
        params.imatrix = &importance;
    }

    if (dry_run) {
        const gguf::GgufFile in = gguf::GgufFile::open(input);
        const std::vector<gguf::TensorChoice> plan = gguf::plan_quantization(in, params);
        uint64_t bytes_in = 0, bytes_out = 0;
        for (size_t i = 0; i < plan.size(); ++i) {
            const gguf::TensorInfo& t = in.tensors()[i];
            const uint64_t out_bytes = *quant::row_bytes(plan[i].to, t.ne[0]) * (t.n_elements / t.ne[0]);
            std::printf("[%4zu/%4zu] %-40s %6s -> %-6s%s%s\n", i + 1, plan.size(), plan[i].name.c_str(),
                        std::string(quant::traits(plan[i].from).name).c_str(),
                        std::string(quant::traits(plan[i].to).name).c_str(), plan[i].fallback ? " (fallback)" : "",
                        plan[i].imatrix ? " (imatrix)" : "");
            bytes_in += t.n_bytes;
            bytes_out += out_bytes;
        }
        std::printf("tensor data: %.2f MiB -> %.2f MiB\n", bytes_in / 1048576.0, bytes_out / 1048576.0);
        return 0;
    }

    const auto start = std::chrono::steady_clock::now();
    size_t n_tensors = 0;
    const gguf::QuantizeResult r =
        gguf::quantize_file(input, output, params, [&](size_t i, const gguf::TensorChoice& c) {
            (void)i;
            ++n_tensors;
            std::fprintf(stderr, "[%4zu] %-40s %6s -> %s%s%s\n", n_tensors, c.name.c_str(),
                         std::string(quant::traits(c.from).name).c_str(), std::string(quant::traits(c.to).name).c_str(),
                         c.fallback ? " (fallback: row length)" : "",
                         c.imatrix && quant::uses_importance(c.to) ? " (imatrix)" : "");
        });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("wrote %s: %s, %zu tensors, tensor data %.2f MiB -> %.2f MiB", output.c_str(),
                quant::file_type_name(params.ftype).value_or("?").c_str(), r.tensors.size(), r.bytes_in / 1048576.0,
                r.bytes_out / 1048576.0);
    if (r.n_fallback > 0) std::printf(", %d fallback(s)", r.n_fallback);
    std::printf("\n%.1f s, %d threads, peak RSS %.1f MiB\n", seconds, params.threads, peak_rss_kib() / 1024.0);
    return 0;
}

}  // namespace fitllm::cli
