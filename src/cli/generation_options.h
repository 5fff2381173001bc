#pragma once
// Options shared by the generating subcommands (run, chat): the sampling flags and their checks.
#include <string>

#include "cli/args.h"
#include "sampling/sampling_params.h"

namespace fitllm::cli {

// Parses a number for option `name`, with a UsageError naming it on bad input.
float parse_float(const std::string& name, const std::string& text);

// Declares --temp, --top-k, --top-p, --min-p, --seed and --repeat-penalty, writing into sp.
void add_sampling_options(ArgParser& parser, sampling::SamplingParams& sp);

// Throws UsageError when a sampling parameter is out of range.
void validate_sampling_options(const sampling::SamplingParams& sp);

}  // namespace fitllm::cli
