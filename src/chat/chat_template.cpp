#include "chat/chat_template.h"

#include <algorithm>

#include "chat/jinja_eval.h"
#include "chat/jinja_parser.h"
#include "gguf/gguf_reader.h"

namespace fitllm::chat {
namespace {

jinja::Value messages_value(const std::vector<ChatMessage>& messages) {
    jinja::ValueList list;
    for (const ChatMessage& m : messages) {
        jinja::Dict d;
        d.set(jinja::Value::string("role"), jinja::Value::string(m.role));
        d.set(jinja::Value::string("content"), jinja::Value::string(m.content));
        list.push_back(jinja::Value::dict(std::move(d)));
    }
    return jinja::Value::list(std::move(list));
}

template <class Json>
jinja::Value messages_value(const Json& messages, const std::string& template_name) {
    if (!messages.is_array())
        throw Error(template_name + ": chat messages must be a JSON array, got " + messages.type_name());
    for (size_t i = 0; i < messages.size(); ++i)
        if (!messages[i].is_object())
            throw Error(template_name + ": chat message " + std::to_string(i) + " must be a JSON object, got " +
                        messages[i].type_name());
    return jinja::from_json(messages);
}

// The render's inputs become template values under its budget too (a 20 MiB message is over
// max_value_bytes); what goes wrong there is the input's fault, so the error has no position.
template <class MakeMessages>
std::string render_with(const jinja::Template& tmpl, const MakeMessages& make_messages, const RenderOptions& options) {
    if (!options.extra_context.is_object())
        throw Error(tmpl.name + ": RenderOptions::extra_context must be a JSON object, got " +
                    options.extra_context.type_name());
    const jinja::RenderBudget budget(options.limits, options.pool);
    // What HF's render_jinja_template passes: messages, tools and documents (None unless
    // given), add_generation_prompt, the special tokens, then the caller's extra variables.
    jinja::RenderEnvironment env;
    try {
        env.variables.set(jinja::Value::string("messages"), make_messages());
        env.variables.set(jinja::Value::string("tools"), jinja::Value::none());
        env.variables.set(jinja::Value::string("documents"), jinja::Value::none());
        env.variables.set(jinja::Value::string("add_generation_prompt"),
                          jinja::Value::boolean(options.add_generation_prompt));
        env.variables.set(jinja::Value::string("bos_token"), jinja::Value::string(options.bos_token));
        env.variables.set(jinja::Value::string("eos_token"), jinja::Value::string(options.eos_token));
        for (auto it = options.extra_context.begin(); it != options.extra_context.end(); ++it)
            env.variables.set(jinja::Value::string(it.key()), jinja::from_json(it.value()));
    } catch (const jinja::EvalError& e) {
        const std::string detail = std::string("the messages and context as template values: ") + e.what();
        if (const memory::BudgetError* refused = e.budget_error())
            throw memory::BudgetError(tmpl.name + ": " + detail, refused->pool(), refused->requested(),
                                      refused->capacity(), refused->in_use());
        throw TemplateError(e.is_fatal() ? TemplateError::Kind::limit : TemplateError::Kind::runtime, tmpl.name,
                            detail);
    }
    env.now = options.now;
    try {
        return jinja::render(tmpl, env);
    } catch (const jinja::EvalError& e) {  // every node turns these into TemplateErrors; in case one did not
        throw TemplateError(e.is_fatal() ? TemplateError::Kind::limit : TemplateError::Kind::runtime, tmpl.name,
                            e.what());
    }
}

// The token texts of the vocabulary, to recognise a chat format by its special tokens.
bool vocab_has(const gguf::GgufFile& file, std::string_view token) {
    const gguf::Value* tokens = file.find("tokenizer.ggml.tokens");
    if (!tokens || !tokens->is_array() || tokens->array_type() != gguf::ValueType::STRING) return false;
    const auto texts = tokens->strings();
    return std::find(texts.begin(), texts.end(), token) != texts.end();
}

std::string string_or(const gguf::GgufFile& file, std::string_view key, std::string fallback) {
    const gguf::Value* v = file.find(key);
    if (!v || v->type() != gguf::ValueType::STRING) return fallback;
    return std::string(v->get<std::string_view>());
}

}  // namespace

ChatTemplate ChatTemplate::parse(std::string_view source, std::string name) {
    std::shared_ptr<const jinja::Template> tmpl;
    try {
        tmpl = jinja::parse_template(source, name);
    } catch (const jinja::EvalError& e) {  // the parser and checker turn these into TemplateErrors; in case
        throw TemplateError(e.is_fatal() ? TemplateError::Kind::limit : TemplateError::Kind::runtime, name, e.what());
    }
    return ChatTemplate(std::move(name), std::string(source), std::move(tmpl));
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const RenderOptions& options) const {
    return render_with(
        *tmpl_, [&] { return messages_value(messages); }, options);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const RenderOptions& options) const {
    return render_with(
        *tmpl_, [&] { return messages_value(messages, name_); }, options);
}

std::string ChatTemplate::render(const nlohmann::json& messages, const RenderOptions& options) const {
    return render_with(
        *tmpl_, [&] { return messages_value(messages, name_); }, options);
}

ResolvedTemplate template_for_model(const gguf::GgufFile& file) {
    if (const gguf::Value* v = file.find("tokenizer.chat_template"); v && v->type() == gguf::ValueType::STRING) {
        const std::string_view source = v->get<std::string_view>();
        return ResolvedTemplate{ChatTemplate::parse(source, file.source() + ":tokenizer.chat_template"),
                                "the model's tokenizer.chat_template (" + std::to_string(source.size()) + " bytes)",
                                false, std::nullopt};
    }
    const std::string arch = string_or(file, "general.architecture", "");
    const std::string tokenizer_model = string_or(file, "tokenizer.ggml.model", "");
    const std::string pre = string_or(file, "tokenizer.ggml.pre", "");
    BuiltinFormat format = BuiltinFormat::chatml;
    std::string why;
    if (arch.rfind("gemma", 0) == 0) {
        format = BuiltinFormat::gemma;
        why = "general.architecture is '" + arch + "'";
    } else if (vocab_has(file, "<|start_header_id|>")) {
        format = BuiltinFormat::llama3;
        why = "the vocabulary has <|start_header_id|>";
    } else if (vocab_has(file, "<|im_start|>")) {
        format = BuiltinFormat::chatml;
        why = "the vocabulary has <|im_start|>";
    } else if (vocab_has(file, "[INST]") || arch == "mistral" || (arch == "llama" && tokenizer_model == "llama")) {
        format = BuiltinFormat::mistral;
        why = vocab_has(file, "[INST]") ? "the vocabulary has [INST]"
                                        : "general.architecture is '" + arch + "' with a SentencePiece vocabulary";
    } else if (arch == "llama" && pre == "llama-bpe") {
        format = BuiltinFormat::llama3;
        why = "tokenizer.ggml.pre is 'llama-bpe'";
    } else {
        why = "nothing identifies the format (general.architecture '" + arch + "'), and ChatML is the most common";
    }
    const std::string format_name(builtin_format_name(format));
    return ResolvedTemplate{ChatTemplate::parse(builtin_template_source(format), "builtin:" + format_name),
                            "no tokenizer.chat_template in " + file.source() + "; " + why + ", so the built-in " +
                                format_name + " template",
                            true, format};
}

}  // namespace fitllm::chat
