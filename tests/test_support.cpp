#include "test_support.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace fitllm::test {

namespace fs = std::filesystem;

fs::path source_dir() {
    return FITLLM_SOURCE_DIR;
}

std::optional<fs::path> demo_model() {
    fs::path p = std::getenv("FITLLM_DEMO_MODEL") ? fs::path(std::getenv("FITLLM_DEMO_MODEL"))
                                                  : source_dir() / "models" / "gemma-3-270m-q4_k_m.gguf";
    if (fs::exists(p)) return p;
    return std::nullopt;
}

fs::path vocab_dir() {
    return source_dir() / "tests" / "data" / "vocab";
}

std::optional<fs::path> python() {
    fs::path p = std::getenv("FITLLM_PYTHON") ? fs::path(std::getenv("FITLLM_PYTHON"))
                                              : source_dir() / ".venv" / "bin" / "python";
    if (fs::exists(p)) return p;
    return std::nullopt;
}

HttpResult http_request(int port, const std::string& method, const std::string& path, const std::string& body,
                        int timeout_ms) {
    HttpResult r;
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return r;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
        const std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                                    "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                                    "\r\n\r\n" + body;
        size_t sent = 0;
        while (sent < request.size()) {
            const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
            if (n <= 0) break;
            sent += static_cast<size_t>(n);
        }
        char buf[4096];
        pollfd p{fd, POLLIN, 0};
        while (::poll(&p, 1, timeout_ms) > 0) {
            const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            r.response.append(buf, static_cast<size_t>(n));
        }
    }
    ::close(fd);
    if (r.response.rfind("HTTP/1.1 ", 0) == 0) r.status = std::atoi(r.response.c_str() + 9);
    return r;
}

TempDir::TempDir() {
    std::string templ = (fs::temp_directory_path() / "fitllm-test-XXXXXX").string();
    if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
}

TempDir::~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
}

void write_file(const fs::path& path, std::span<const std::byte> bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::vector<std::byte> read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(chars.size());
    std::memcpy(out.data(), chars.data(), chars.size());
    return out;
}

CommandResult run_command(const std::string& command) {
    FILE* pipe = popen(command.c_str(), "r");
    if (!pipe) throw std::runtime_error("popen failed: " + command);
    std::string output;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), n);
    const int status = pclose(pipe);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace fitllm::test
