// libFuzzer target: a chat model's generated text through the tool-call parsers and the
// reasoning / tool-call splitter (server/chat_output.h). The first byte picks the format and the
// options, the next two where the text is cut into pieces; the rest is the text. Checks: no
// crash or sanitizer report (deep nesting, cut markup, invalid UTF-8), the text split in pieces
// equal to the whole, every call's name non-empty and its arguments a JSON object's text, and no
// more calls than asked for.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/chat_output.h"

using namespace fitllm::server;

namespace {

[[noreturn]] void broken(const char* what) {
    std::fprintf(stderr, "chat_output_fuzz: %s\n", what);
    std::abort();
}

ParsedOutput join(OutputSplitter& s, std::string_view text, size_t step) {
    ParsedOutput out;
    const auto take = [&out](OutputDelta d) {
        out.reasoning += d.reasoning;
        out.content += d.content;
        for (ToolCall& c : d.calls) out.calls.push_back(std::move(c));
    };
    for (size_t at = 0; at < text.size(); at += step) take(s.feed(text.substr(at, step)));
    take(s.finish());
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 3) return 0;
    OutputOptions o;
    o.tools = static_cast<ToolCallFormat>(data[0] % 4);
    o.reasoning = (data[0] & 4) != 0;
    o.starts_in_reasoning = (data[0] & 8) != 0;
    o.max_calls = (data[0] & 16) ? 1 : 128;
    const size_t step = 1 + ((static_cast<size_t>(data[1]) << 8 | data[2]) % 64);
    const std::string_view text(reinterpret_cast<const char*>(data) + 3, size - 3);

    const ParsedOutput whole = split_output(text, o);
    OutputSplitter s(o);
    const ParsedOutput pieces = join(s, text, step);
    if (pieces.reasoning != whole.reasoning || pieces.content != whole.content || pieces.calls != whole.calls) {
        broken("the split in pieces differs from the whole");
    }
    if (whole.calls.size() > o.max_calls) broken("more calls than max_calls");
    if (o.tools == ToolCallFormat::none && !whole.calls.empty()) broken("calls without a format");
    for (const ToolCall& c : whole.calls) {
        if (c.name.empty()) broken("a call without a name");
        const nlohmann::json args = nlohmann::json::parse(c.arguments, nullptr, false);
        if (args.is_discarded() || !args.is_object()) broken("arguments that are not a JSON object");
    }
    const ParsedCalls calls = parse_tool_calls(text, o.tools, o.max_calls);
    if (calls.calls.empty() && calls.rest != text) broken("no calls, yet text was taken");
    return 0;
}
