#include "quant/file_type.h"

#include <array>

#include "util/text.h"

namespace fitllm::quant {
namespace {

constexpr uint32_t kGuessedFlag = 1024;

struct FileTypeName {
    uint32_t id;
    std::string_view name;
    bool removed = false;
};

constexpr std::array<FileTypeName, 41> kFileTypes = {{
    {0, "F32"},
    {1, "F16"},
    {2, "Q4_0"},
    {3, "Q4_1"},
    {4, "Q4_1_SOME_F16", true},
    {5, "Q4_2", true},
    {6, "Q4_3", true},
    {7, "Q8_0"},
    {8, "Q5_0"},
    {9, "Q5_1"},
    {10, "Q2_K"},
    {11, "Q3_K_S"},
    {12, "Q3_K_M"},
    {13, "Q3_K_L"},
    {14, "Q4_K_S"},
    {15, "Q4_K_M"},
    {16, "Q5_K_S"},
    {17, "Q5_K_M"},
    {18, "Q6_K"},
    {19, "IQ2_XXS"},
    {20, "IQ2_XS"},
    {21, "Q2_K_S"},
    {22, "IQ3_XS"},
    {23, "IQ3_XXS"},
    {24, "IQ1_S"},
    {25, "IQ4_NL"},
    {26, "IQ3_S"},
    {27, "IQ3_M"},
    {28, "IQ2_S"},
    {29, "IQ2_M"},
    {30, "IQ4_XS"},
    {31, "IQ1_M"},
    {32, "BF16"},
    {33, "Q4_0_4_4", true},
    {34, "Q4_0_4_8", true},
    {35, "Q4_0_8_8", true},
    {36, "TQ1_0"},
    {37, "TQ2_0"},
    {38, "MXFP4_MOE"},
    {39, "NVFP4"},
    {40, "Q1_0"},
}};

}  // namespace

std::optional<std::string> file_type_name(uint32_t file_type) {
    const bool guessed = (file_type & kGuessedFlag) != 0;
    const uint32_t id = file_type & ~kGuessedFlag;
    if (id >= kFileTypes.size()) return std::nullopt;
    std::string name(kFileTypes[id].name);
    if (kFileTypes[id].removed) name += " (removed)";
    if (guessed) name += " (guessed)";
    return name;
}

std::optional<uint32_t> file_type_from_name(std::string_view name) {
    if (name.size() > 7 && util::iequals(name.substr(0, 7), "MOSTLY_")) name.remove_prefix(7);
    if (util::iequals(name, "ALL_F32")) return 0;
    for (const FileTypeName& f : kFileTypes) {
        if (!f.removed && util::iequals(f.name, name)) return f.id;
    }
    return std::nullopt;
}

}  // namespace fitllm::quant
