#pragma once
// What `fitllm tokenize` prints, separated from the command so tests can check it directly.
#include <span>
#include <string>

#include "tokenizer/tokenizer.h"

namespace fitllm::cli {

// One line per token, "    ID -> 'piece'" as llama-tokenize prints it (pieces with special
// tokens spelled out); or, with ids_only, "[ID, ID, ...]".
std::string render_tokens(const tokenizer::Tokenizer& tokenizer, std::span<const tokenizer::TokenId> ids,
                          bool ids_only);

}  // namespace fitllm::cli
