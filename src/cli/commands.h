#pragma once
// The subcommands of the fitllm executable; one file each.
#include <string>
#include <vector>

namespace fitllm::cli {

// Each returns the process exit status; args exclude "fitllm" and the subcommand name.
int run_inspect(const std::vector<std::string>& args);
int run_tokenize(const std::vector<std::string>& args);
int run_template(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_run(const std::vector<std::string>& args);
int run_chat(const std::vector<std::string>& args);
int run_perplexity(const std::vector<std::string>& args);
int run_plan(const std::vector<std::string>& args);
int run_serve(const std::vector<std::string>& args);

}  // namespace fitllm::cli
