#pragma once
// Chat templates: the Jinja program (tokenizer.chat_template) that turns a conversation into
// the exact prompt text a model was trained on. fitllm renders them byte-for-byte as Hugging
// Face transformers' apply_chat_template does (jinja2 with trim_blocks and lstrip_blocks,
// raise_exception, strftime_now, HF's tojson, loop controls), with its own engine: the
// lexer, parser and evaluator under src/chat/jinja_*.
//
//   auto tmpl = ChatTemplate::parse(source);                 // TemplateError: construct + line:col
//   std::string prompt = tmpl.render(messages, {.bos_token = "<bos>"});
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/render_budget.h"
#include "chat/template_error.h"

namespace fitllm::gguf {
class GgufFile;
}
namespace fitllm::memory {
class Pool;
}

namespace fitllm::chat {

namespace jinja {
struct Template;
}

struct ChatMessage {
    std::string role;
    std::string content;
};

struct RenderOptions {
    bool add_generation_prompt = true;
    std::string bos_token;
    std::string eos_token;
    // More template variables: tools, documents, date_string, enable_thinking, ... They are set
    // after the ones above and so can replace them. Key order is kept (it shows in tojson).
    nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
    // The clock strftime_now() reads (Llama 3.2 prints today's date); unset: the local time now.
    std::optional<std::tm> now;
    // What one render may use (depth, steps, bytes; chat/render_budget.h has the defaults and
    // README.md the reasons). Going past them is a TemplateError of Kind::limit.
    RenderLimits limits;
    // When set, the bytes the render's values hold (the messages as template values included)
    // are charged to this pool while it runs, so that rendering counts against the model's
    // budget; a pool that refuses ends the render with memory::BudgetError.
    memory::Pool* pool = nullptr;
};

class ChatTemplate {
public:
    // Parses a template; throws TemplateError naming the construct and its line:column when
    // the source is not valid Jinja or uses something fitllm does not implement.
    static ChatTemplate parse(std::string_view source, std::string name = "chat_template");

    // Renders the conversation. Throws TemplateError when rendering fails, including the
    // template's own raise_exception (Kind::raised, detail() is the template's message) and
    // the render limits (Kind::limit), and memory::BudgetError when options.pool refuses.
    std::string render(const std::vector<ChatMessage>& messages, const RenderOptions& options) const;
    // Messages as JSON objects, for fields beyond role and content (tool_calls, name, content
    // parts). ordered_json keeps key order as Python does; plain json has sorted keys.
    std::string render(const nlohmann::ordered_json& messages, const RenderOptions& options) const;
    std::string render(const nlohmann::json& messages, const RenderOptions& options) const;

    const std::string& name() const { return name_; }
    const std::string& source() const { return source_; }

private:
    ChatTemplate(std::string name, std::string source, std::shared_ptr<const jinja::Template> tmpl)
        : name_(std::move(name)), source_(std::move(source)), tmpl_(std::move(tmpl)) {}

    std::string name_;
    std::string source_;
    std::shared_ptr<const jinja::Template> tmpl_;
};

// The well-known formats fitllm falls back to when a model file carries no template.
enum class BuiltinFormat { chatml, llama3, gemma, mistral };
std::string_view builtin_format_name(BuiltinFormat format);  // "ChatML", "Llama 3", ...
// The template text (a published model's own, see tests/chat/fixtures/templates.json).
std::string_view builtin_template_source(BuiltinFormat format);

// The template to use for a model: the file's tokenizer.chat_template when it has one, else a
// built-in chosen by architecture and vocabulary. source_description says which and why,
// for the user to see (e.g. "no tokenizer.chat_template in gemma-3-270m.gguf; general.
// architecture is 'gemma3', so the built-in Gemma template").
struct ResolvedTemplate {
    ChatTemplate tmpl;
    std::string source_description;
    bool is_fallback = false;
    std::optional<BuiltinFormat> builtin;  // set when is_fallback
};
ResolvedTemplate template_for_model(const gguf::GgufFile& file);

}  // namespace fitllm::chat
