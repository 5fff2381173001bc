#pragma once
// Small text helpers shared by modules; header-only on purpose.
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace fitllm::util {

inline bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::toupper(static_cast<unsigned char>(a[i])) != std::toupper(static_cast<unsigned char>(b[i])))
            return false;
    }
    return true;
}

// "1.50 GiB", "12.0 MiB", "512 B": for humans; exact numbers go next to it where it matters.
inline std::string human_bytes(uint64_t bytes) {
    static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = static_cast<double>(bytes);
    int unit = 0;
    while (v >= 1024.0 && unit < 5) {
        v /= 1024.0;
        ++unit;
    }
    char buf[32];
    if (unit == 0)
        std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
    else
        std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : (v < 100 ? "%.1f %s" : "%.0f %s"), v, kUnits[unit]);
    return buf;
}

}  // namespace fitllm::util
