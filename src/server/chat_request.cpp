#include "server/chat_request.h"

#include <algorithm>
#include <string>

#include "sampling/grammar.h"
#include "sampling/json_schema.h"
#include "server/api_error.h"
#include "server/json_body.h"
#include "server/request.h"

namespace fitllm::server {
namespace {

using nlohmann::json;

[[noreturn]] void invalid(const std::string& field, const std::string& why, const char* code = "invalid_value") {
    throw ApiError::invalid(field + ": " + why, code, field);
}

const json* present(const json& object, const char* name) {
    const auto it = object.find(name);
    if (it == object.end() || it->is_null()) return nullptr;
    return &*it;
}

// tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}]
json read_tools(const json& tools) {
    if (!tools.is_array())
        invalid("tools", "expected an array of {\"type\": \"function\", \"function\": {...}}", "invalid_type");
    for (size_t i = 0; i < tools.size(); ++i) {
        const std::string at = "tools[" + std::to_string(i) + "]";
        const json& t = tools[i];
        if (!t.is_object()) invalid(at, "expected an object", "invalid_type");
        const json* type = present(t, "type");
        if (type && *type != "function") {
            throw ApiError::unsupported(at + ".type", "only \"function\" tools are supported, got " + type->dump());
        }
        const json* f = present(t, "function");
        if (!f || !f->is_object()) invalid(at + ".function", "required, an object with a name", "invalid_type");
        const json* name = present(*f, "name");
        if (!name || !name->is_string() || name->get_ref<const std::string&>().empty()) {
            invalid(at + ".function.name", "required, a non-empty string", "invalid_type");
        }
        if (const json* d = present(*f, "description"); d && !d->is_string()) {
            invalid(at + ".function.description", "expected a string", "invalid_type");
        }
        if (const json* p = present(*f, "parameters"); p && !p->is_object()) {
            invalid(at + ".function.parameters", "expected a JSON Schema object", "invalid_type");
        }
    }
    return tools;
}

// An assistant message's tool_calls, as templates read them.
json read_tool_calls(const json& calls, const std::string& at) {
    if (!calls.is_array()) invalid(at, "expected an array of calls", "invalid_type");
    json out = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
        const std::string ci = at + "[" + std::to_string(i) + "]";
        const json& c = calls[i];
        if (!c.is_object()) invalid(ci, "expected an object", "invalid_type");
        const json* type = present(c, "type");
        if (type && *type != "function") invalid(ci + ".type", "expected \"function\", got " + type->dump());
        const json* f = present(c, "function");
        if (!f || !f->is_object())
            invalid(ci + ".function", "required, an object with name and arguments", "invalid_type");
        const json* name = present(*f, "name");
        if (!name || !name->is_string()) invalid(ci + ".function.name", "required, a string", "invalid_type");
        json args = json::object();
        if (const json* a = present(*f, "arguments")) {
            if (a->is_string()) {
                // Checked as a body is (syntax, UTF-8, nesting up to kMaxJsonDepth) before it is built.
                try {
                    args = JsonBody(a->get_ref<const std::string&>()).parse();
                } catch (const ApiError& e) {
                    invalid(ci + ".function.arguments",
                            std::string("not valid JSON text (the arguments are a JSON object's text): ") + e.what());
                }
            } else if (a->is_object()) {
                args = *a;
            } else {
                invalid(ci + ".function.arguments", "expected a JSON object's text", "invalid_type");
            }
        }
        json call = json::object();
        if (const json* id = present(c, "id")) {
            if (!id->is_string()) invalid(ci + ".id", "expected a string", "invalid_type");
            call["id"] = *id;
        }
        call["type"] = "function";
        call["function"] = {{"name", *name}, {"arguments", std::move(args)}};
        out.push_back(std::move(call));
    }
    return out;
}

}  // namespace

