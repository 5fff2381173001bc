#pragma once
// llama.cpp's shared libraries as shipped by PyPI's llama-cpp-python in the project venv,
// opened with dlopen so that benchmarks can call them in the same run as fitllm.
#include <string>

namespace fitllm::bench {

// Directory holding libggml-base.so etc.: $FITLLM_LLAMA_CPP_LIB, else the venv's
// site-packages/llama_cpp/lib. Empty when not found.
std::string llama_cpp_lib_dir();
// dlopen()s lib (e.g. "libggml-base.so") from that directory; nullptr with a message on stderr.
void* open_llama_cpp_lib(const std::string& lib);
// dlsym that returns nullptr with a message on stderr.
void* find_symbol(void* handle, const char* name);

}  // namespace fitllm::bench
