#include "memory/budget.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include "util/text.h"

namespace fitllm::memory {

namespace {

[[noreturn]] void bad_size(std::string_view text, const std::string& why) {
    throw SizeError("bad size '" + std::string(text) + "': " + why +
                    " (write bytes or a number with a binary unit: 900M, 1.5G, 2GiB, 512MiB, 1073741824)");
}

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

std::string trim(std::string_view s) {
    size_t b = 0, e = s.size();
    while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
    return std::string(s.substr(b, e - b));
}

std::optional<std::string> read_text(const std::filesystem::path& path) {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A cgroup limit file's value; nullopt for "max", v1's "no limit" (>= 2^62) or an unreadable file.
std::optional<uint64_t> read_limit(const std::filesystem::path& path) {
    const auto text = read_text(path);
    if (!text) return std::nullopt;
    const std::string v = trim(*text);
    if (v.empty() || v == "max") return std::nullopt;
    uint64_t n = 0;
    for (char c : v) {
        if (c < '0' || c > '9') return std::nullopt;
        if (n > (std::numeric_limits<uint64_t>::max() - 9) / 10) return std::nullopt;
        n = n * 10 + static_cast<uint64_t>(c - '0');
    }
    if (n >= (uint64_t{1} << 62)) return std::nullopt;
    return n;
}

// The smallest limit in `file` of dir and its parents up to (and including) root.
std::optional<uint64_t> smallest_limit_up(const std::filesystem::path& root, const std::string& cgroup_path,
                                          const std::string& file, std::filesystem::path* where) {
    std::optional<uint64_t> best;
    std::filesystem::path rel = std::filesystem::path(cgroup_path).relative_path();
    while (true) {
        const std::filesystem::path dir = rel.empty() ? root : root / rel;
        if (const auto v = read_limit(dir / file); v && (!best || *v < *best)) {
            best = v;
            *where = dir / file;
        }
        if (rel.empty()) break;
        rel = rel.parent_path();
    }
    return best;
}

}  // namespace

uint64_t parse_size(std::string_view text) {
    const std::string t = trim(text);
    if (t.empty()) bad_size(text, "empty");
    size_t i = 0;
    bool dot = false, digits = false;
    while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || (t[i] == '.' && !dot))) {
        dot = dot || t[i] == '.';
        digits = digits || t[i] != '.';
        ++i;
    }
    if (!digits) bad_size(text, t[0] == '-' ? "negative" : "no number");
    const std::string number = t.substr(0, i);
    const std::string unit = lower(trim(std::string_view(t).substr(i)));
    int shift = 0;
    if (unit.empty() || unit == "b") {
        shift = 0;
    } else {
        static constexpr std::string_view kUnits = "kmgtpe";
        const size_t u = kUnits.find(unit[0]);
        const std::string rest = unit.substr(1);
        if (u == std::string_view::npos || !(rest.empty() || rest == "b" || rest == "ib")) {
            bad_size(text, "unknown unit '" + unit + "'");
        }
        shift = 10 * static_cast<int>(u + 1);
    }
    const long double value = std::strtold(number.c_str(), nullptr) * std::ldexp(1.0L, shift);
    if (!(value < 18446744073709551616.0L)) bad_size(text, "too large for 64 bits");
    if (!dot && shift == 0) {  // exact for plain byte counts
        uint64_t n = 0;
        for (char c : number) n = n * 10 + static_cast<uint64_t>(c - '0');
        return n;
    }
    return static_cast<uint64_t>(std::floor(value));  // a fraction of a byte is dropped
}

std::string format_size(uint64_t bytes) {
    return util::human_bytes(bytes);
}

uint64_t safety_margin(uint64_t available) {
    const auto fraction = static_cast<uint64_t>(static_cast<double>(available) * kSafetyMarginFraction);
    return std::min(available, std::max(kMinSafetyMargin, fraction));
}

uint64_t cgroup_limit(const SystemRoots& roots, std::string* source) {
    const auto text = read_text(roots.proc / "self" / "cgroup");
    if (!text) return 0;
    std::optional<std::string> v1_path, v2_path;
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) {
        // hierarchy-id:controller,list:path
        const size_t a = line.find(':');
        const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
        if (b == std::string::npos) continue;
        const std::string controllers = line.substr(a + 1, b - a - 1);
        const std::string path = line.substr(b + 1);
        if (line.substr(0, a) == "0" && controllers.empty()) v2_path = path;
        std::istringstream list(controllers);
        for (std::string c; std::getline(list, c, ',');) {
            if (c == "memory") v1_path = path;
        }
    }
    const std::filesystem::path cgroup_root = roots.sys / "fs" / "cgroup";
    std::filesystem::path where;
    std::optional<uint64_t> limit;
    std::string kind;
    if (v1_path) {
        limit = smallest_limit_up(cgroup_root / "memory", *v1_path, "memory.limit_in_bytes", &where);
        kind = "cgroup v1 memory.limit_in_bytes";
    }
    if (!limit && v2_path) {
        limit = smallest_limit_up(cgroup_root, *v2_path, "memory.max", &where);
        kind = "cgroup v2 memory.max";
    }
    if (!limit) return 0;
    if (source) *source = kind + " (" + where.string() + ")";
    return *limit;
}

uint64_t mem_available(const SystemRoots& roots) {
    const auto text = read_text(roots.proc / "meminfo");
    if (!text) return 0;
    uint64_t available = 0, free = 0;
    bool has_available = false;
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) {
        std::istringstream fields(line);
        std::string key, unit;
        uint64_t value = 0;
        if (!(fields >> key >> value)) continue;
        fields >> unit;
        const uint64_t bytes = unit == "kB" ? value * 1024 : value;
        if (key == "MemAvailable:") {
            available = bytes;
            has_available = true;
        } else if (key == "MemFree:") {
            free = bytes;
        }
    }
    return has_available ? available : free;
}

HostBudget host_budget(const SystemRoots& roots) {
    HostBudget b;
    std::string source;
    if (const uint64_t limit = cgroup_limit(roots, &source)) {
        b.available = limit;
        b.source = source;
    } else if (const uint64_t avail = mem_available(roots)) {
        b.available = avail;
        b.source = "MemAvailable (" + (roots.proc / "meminfo").string() + ")";
    } else {
        throw Error("cannot tell how much memory this process may use: no memory cgroup limit and no " +
                    (roots.proc / "meminfo").string() + "; give a budget with --mem");
    }
    b.margin = safety_margin(b.available);
    b.budget = b.available - b.margin;
    return b;
}

}  // namespace fitllm::memory
