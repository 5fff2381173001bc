#pragma once
// llama.cpp's file types (`general.file_type`, enum llama_ftype): the quantization mix a
// file was made with, e.g. 15 -> "Q4_K_M".
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fitllm::quant {

// "Q4_K_M" for 15, "F16" for 1, ...; names of removed ids carry a "(removed)" note and
// unknown ids give nullopt. The GUESSED flag (1024) adds " (guessed)".
std::optional<std::string> file_type_name(uint32_t file_type);

// The inverse, case-insensitive; accepts "Q4_K_M" and "MOSTLY_Q4_K_M".
std::optional<uint32_t> file_type_from_name(std::string_view name);

}  // namespace fitllm::quant
