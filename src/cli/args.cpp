#include "cli/args.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace fitllm::cli {

namespace {

std::vector<std::string> split_names(const std::string& names) {
    std::vector<std::string> out;
    std::stringstream ss(names);
    std::string item;
    while (std::getline(ss, item, ',')) {
        const size_t b = item.find_first_not_of(' ');
        const size_t e = item.find_last_not_of(' ');
        if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    }
    return out;
}

}  // namespace

ArgParser::ArgParser(std::string usage, std::string summary) : usage_(std::move(usage)), summary_(std::move(summary)) {
    options_.push_back({{"-h", "--help"}, "", "show this help and exit", nullptr});
}

void ArgParser::flag(const std::string& names, bool* out, std::string help) {
    options_.push_back({split_names(names), "", std::move(help), [out](const std::string&) { *out = true; }});
}

void ArgParser::option(const std::string& names, std::string metavar, std::string help,
                       std::function<void(const std::string&)> set) {
    options_.push_back({split_names(names), std::move(metavar), std::move(help), std::move(set)});
}

void ArgParser::option(const std::string& names, std::string metavar, std::string help, std::string* out) {
    option(names, std::move(metavar), std::move(help), [out](const std::string& v) { *out = v; });
}

void ArgParser::option(const std::string& names, std::string metavar, std::string help, int* out) {
    const std::string name = split_names(names).back();
    option(names, std::move(metavar), std::move(help), [out, name](const std::string& v) {
        const long long n = parse_integer(name, v);
        if (n < INT_MIN || n > INT_MAX) throw UsageError(name + ": " + v + " is out of range");
        *out = static_cast<int>(n);
    });
}

void ArgParser::positional(std::string name, std::string help, std::string* out, bool required) {
    positionals_.push_back({std::move(name), std::move(help), out, required});
}

const ArgParser::Option* ArgParser::find(std::string_view name) const {
    for (const Option& o : options_) {
        for (const std::string& n : o.names) {
            if (n == name) return &o;
        }
    }
    return nullptr;
}

bool ArgParser::parse(const std::vector<std::string>& args) {
    size_t next_positional = 0;
    bool only_positionals = false;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& arg = args[i];
        if (!only_positionals && arg == "--") {
            only_positionals = true;
            continue;
        }
        if (!only_positionals && arg.size() > 1 && arg[0] == '-') {
            std::string name = arg;
            std::string value;
            bool has_inline_value = false;
            if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
                name = arg.substr(0, eq);
                value = arg.substr(eq + 1);
                has_inline_value = true;
            }
            const Option* opt = find(name);
            if (!opt) throw UsageError("unknown option '" + name + "' (see --help)");
            if (opt->names.front() == "-h") {
                std::fputs(help().c_str(), stdout);
                return false;
            }
            if (opt->metavar.empty()) {
                if (has_inline_value) throw UsageError("option '" + name + "' takes no value");
                opt->set("");
                continue;
            }
            if (!has_inline_value) {
                if (i + 1 >= args.size()) throw UsageError("option '" + name + "' needs a value " + opt->metavar);
                value = args[++i];
            }
            opt->set(value);
            continue;
        }
        if (next_positional >= positionals_.size()) throw UsageError("unexpected argument '" + arg + "'");
        *positionals_[next_positional++].out = arg;
    }
    for (size_t p = next_positional; p < positionals_.size(); ++p) {
        if (positionals_[p].required) throw UsageError("missing " + positionals_[p].name + " (see --help)");
    }
    return true;
}

std::vector<ArgParser::OptionInfo> ArgParser::options() const {
    std::vector<OptionInfo> out;
    for (const Option& o : options_) out.push_back({o.names, o.metavar});
    return out;
}

std::string ArgParser::help() const {
    std::string out = "usage: " + usage_ + "\n\n" + summary_ + "\n";
    if (!positionals_.empty()) {
        out += "\narguments:\n";
        for (const Positional& p : positionals_) {
            char line[512];
            std::snprintf(line, sizeof line, "  %-26s %s\n", p.name.c_str(), p.help.c_str());
            out += line;
        }
    }
    out += "\noptions:\n";
    for (const Option& o : options_) {
        std::string names;
        for (const std::string& n : o.names) names += (names.empty() ? "" : ", ") + n;
        if (!o.metavar.empty()) names += " " + o.metavar;
        char line[512];
        std::snprintf(line, sizeof line, "  %-26s %s\n", names.c_str(), o.help.c_str());
        out += line;
    }
    return out;
}

long long parse_integer(const std::string& name, const std::string& text) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno == ERANGE) {
        throw UsageError(name + ": '" + text + "' is not a whole number");
    }
    return v;
}

}  // namespace fitllm::cli
