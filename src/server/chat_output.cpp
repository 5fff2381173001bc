#include "server/chat_output.h"

#include <algorithm>
#include <optional>

namespace fitllm::server {
namespace {

using nlohmann::json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
// gpt-oss's harmony format: a message's header ends at <|message|>, its body at <|end|> or the
// next <|start|> (<|call|> and <|return|> end the generation, so the text does not show them).
constexpr std::string_view kHarmonyChannel = "<|channel|>";
constexpr std::string_view kHarmonyMessage = "<|message|>";
constexpr std::string_view kHarmonyEnds[] = {"<|end|>", "<|start|>", "<|call|>", "<|return|>"};
constexpr size_t kHarmonyMaxHeader = 256;  // a longer "header" is text

bool is_space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

size_t skip_space(std::string_view s, size_t i) {
    while (i < s.size() && is_space(s[i])) ++i;
    return i;
}

std::string_view trim(std::string_view s) {
    size_t b = skip_space(s, 0), e = s.size();
    while (e > b && is_space(s[e - 1])) --e;
    return s.substr(b, e - b);
}

bool starts_with_at(std::string_view s, size_t i, std::string_view prefix) {
    return s.size() >= i && s.substr(i).substr(0, prefix.size()) == prefix;
}

// The length of the longest suffix of s that is a proper prefix of marker (text that may be
// the start of the marker once more comes).
size_t partial_marker_suffix(std::string_view s, std::string_view marker) {
    for (size_t n = std::min(marker.size() - 1, s.size()); n > 0; --n) {
        if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
    }
    return 0;
}

// The end (one past) of the JSON object or array that starts at s[i] ('{' or '['), found by
// matching brackets outside strings; npos when it does not end within s or nests deeper than
// kMaxCallJsonDepth. Linear, with no recursion: any text is safe here.
size_t json_end(std::string_view s, size_t i) {
    int depth = 0;
    bool in_string = false;
    for (size_t k = i; k < s.size(); ++k) {
        const char c = s[k];
        if (in_string) {
            if (c == '\\') {
                ++k;
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            if (++depth > kMaxCallJsonDepth) return std::string_view::npos;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) return k + 1;
            if (depth < 0) return std::string_view::npos;
        }
    }
    return std::string_view::npos;
}

// The JSON value of s[i, end), or nullopt when it does not parse.
std::optional<json> parse_json(std::string_view s) {
    json j = json::parse(s, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return std::nullopt;
    return j;
}

// A call from its JSON object: {"name": N, "arguments" or "parameters": {...} or its text}.
// need_arguments: the bare formats (no marker) need the arguments key, so that an answer that
// is just some JSON object with a "name" is not taken for a call.
std::optional<ToolCall> call_from_json(const json& j, bool need_arguments) {
    if (!j.is_object()) return std::nullopt;
    const auto name = j.find("name");
    if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
    auto args = j.find("arguments");
    if (args == j.end()) args = j.find("parameters");
    ToolCall call;
    call.name = name->get<std::string>();
    if (args == j.end() || args->is_null()) {
        if (need_arguments) return std::nullopt;
        call.arguments = "{}";
    } else if (args->is_object()) {
        call.arguments = args->dump(-1, ' ', false, json::error_handler_t::replace);
    } else if (args->is_string()) {
        // Arguments given as JSON text: kept when that text is an object.
        const std::string& text = args->get_ref<const std::string&>();
        const size_t b = skip_space(text, 0);
        if (b >= text.size() || text[b] != '{' || json_end(text, b) == std::string_view::npos) return std::nullopt;
        const std::optional<json> inner = parse_json(text);
        if (!inner || !inner->is_object()) return std::nullopt;
        call.arguments = inner->dump(-1, ' ', false, json::error_handler_t::replace);
    } else {
        return std::nullopt;
    }
    if (const auto id = j.find("id"); id != j.end() && id->is_string()) call.id = id->get<std::string>();
    return call;
}

// The JSON object or array at s[i] and where it ends, or nullopt.
std::optional<std::pair<json, size_t>> json_at(std::string_view s, size_t i) {
    if (i >= s.size() || (s[i] != '{' && s[i] != '[')) return std::nullopt;
    const size_t end = json_end(s, i);
    if (end == std::string_view::npos) return std::nullopt;
    std::optional<json> j = parse_json(s.substr(i, end - i));
    if (!j) return std::nullopt;
    return std::make_pair(std::move(*j), end);
}

// <tool_call>{...}</tool_call>, repeated with whitespace between. A last call whose closing
// tag is missing counts when nothing but whitespace follows it (the model stopped there).
size_t parse_hermes(std::string_view s, std::vector<ToolCall>& calls) {
    size_t done = 0;
    while (true) {
        size_t i = skip_space(s, done);
        if (!starts_with_at(s, i, kHermesOpen)) break;
        i = skip_space(s, i + kHermesOpen.size());
        auto value = json_at(s, i);
        if (!value) break;
        std::optional<ToolCall> call = call_from_json(value->first, /*need_arguments=*/false);
        if (!call) break;
        i = skip_space(s, value->second);
        if (starts_with_at(s, i, kHermesClose)) {
            i += kHermesClose.size();
        } else if (i != s.size()) {
            break;
        }
        calls.push_back(std::move(*call));
        done = i;
    }
    return done;
}

// [<|python_tag|>]{"name": N, "parameters": {...}}, several split by ';' or whitespace.
size_t parse_llama3(std::string_view s, std::vector<ToolCall>& calls) {
    size_t done = 0;
    size_t i = skip_space(s, 0);
    if (starts_with_at(s, i, kPythonTag)) i += kPythonTag.size();
    while (true) {
        i = skip_space(s, i);
        auto value = json_at(s, i);
        if (!value) break;
        std::optional<ToolCall> call = call_from_json(value->first, /*need_arguments=*/true);
        if (!call) break;
        calls.push_back(std::move(*call));
        done = value->second;
        i = skip_space(s, done);
        if (i < s.size() && s[i] == ';') ++i;
    }
    return done;
}

// [TOOL_CALLS][{"name": N, "arguments": {...}, "id": ...}, ...] (the marker may be hidden), or
// [TOOL_CALLS]N[ARGS]{...}, repeated.
size_t parse_mistral(std::string_view s, std::vector<ToolCall>& calls) {
    size_t done = 0;
    while (true) {
        size_t i = skip_space(s, done);
        const bool marked = starts_with_at(s, i, kMistralMarker);
        if (marked) i = skip_space(s, i + kMistralMarker.size());
        if (i < s.size() && s[i] == '[') {
            auto value = json_at(s, i);
            if (!value || !value->first.is_array() || value->first.empty()) break;
            std::vector<ToolCall> some;
            for (const json& item : value->first) {
                std::optional<ToolCall> call = call_from_json(item, /*need_arguments=*/true);
                if (!call) break;
                some.push_back(std::move(*call));
            }
            if (some.size() != value->first.size()) break;
            for (ToolCall& c : some) calls.push_back(std::move(c));
            done = value->second;
        } else if (marked) {
            const size_t args = s.find(kMistralArgs, i);
            if (args == std::string_view::npos) break;
            const std::string_view name = trim(s.substr(i, args - i));
            if (name.empty() || name.size() > 256 ||
                !std::all_of(name.begin(), name.end(), [](char c) { return !is_space(c) && c != '[' && c != '{'; })) {
                break;
            }
            auto value = json_at(s, skip_space(s, args + kMistralArgs.size()));
            if (!value || !value->first.is_object()) break;
            calls.push_back(
                ToolCall{"", std::string(name), value->first.dump(-1, ' ', false, json::error_handler_t::replace)});
            done = value->second;
        } else {
            break;
        }
    }
    return done;
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat format) {
    switch (format) {
        case ToolCallFormat::hermes:
            return "hermes";
        case ToolCallFormat::llama3:
            return "llama3";
        case ToolCallFormat::mistral:
            return "mistral";
        case ToolCallFormat::harmony:
            return "harmony";
        case ToolCallFormat::none:
            break;
    }
    return "none";
}

TemplateTraits template_traits(std::string_view source) {
    TemplateTraits t;
    t.takes_tools = source.find("tools") != std::string_view::npos;
    if (source.find(kHermesOpen) != std::string_view::npos) {
        t.tools = ToolCallFormat::hermes;
    } else if (source.find(kMistralMarker) != std::string_view::npos) {
        t.tools = ToolCallFormat::mistral;
    } else if (source.find(kPythonTag) != std::string_view::npos ||
               (source.find("<|start_header_id|>") != std::string_view::npos &&
                source.find("\"parameters\"") != std::string_view::npos)) {
        t.tools = ToolCallFormat::llama3;
    }
    t.harmony = source.find(kHarmonyChannel) != std::string_view::npos &&
                source.find(kHarmonyMessage) != std::string_view::npos;
    if (t.harmony) t.tools = ToolCallFormat::harmony;
    if (!t.takes_tools) t.tools = ToolCallFormat::none;
    t.thinks = t.harmony || source.find(kThinkOpen) != std::string_view::npos;
    return t;
}

bool prompt_opens_reasoning(std::string_view prompt) {
    const size_t open = prompt.rfind(kThinkOpen);
    if (open == std::string_view::npos) return false;
    return skip_space(prompt, open + kThinkOpen.size()) == prompt.size();
}

ParsedCalls parse_tool_calls(std::string_view text, ToolCallFormat format, size_t max_calls) {
    ParsedCalls out;
    size_t done = 0;
    switch (format) {
        case ToolCallFormat::hermes:
            done = parse_hermes(text, out.calls);
            break;
        case ToolCallFormat::llama3:
            done = parse_llama3(text, out.calls);
            break;
        case ToolCallFormat::mistral:
            done = parse_mistral(text, out.calls);
            break;
        case ToolCallFormat::harmony:  // calls are messages: OutputSplitter reads them
        case ToolCallFormat::none:
            break;
    }
    if (out.calls.empty()) done = 0;
    if (out.calls.size() > max_calls) out.calls.resize(max_calls);
    out.rest = std::string(text.substr(done));
    // Only whitespace after the calls is no text.
    if (done > 0 && trim(out.rest).empty()) out.rest.clear();
    return out;
}

OutputSplitter::OutputSplitter(OutputOptions options) : options_(options) {
    if (options_.harmony) {
        state_ = State::harmony_header;
    } else if (options_.reasoning && options_.starts_in_reasoning) {
        state_ = State::reasoning;
    } else if (options_.reasoning) {
        state_ = State::start;
    } else {
        state_ = State::content_start;
    }
}

void OutputSplitter::emit_reasoning(OutputDelta& d, std::string_view text, bool last) {
    if (!reasoning_started_) text = text.substr(skip_space(text, 0));
    if (last) {
        size_t end = text.size();
        while (end > 0 && is_space(text[end - 1])) --end;
        text = text.substr(0, end);
    }
    if (text.empty()) return;
    reasoning_started_ = true;
    d.reasoning += text;
}

OutputDelta OutputSplitter::feed(std::string_view piece) {
    if (finished_) return {};
    pending_ += piece;
    return step(false);
}

OutputDelta OutputSplitter::finish() {
    if (finished_) return {};
    OutputDelta d = step(true);
    finished_ = true;
    return d;
}

OutputDelta OutputSplitter::step(bool final) {
    OutputDelta d;
    while (true) {
        switch (state_) {
            case State::start: {
                const std::string_view t = std::string_view(pending_).substr(skip_space(pending_, 0));
                if (!final && t.size() < kThinkOpen.size() && kThinkOpen.substr(0, t.size()) == t) return d;
                if (t.substr(0, kThinkOpen.size()) == kThinkOpen) {
                    pending_.erase(0, pending_.size() - t.size() + kThinkOpen.size());
                    state_ = State::reasoning;
                } else {
                    state_ = State::content_start;
                }
                break;
            }
            case State::reasoning: {
                const size_t close = pending_.find(kThinkClose);
                if (close != std::string::npos) {
                    emit_reasoning(d, std::string_view(pending_).substr(0, close), /*last=*/true);
                    pending_.erase(0, close + kThinkClose.size());
                    state_ = State::content_start;
                    break;
                }
                if (final) {
                    emit_reasoning(d, pending_, /*last=*/true);
                    pending_.clear();
                    return d;
                }
                // Held: what may start </think>, and the whitespace before it (trimmed if it ends).
                size_t keep = partial_marker_suffix(pending_, kThinkClose);
                while (keep < pending_.size() && is_space(pending_[pending_.size() - keep - 1])) ++keep;
                emit_reasoning(d, std::string_view(pending_).substr(0, pending_.size() - keep), /*last=*/false);
                pending_.erase(0, pending_.size() - keep);
                return d;
            }
            case State::content_start: {
                pending_.erase(0, skip_space(pending_, 0));
                if (pending_.empty()) return d;
                const char c = pending_[0];
                if ((options_.tools == ToolCallFormat::llama3 && c == '{') ||
                    (options_.tools == ToolCallFormat::mistral && c == '[')) {
                    state_ = State::calls;
                } else {
                    state_ = State::content;
                }
                break;
            }
            case State::content: {
                std::string_view marker;
                if (options_.tools == ToolCallFormat::hermes) marker = kHermesOpen;
                if (options_.tools == ToolCallFormat::mistral) marker = kMistralMarker;
                if (options_.tools == ToolCallFormat::llama3) marker = kPythonTag;
                if (marker.empty()) {
                    d.content += pending_;
                    pending_.clear();
                    return d;
                }
                const size_t at = pending_.find(marker);
                if (at != std::string::npos) {
                    d.content.append(pending_, 0, at);
                    pending_.erase(0, at);
                    state_ = State::calls;
                    break;
                }
                const size_t keep = final ? 0 : partial_marker_suffix(pending_, marker);
                d.content.append(pending_, 0, pending_.size() - keep);
                pending_.erase(0, pending_.size() - keep);
                return d;
            }
            case State::harmony_header:
            case State::harmony_body:
                if (!harmony_step(d, final)) return d;
                break;
            case State::calls: {
                if (!final) return d;
                ParsedCalls parsed = parse_tool_calls(pending_, options_.tools, options_.max_calls);
                d.calls = std::move(parsed.calls);
                d.content += parsed.rest;
                pending_.clear();
                return d;
            }
        }
    }
}

void OutputSplitter::harmony_emit(OutputDelta& d, std::string_view text) {
    switch (channel_) {
        case Channel::reasoning:
            d.reasoning += text;
            break;
        case Channel::content:
            d.content += text;
            break;
        case Channel::call:
            call_args_ += text;
            break;
    }
}

bool OutputSplitter::harmony_step(OutputDelta& d, bool final) {
    if (state_ == State::harmony_header) {
        // The generation starts after the prompt's "<|start|>assistant", a later message after
        // its <|start|> (taken with the end of the one before); text that does not open a header
        // ("<|channel|>", " to=", "assistant") is content, as is a header that never ends.
        bool may_be_header = false;
        for (std::string_view opener : {"<|", " to=", "to=", "assistant"}) {
            const size_t n = std::min(opener.size(), pending_.size());
            may_be_header = may_be_header || std::string_view(pending_).substr(0, n) == opener.substr(0, n);
        }
        const size_t end = pending_.find(kHarmonyMessage);
        if (!may_be_header || end == std::string::npos || end > kHarmonyMaxHeader) {
            if (!final && may_be_header && end == std::string::npos && pending_.size() <= kHarmonyMaxHeader) {
                return false;  // more may complete the header
            }
            channel_ = Channel::content;
            state_ = State::harmony_body;
            return true;
        }
        const std::string_view header = std::string_view(pending_).substr(0, end);
        std::string channel, recipient;
        auto word_after = [&](std::string_view marker) {
            const size_t at = header.find(marker);
            if (at == std::string_view::npos) return std::string();
            size_t b = at + marker.size(), e = b;
            while (e < header.size() && !is_space(header[e]) && header[e] != '<') ++e;
            return std::string(header.substr(b, e - b));
        };
        channel = word_after(kHarmonyChannel);
        recipient = word_after("to=");
        constexpr std::string_view kFunctions = "functions.";
        if (recipient.starts_with(kFunctions) && recipient.size() > kFunctions.size() &&
            options_.tools == ToolCallFormat::harmony) {
            channel_ = Channel::call;
            call_name_ = recipient.substr(kFunctions.size());
            call_args_.clear();
        } else if (channel == "analysis" && options_.reasoning) {
            channel_ = Channel::reasoning;
        } else {
            channel_ = Channel::content;  // final, commentary to no one, a call nobody asked for
        }
        pending_.erase(0, end + kHarmonyMessage.size());
        state_ = State::harmony_body;
        return true;
    }
    size_t end = std::string::npos, marker_size = 0;
    for (std::string_view m : kHarmonyEnds) {
        const size_t at = pending_.find(m);
        if (at < end) end = at, marker_size = m.size();
    }
    if (end == std::string::npos) {
        size_t keep = 0;
        if (!final) {
            for (std::string_view m : kHarmonyEnds) keep = std::max(keep, partial_marker_suffix(pending_, m));
        }
        harmony_emit(d, std::string_view(pending_).substr(0, pending_.size() - keep));
        pending_.erase(0, pending_.size() - keep);
        if (!final) return false;
    } else {
        harmony_emit(d, std::string_view(pending_).substr(0, end));
        pending_.erase(0, end + marker_size);
    }
    // The message ended (or the output did): a call is complete.
    if (channel_ == Channel::call) {
        if (n_calls_ < options_.max_calls) d.calls.push_back({"", call_name_, std::string(trim(call_args_))});
        ++n_calls_;
        call_args_.clear();
    }
    channel_ = Channel::content;
    state_ = State::harmony_header;
    return !(final && pending_.empty());
}

ParsedOutput split_output(std::string_view text, const OutputOptions& options) {
    OutputSplitter s(options);
    OutputDelta a = s.feed(text);
    OutputDelta b = s.finish();
    ParsedOutput out;
    out.reasoning = a.reasoning + b.reasoning;
    out.content = a.content + b.content;
    out.calls = std::move(a.calls);
    for (ToolCall& c : b.calls) out.calls.push_back(std::move(c));
    return out;
}

json arguments_object(const ToolCall& call) {
    json j = json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return json::object();
    return j;
}

}  // namespace fitllm::server
