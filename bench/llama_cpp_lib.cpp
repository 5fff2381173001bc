#include "llama_cpp_lib.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace fitllm::bench {

std::string llama_cpp_lib_dir() {
    if (const char* env = std::getenv("FITLLM_LLAMA_CPP_LIB")) return env;
    namespace fs = std::filesystem;
    const fs::path lib_root = fs::path(FITLLM_SOURCE_DIR) / ".venv" / "lib";
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(lib_root, ec)) {
        const fs::path dir = entry.path() / "site-packages" / "llama_cpp" / "lib";
        if (fs::exists(dir / "libggml-base.so")) return dir.string();
    }
    return {};
}

void* open_llama_cpp_lib(const std::string& lib) {
    const std::string dir = llama_cpp_lib_dir();
    if (dir.empty()) {
        std::fprintf(stderr,
                     "llama.cpp not found: run scripts/setup.sh --oracle (installs llama-cpp-python) "
                     "or set FITLLM_LLAMA_CPP_LIB\n");
        return nullptr;
    }
    void* h = dlopen((dir + "/" + lib).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) std::fprintf(stderr, "dlopen %s/%s: %s\n", dir.c_str(), lib.c_str(), dlerror());
    return h;
}

void* find_symbol(void* handle, const char* name) {
    void* s = dlsym(handle, name);
    if (!s) std::fprintf(stderr, "dlsym %s: %s\n", name, dlerror());
    return s;
}

}  // namespace fitllm::bench
