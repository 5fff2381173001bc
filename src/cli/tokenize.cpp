// fitllm tokenize -m MODEL [--ids] [--no-bos] [--parse-special] TEXT | -f FILE | --stdin
#include "cli/tokenize.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"

namespace fitllm::cli {

std::string render_tokens(const tokenizer::Tokenizer& tokenizer, std::span<const tokenizer::TokenId> ids,
                          bool ids_only) {
    std::string out;
    if (ids_only) {
        out += '[';
        for (size_t i = 0; i < ids.size(); ++i) {
            if (i) out += ", ";
            out += std::to_string(ids[i]);
        }
        out += "]\n";
        return out;
    }
    for (const tokenizer::TokenId id : ids) {
        char number[16];
        std::snprintf(number, sizeof number, "%6d", static_cast<int>(id));
        out += number;
        out += " -> '";
        out += tokenizer.token_to_piece(id, true);
        out += "'\n";
    }
    return out;
}

namespace {

std::string read_input_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw UsageError("-f: cannot open '" + path + "'");
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) throw Error(path + ": read failed");
    return text.str();
}

}  // namespace

int run_tokenize(const std::vector<std::string>& args) {
    std::string model;
    std::string text;
    std::string file;
    bool from_stdin = false;
    bool ids_only = false;
    bool no_bos = false;
    bool parse_special = false;
    ArgParser p("fitllm tokenize -m MODEL [--ids] [--no-bos] [--parse-special] TEXT | -f FILE | --stdin",
                "Split text into the model's tokens, as llama.cpp does for the same file, and print\n"
                "one line per token (id and piece) or the list of ids. The count goes to stderr.");
    p.option("-m, --model", "MODEL", "the GGUF file whose tokenizer to use (vocab-only files work)", &model);
    p.option("-f, --file", "FILE", "tokenize the contents of FILE", &file);
    p.flag("--stdin", &from_stdin, "tokenize standard input");
    p.flag("--ids", &ids_only, "print only the ids, as [1, 2, 3]");
    p.flag("--no-bos", &no_bos, "do not add the BOS/EOS tokens the model asks for (add_special = false)");
    p.flag("--parse-special", &parse_special,
           "text that spells a control token (\"<start_of_turn>\") becomes that token");
    p.positional("TEXT", "the text to tokenize", &text, false);
    if (!p.parse(args)) return 0;

    if (model.empty()) throw UsageError("-m MODEL is required");
    const int sources = (text.empty() ? 0 : 1) + (file.empty() ? 0 : 1) + (from_stdin ? 1 : 0);
    if (sources != 1) throw UsageError("give exactly one of TEXT, -f FILE and --stdin");
    if (!file.empty()) {
        text = read_input_file(file);
    } else if (from_stdin) {
        text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    }

    const gguf::GgufFile gguf_file = gguf::GgufFile::open(model);
    const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::from_gguf(gguf_file);
    const std::vector<tokenizer::TokenId> ids = tokenizer.tokenize(text, !no_bos, parse_special);
    std::fputs(render_tokens(tokenizer, ids, ids_only).c_str(), stdout);
    std::fflush(stdout);  // the count comes after the tokens also when both go to one terminal
    std::fprintf(stderr, "%zu tokens\n", ids.size());
    return 0;
}

}  // namespace fitllm::cli
