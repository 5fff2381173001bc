#pragma once
// A small llama.cpp-style flag parser: "-m, --model FILE", flags, positionals, --help.
// Each subcommand declares its options once; help text is generated from the declarations.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fitllm/error.h"

namespace fitllm::cli {

// Bad command line: the message says which argument and why; exit status 2.
class UsageError : public Error {
public:
    using Error::Error;
};

class ArgParser {
public:
    ArgParser(std::string usage, std::string summary);

    // names: "-t, --tensors" or "--json"; a flag takes no value.
    void flag(const std::string& names, bool* out, std::string help);
    // An option taking one value: "-m, --model" with metavar "FILE".
    void option(const std::string& names, std::string metavar, std::string help,
                std::function<void(const std::string&)> set);
    void option(const std::string& names, std::string metavar, std::string help, std::string* out);
    void option(const std::string& names, std::string metavar, std::string help, int* out);
    // Positional arguments, in order.
    void positional(std::string name, std::string help, std::string* out, bool required = true);

    // Parses args (without the program and subcommand names). Returns false when --help was
    // asked for (help is then printed to stdout); throws UsageError on bad input.
    bool parse(const std::vector<std::string>& args);
    std::string help() const;

    // The options declared (--help first): their names and, for those taking one, the value's name.
    struct OptionInfo {
        std::vector<std::string> names;
        std::string metavar;  // empty: a flag
    };
    std::vector<OptionInfo> options() const;

private:
    struct Option {
        std::vector<std::string> names;
        std::string metavar;  // empty: a flag
        std::string help;
        std::function<void(const std::string&)> set;
    };
    struct Positional {
        std::string name;
        std::string help;
        std::string* out;
        bool required;
    };
    const Option* find(std::string_view name) const;

    std::string usage_;
    std::string summary_;
    std::vector<Option> options_;
    std::vector<Positional> positionals_;
};

// Parses a whole number for option `name`, with a UsageError naming it on bad input.
long long parse_integer(const std::string& name, const std::string& text);

}  // namespace fitllm::cli