void read_chat_extensions(const json& body, CompletionRequest& r) {
    bool offer_tools = true;
    if (const json* choice = present(body, "tool_choice")) {
        if (*choice == "none") {
            offer_tools = false;
        } else if (*choice == "required") {
            r.forced_tool = "";
        } else if (choice->is_object()) {
            const json* type = present(*choice, "type");
            const json* f = present(*choice, "function");
            const json* name = f && f->is_object() ? present(*f, "name") : nullptr;
            if (!type || *type != "function" || !name || !name->is_string() ||
                name->get_ref<const std::string&>().empty())
                invalid("tool_choice", "expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
            r.forced_tool = name->get<std::string>();
        } else if (*choice != "auto") {
            invalid("tool_choice", "expected \"auto\", \"none\" or \"required\", got " + choice->dump());
        }
    }
    if (const json* tools = present(body, "tools")) {
        json t = read_tools(*tools);
        if (offer_tools && !t.empty()) r.tools = std::move(t);
    }
    if (r.forced_tool) {
        if (r.tools.is_null()) invalid("tool_choice", "forces a call, but the request offers no tools");
        const bool known = r.forced_tool->empty() || std::any_of(r.tools.begin(), r.tools.end(), [&](const json& t) {
                               return t["function"]["name"] == *r.forced_tool;
                           });
        if (!known) invalid("tool_choice", "names \"" + *r.forced_tool + "\", which is not one of the tools");
    }
    if (const json* p = present(body, "parallel_tool_calls")) {
        if (!p->is_boolean()) invalid("parallel_tool_calls", "expected a boolean", "invalid_type");
        r.parallel_tool_calls = p->get<bool>();
    }
    if (const json* kwargs = present(body, "chat_template_kwargs")) {
        if (!kwargs->is_object())
            invalid("chat_template_kwargs", "expected an object of template variables", "invalid_type");
        for (const auto& item : kwargs->items()) {
            const std::string& key = item.key();
            if (key == "messages" || key == "tools" || key == "add_generation_prompt") {
                invalid("chat_template_kwargs." + key, "set by the request itself, not a template keyword");
            }
            r.template_kwargs[key] = item.value();
        }
    }
    if (const json* f = present(body, "reasoning_format")) {
        if (!f->is_string()) invalid("reasoning_format", "expected a string", "invalid_type");
        const std::string v = f->get<std::string>();
        if (v == "none") {
            r.split_reasoning = false;
        } else if (v != "auto" && v != "deepseek") {
            invalid(
                "reasoning_format",
                "\"" + v +
                    "\" is not \"auto\", \"deepseek\" (split into reasoning_content) or \"none\" (kept in content)");
        }
    }
    const json* messages = present(body, "messages");
    if (!messages || !messages->is_array()) return;
    for (size_t i = 0; i < messages->size() && i < r.messages.size(); ++i) {
        const json& m = (*messages)[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        auto& out = r.messages[i];
        if (const json* calls = present(m, "tool_calls"); calls && !(calls->is_array() && calls->empty())) {
            if (out["role"] != "assistant") invalid(at + ".tool_calls", "only an assistant message makes tool calls");
            out["tool_calls"] = read_tool_calls(*calls, at + ".tool_calls");
        }
        if (const json* id = present(m, "tool_call_id")) {
            if (!id->is_string()) invalid(at + ".tool_call_id", "expected a string", "invalid_type");
            out["tool_call_id"] = *id;
        }
        if (const json* rc = present(m, "reasoning_content")) {
            if (!rc->is_string()) invalid(at + ".reasoning_content", "expected a string", "invalid_type");
            out["reasoning_content"] = *rc;
        }
    }
}

namespace {

TemplateTraits prepare_render_kwargs(const CompletionRequest& r, chat::RenderOptions& options,
                                     const TemplateTraits& traits) {
    for (auto it = r.template_kwargs.begin(); it != r.template_kwargs.end(); ++it) {
        options.extra_context[it.key()] = it.value();
    }
    return traits;
}

// The tools as a system prompt, for a template that shows none: each function's JSON, and the
// Hermes format to call them in.
std::string tools_system_prompt(const json& tools) {
    std::string text =
        "You may call functions to answer. The functions, each with the JSON schema of its arguments:\n<tools>\n";
    for (const json& t : tools) text += t["function"].dump() + "\n";
    text +=
        "</tools>\nTo call a function, answer with\n<tool_call>\n{\"name\": <the function's name>, \"arguments\": "
        "<its arguments, a JSON object>}\n</tool_call>\nand nothing else. A function's result comes back as "
        "<tool_response>...</tool_response>.";
    return text;
}

// The tools into the messages of a template that shows none: the system prompt above first (its
// own or merged into the request's first system message), assistant calls written as the
// Hermes text they stand for, tool results as <tool_response> user turns.
void tools_into_messages(CompletionRequest& r) {
    nlohmann::ordered_json& messages = r.messages;
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    const std::string system = tools_system_prompt(r.tools);
    bool merged = false;
    for (size_t i = 0; i < messages.size(); ++i) {
        nlohmann::ordered_json m = std::move(messages[i]);
        const std::string role = m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "";
        std::string content = m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
        if (i == 0 && (role == "system" || role == "developer")) {
            m["content"] = content + (content.empty() ? "" : "\n\n") + system;
            merged = true;
        } else if (role == "assistant" && m.contains("tool_calls")) {
            for (const auto& call : m["tool_calls"]) {
                const nlohmann::ordered_json c = {{"name", call["function"]["name"]},
                                                  {"arguments", call["function"]["arguments"]}};
                content += (content.empty() ? "" : "\n") + std::string("<tool_call>\n") + c.dump() + "\n</tool_call>";
            }
            m.erase("tool_calls");
            m["content"] = content;
        } else if (role == "tool") {
            // A user turn (templates without tools know no tool role); results in a row share one.
            const std::string response = "<tool_response>\n" + content + "\n</tool_response>";
            if (!out.empty() && out.back()["role"] == "user" && out.back().value("from_tools", false)) {
                out.back()["content"] = out.back()["content"].get<std::string>() + "\n" + response;
                continue;
            }
            m = {{"role", "user"}, {"content", response}, {"from_tools", true}};
        }
        out.push_back(std::move(m));
    }
    for (auto& m : out) m.erase("from_tools");
    if (!merged) out.insert(out.begin(), nlohmann::ordered_json{{"role", "system"}, {"content", system}});
    messages = std::move(out);
}

}  // namespace

TemplateTraits prepare_render(CompletionRequest& r, const chat::ChatTemplate& tmpl, chat::RenderOptions& options) {
    TemplateTraits traits = template_traits(tmpl.source());
    if (!r.tools.is_null() && !traits.takes_tools) {
        // A template that shows no tools: they go into the system message, and calls in Hermes's
        // format are asked for, parsed and, when forced, constrained.
        tools_into_messages(r);
        traits.takes_tools = true;
        traits.tools = ToolCallFormat::hermes;
        return prepare_render_kwargs(r, options, traits);
    }
    if (!r.tools.is_null()) {
        if (traits.tools == ToolCallFormat::none) {
            throw ApiError::unsupported(
                "tools", "the model's chat template (" + tmpl.name() +
                             ") writes tool calls in a format fitllm does not parse (it parses Hermes/Qwen "
                             "<tool_call>, Mistral [TOOL_CALLS] and Llama 3.x JSON)");
        }
        options.extra_context["tools"] = r.tools;
    }
    return prepare_render_kwargs(r, options, traits);
}

namespace {

// The rule names of GBNF text with a prefix: "root ::= obj" -> "f0-root ::= f0-obj". Names are
// what stands outside string literals, character classes, token references, repetition counts
// ({m,n}) and comments.
std::string prefix_rules(std::string_view gbnf, const std::string& prefix) {
    auto name_char = [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    };
    std::string out;
    for (size_t i = 0; i < gbnf.size();) {
        const char c = gbnf[i];
        if (c == '"' || c == '[') {
            const char close = c == '"' ? '"' : ']';
            size_t j = i + 1;
            while (j < gbnf.size() && gbnf[j] != close) j += gbnf[j] == '\\' ? 2 : 1;
            j = std::min(j + 1, gbnf.size());
            out.append(gbnf.substr(i, j - i));
            i = j;
        } else if (c == '<' || c == '{' || c == '#') {
            const size_t j = std::min(gbnf.find(c == '<' ? '>' : c == '{' ? '}' : '\n', i), gbnf.size());
            out.append(gbnf.substr(i, j - i));
            i = j;
        } else if (name_char(c)) {
            size_t j = i;
            while (j < gbnf.size() && name_char(gbnf[j])) ++j;
            out += prefix;
            out.append(gbnf.substr(i, j - i));
            i = j;
        } else {
            out += c;
            ++i;
        }
    }
    return out;
}

// A function's parameters schema as GBNF whose root is `root` ({"type": "object"} without one).
std::string parameters_gbnf(const json& function) {
    const auto p = function.find("parameters");
    const nlohmann::ordered_json params = p != function.end() && !p->is_null()
                                              ? nlohmann::ordered_json::parse(p->dump())
                                              : nlohmann::ordered_json{{"type", "object"}};
    try {
        return sampling::json_schema_to_gbnf(params);
    } catch (const sampling::JsonSchemaError& e) {
        throw ApiError::invalid(std::string("tools: a function's parameters: ") + e.what(), "unsupported_schema",
                                "tools");
    }
}

// gpt-oss's harmony format: a call is a commentary message addressed to the function, its body
// the arguments, ended by <|call|> (which ends the generation: one call per answer). The model
// may reason first, in an analysis message, as it was trained to; that text never spells "<|",
// so no marker but the tokens themselves reaches the output splitter.
//
//   <|channel|>analysis<|message|>...<|end|><|start|>assistant      (optional)
//   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{arguments}<|call|>
std::string harmony_call_gbnf(const CompletionRequest& r) {
    std::string gbnf =
        "root ::= analysis? call\n"
        "analysis ::= <|channel|> \"analysis\" <|message|> analysis-text <|end|> <|start|> \"assistant\"\n"
        "analysis-text ::= ([^<] | \"<\"+ [^<|])*\n"
        "call ::= <|channel|> \"commentary to=functions.\" (";
    std::string functions;
    size_t n = 0;
    for (const json& t : r.tools) {
        const json& f = t["function"];
        const std::string& name = f["name"].get_ref<const std::string&>();
        if (!r.forced_tool->empty() && name != *r.forced_tool) continue;
        if (name.find_first_of(" \t\r\n<") != std::string::npos) {
            invalid("tool_choice", "the function \"" + name +
                                       "\" cannot be called in the harmony format: its name holds a space or '<'");
        }
        const std::string prefix = "f" + std::to_string(n) + "-";
        gbnf += std::string(n ? " | " : " ") + "f" + std::to_string(n) + "-call";
        functions += prefix + "call ::= " + sampling::gbnf_literal(name) +
                     " \" \" <|constrain|> \"json\" <|message|> " + prefix + "root\n";
        functions += prefix_rules(parameters_gbnf(f), prefix);
        if (!functions.empty() && functions.back() != '\n') functions += '\n';
        ++n;
    }
    gbnf += " ) <|call|>\n";
    return gbnf + functions;
}

}  // namespace

void force_tool_call(CompletionRequest& r, const TemplateTraits& traits) {
    if (!r.forced_tool) return;
    if (r.params.sampling.grammar) {
        invalid("tool_choice", "forcing a call cannot go with response_format or grammar (both constrain the answer)");
    }
    if (traits.tools == ToolCallFormat::harmony) {
        const std::string gbnf = harmony_call_gbnf(r);
        try {
            r.params.sampling.grammar = sampling::Grammar::parse(gbnf);
        } catch (const sampling::GrammarError& e) {
            throw ApiError::invalid(std::string("tools: the grammar of a call: ") + e.what(), "unsupported_schema",
                                    "tools");
        }
        return;
    }
    const bool llama3 = traits.tools == ToolCallFormat::llama3;
    const char* args = llama3 ? "parameters" : "arguments";
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();
    for (size_t i = 0; i < r.tools.size(); ++i) {
        const json& f = r.tools[i]["function"];
        const std::string& name = f["name"].get_ref<const std::string&>();
        if (!r.forced_tool->empty() && name != *r.forced_tool) continue;
        const auto p = f.find("parameters");
        nlohmann::ordered_json params = p != f.end() && !p->is_null() ? nlohmann::ordered_json::parse(p->dump())
                                                                      : nlohmann::ordered_json{{"type", "object"}};
        nlohmann::ordered_json properties = nlohmann::ordered_json::object();
        properties["name"] = {{"const", name}};
        properties[args] = std::move(params);
        calls.push_back({{"type", "object"},
                         {"properties", std::move(properties)},
                         {"required", {"name", args}},
                         {"additionalProperties", false}});
    }
    const nlohmann::ordered_json schema =
        calls.size() == 1 ? calls[0] : nlohmann::ordered_json{{"anyOf", std::move(calls)}};
    std::string gbnf;
    try {
        gbnf = sampling::json_schema_to_gbnf(schema);
    } catch (const sampling::JsonSchemaError& e) {
        throw ApiError::invalid(std::string("tools: a function's parameters: ") + e.what(), "unsupported_schema",
                                "tools");
    }
    // The converter's root is one call; the format wraps it.
    constexpr std::string_view kRoot = "root ::= ";
    gbnf = "tool_call_one ::= " + gbnf.substr(kRoot.size());
    const bool many = r.parallel_tool_calls;
    switch (traits.tools) {
        case ToolCallFormat::hermes:
            gbnf += "tool_call_item ::= \"<tool_call>\\n\" tool_call_one \"\\n</tool_call>\"\n";
            gbnf += many ? "root ::= tool_call_item (\"\\n\" tool_call_item)*\n" : "root ::= tool_call_item\n";
            break;
        case ToolCallFormat::llama3:
            gbnf += many ? "root ::= tool_call_one (\"; \" tool_call_one)*\n" : "root ::= tool_call_one\n";
            break;
        case ToolCallFormat::mistral:
            gbnf += many ? "root ::= \"[\" tool_call_one (\", \" tool_call_one)* \"]\"\n"
                         : "root ::= \"[\" tool_call_one \"]\"\n";
            break;
        case ToolCallFormat::harmony:  // its own grammar above
        case ToolCallFormat::none:
            return;  // prepare_render refused the tools already
    }
    try {
        r.params.sampling.grammar = sampling::Grammar::parse(gbnf);
    } catch (const sampling::GrammarError& e) {
        throw ApiError::invalid(std::string("tools: the grammar of a call: ") + e.what(), "unsupported_schema",
                                "tools");
    }
}

std::optional<OutputOptions> output_options(const CompletionRequest& r, const TemplateTraits& traits,
                                            std::string_view prompt) {
    OutputOptions o;
    if (!r.tools.is_null()) o.tools = traits.tools;
    o.reasoning = r.split_reasoning && traits.thinks;
    o.starts_in_reasoning = o.reasoning && !traits.harmony && prompt_opens_reasoning(prompt);
    o.harmony = traits.harmony;  // the channels' markers never reach the content
    o.max_calls = r.parallel_tool_calls ? 128 : 1;
    if (o.tools == ToolCallFormat::none && !o.reasoning && !o.harmony) return std::nullopt;
    return o;
}

}  // namespace fitllm::server
