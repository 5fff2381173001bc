#pragma once
// Shared helpers for the test suite: where the fixtures live, temp files, running Python tools.
#include <cstddef>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace fitllm::test {

std::filesystem::path source_dir();
// The demo model (Gemma 3 270M Q4_K_M) as set up by scripts/setup.sh; nullopt when absent.
// FITLLM_DEMO_MODEL overrides the location.
std::optional<std::filesystem::path> demo_model();
// The tokenizer test vocabularies and their vectors (tests/data/vocab/, from llama.cpp).
std::filesystem::path vocab_dir();
// The project venv's python (FITLLM_PYTHON overrides); nullopt when absent.
std::optional<std::filesystem::path> python();

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::filesystem::path& path() const { return path_; }
    std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

private:
    std::filesystem::path path_;
};

void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes);
std::vector<std::byte> read_file(const std::filesystem::path& path);

// One HTTP/1.1 request to 127.0.0.1:port over a fresh connection ("Connection: close"): the
// status code (0 when there was no answer within timeout_ms) and the whole response as it came,
// headers and body (a stream's events included).
struct HttpResult {
    int status = 0;
    std::string response;
};
HttpResult http_request(int port, const std::string& method, const std::string& path, const std::string& body = {},
                        int timeout_ms = 120000);

// Runs a shell command; returns its exit status and stdout.
struct CommandResult {
    int status;
    std::string output;
};
CommandResult run_command(const std::string& command);

// What f throws as an E, its message: "(no exception)" when f returns (other exceptions pass).
template <typename E = std::exception, typename F>
std::string thrown_message(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    }
    return "(no exception)";
}

// The fitllm executable of this build, for the tests that run it as a user would.
inline std::string fitllm_exe() {
    return (std::filesystem::path(FITLLM_BINARY_DIR) / "fitllm").string();
}

}  // namespace fitllm::test
