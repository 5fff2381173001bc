// fitllm: one executable, one subcommand per task.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "fitllm/error.h"
#include "fitllm/version.h"

namespace {

struct Command {
    const char* name;
    const char* summary;
    int (*run)(const std::vector<std::string>& args);
};

constexpr Command kCommands[] = {
    {"inspect", "show what a GGUF file holds: model, hyper-parameters, tokenizer, tensors", fitllm::cli::run_inspect},
    {"tokenize", "split text into the model's tokens (ids and pieces), as llama.cpp does", fitllm::cli::run_tokenize},
    {"template", "render a conversation through the model's chat template", fitllm::cli::run_template},
    {"bench", "measure prompt processing and generation speed (tokens/s), like llama-bench", fitllm::cli::run_bench},
    {"run", "generate text after a prompt on the CPU, streaming it, with speed and peak memory", fitllm::cli::run_run},
    {"chat", "talk with a model through its chat template, interactively", fitllm::cli::run_chat},
    {"perplexity", "perplexity of a model over a text, computed as llama-perplexity does", fitllm::cli::run_perplexity},
    {"plan", "show where every byte of a run goes and whether it fits the memory budget; --fit picks settings",
     fitllm::cli::run_plan},
    {"serve", "serve models over HTTP (OpenAI-compatible API, continuous batching, models on demand)",
     fitllm::cli::run_serve},
    {"quantize", "rewrite a GGUF model with its weights quantized (Q4_K_M, Q8_0, ...), as llama-quantize does",
     fitllm::cli::run_quantize},
};

void print_help() {
    std::printf("fitllm %s: run GGUF language models inside a memory budget\n\n", fitllm::kVersion);
    std::printf("usage: fitllm COMMAND [OPTIONS]\n\ncommands:\n");
    for (const Command& c : kCommands) std::printf("  %-12s %s\n", c.name, c.summary);
    std::printf("\n'fitllm COMMAND --help' shows the options of a command.\n");
}

int run_command(const std::string& name, const std::vector<std::string>& args) {
    for (const Command& c : kCommands) {
        if (name != c.name) continue;
        try {
            return c.run(args);
        } catch (const fitllm::cli::UsageError& e) {
            std::fprintf(stderr, "fitllm %s: %s\n", c.name, e.what());
            return 2;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "fitllm %s: error: %s\n", c.name, e.what());
            return 1;
        }
    }
    std::fprintf(stderr, "fitllm: unknown command '%s' (run 'fitllm --help' for the list)\n", name.c_str());
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) {
        print_help();
        return 2;
    }
    if (args[0] == "--help" || args[0] == "-h") {
        print_help();
        return 0;
    }
    if (args[0] == "help") {
        if (args.size() < 2) {
            print_help();
            return 0;
        }
        return run_command(args[1], {"--help"});
    }
    if (args[0] == "--version") {
        std::printf("fitllm %s\n", fitllm::kVersion);
        return 0;
    }
    return run_command(args[0], std::vector<std::string>(args.begin() + 1, args.end()));
}
