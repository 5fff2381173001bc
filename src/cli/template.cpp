// fitllm template -m MODEL [--system TEXT] [--user TEXT] [--assistant TEXT] ... | -f MESSAGES.json
// Renders a conversation through the model's chat template (or the built-in fallback), the
// exact prompt text generation will see.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/chat_template.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "gguf/gguf_reader.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::cli {

namespace {

std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw UsageError("cannot read '" + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace

int run_template(const std::vector<std::string>& args) {
    std::string model;
    std::string messages_file;
    std::string template_file;
    bool no_generation_prompt = false;
    bool show_ids = false;
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    auto add_message = [&messages](const char* role) {
        return [&messages, role](const std::string& content) {
            messages.push_back({{"role", role}, {"content", content}});
        };
    };
    ArgParser p("fitllm template -m MODEL [--system TEXT] [--user TEXT] [--assistant TEXT]... | -f MESSAGES.json",
                "Render a conversation through the model's chat template (tokenizer.chat_template, or a\n"
                "built-in ChatML / Llama 3 / Gemma / Mistral template when the file has none) and print the\n"
                "prompt exactly as generation will see it. Messages are taken in the order given.");
    p.option("-m, --model", "MODEL", "the GGUF file whose template and special tokens to use", &model);
    p.option("--system", "TEXT", "a system message", add_message("system"));
    p.option("--user", "TEXT", "a user message", add_message("user"));
    p.option("--assistant", "TEXT", "an assistant message", add_message("assistant"));
    p.option("-f, --messages", "FILE", "messages as a JSON array of {\"role\", \"content\"} objects", &messages_file);
    p.option("--template-file", "FILE", "use this Jinja template instead of the model's", &template_file);
    p.flag("--no-generation-prompt", &no_generation_prompt, "do not open an assistant turn at the end");
    p.flag("--ids", &show_ids, "print the prompt's token ids instead of its text");
    if (!p.parse(args)) return 0;
    if (model.empty()) throw UsageError("missing -m MODEL (see --help)");
    if (!messages_file.empty()) {
        if (!messages.empty()) throw UsageError("give messages either with -f or with --system/--user/--assistant");
        try {
            messages = nlohmann::ordered_json::parse(read_text_file(messages_file));
        } catch (const nlohmann::json::parse_error& e) {
            throw UsageError(messages_file + ": not valid JSON: " + e.what());
        }
        if (!messages.is_array()) throw UsageError(messages_file + ": expected a JSON array of messages");
    }
    if (messages.empty()) throw UsageError("no messages: give --user TEXT (and others) or -f FILE");

    const auto file = gguf::GgufFile::open(model);
    const auto tok = tokenizer::Tokenizer::from_gguf(file);
    const auto& vocab = tok.vocab();
    chat::RenderOptions options;
    options.add_generation_prompt = !no_generation_prompt;
    if (vocab.valid(vocab.special().bos)) options.bos_token = vocab.text(vocab.special().bos);
    if (vocab.valid(vocab.special().eos)) options.eos_token = vocab.text(vocab.special().eos);

    std::string prompt;
    if (!template_file.empty()) {
        prompt = chat::ChatTemplate::parse(read_text_file(template_file), template_file).render(messages, options);
        std::fprintf(stderr, "template: %s\n", template_file.c_str());
    } else {
        const chat::ResolvedTemplate resolved = chat::template_for_model(file);
        std::fprintf(stderr, "template: %s\n", resolved.source_description.c_str());
        prompt = resolved.tmpl.render(messages, options);
    }
    if (!show_ids) {
        std::fputs(prompt.c_str(), stdout);
        return 0;
    }
    // The rendered text spells its special tokens (and BOS when the template writes it).
    const auto ids = tok.tokenize(prompt, false, true);
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? ", " : "") + std::to_string(ids[i]);
    std::printf("%s]\n", line.c_str());
    std::fprintf(stderr, "%zu tokens\n", ids.size());
    return 0;
}

}  // namespace fitllm::cli
