#include "cli/load_progress.h"

#include <unistd.h>

#include <utility>

#include "engine/prefault.h"

namespace fitllm::cli {
namespace {

std::string base_name(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

LoadProgress::LoadProgress(std::FILE* out, std::string name, bool enabled, double delay_s)
    : out_(out), name_(std::move(name)), enabled_(enabled), delay_s_(delay_s) {}

void LoadProgress::update(uint64_t done, uint64_t total) {
    if (!enabled_) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (!printed_ && elapsed < delay_s_) return;
    const int percent = total == 0 ? 100 : static_cast<int>(done * 100 / total);
    if (percent == last_percent_ && done < total) return;
    last_percent_ = percent;
    printed_ = true;
    constexpr double kMiB = 1024.0 * 1024.0;
    std::fprintf(out_, "\rloading %s: %3d%% (%.0f / %.0f MiB)", name_.c_str(), percent, done / kMiB, total / kMiB);
    if (done >= total) std::fprintf(out_, " in %.1f s\n", elapsed);
    std::fflush(out_);
}

void prefault_with_progress(gguf::GgufFile& file, const model::Model& model) {
    LoadProgress progress(stderr, base_name(file.source()), isatty(fileno(stderr)) != 0);
    engine::prefault(file, model, [&](uint64_t done, uint64_t total) { progress.update(done, total); });
}

}  // namespace fitllm::cli
