// libFuzzer target for the Jinja engine: parse, check and render a template from the input,
// under render limits, with its values charged to a memory pool. A template comes from a model
// file and the messages from a request, so the engine promises that any input either renders or
// fails with a TemplateError (a memory::BudgetError when the pool refuses): anything else that
// escapes, a sanitizer report, a leak, a hang (-timeout) or an RSS past -rss_limit_mb is a
// finding. After every render the pool must hold nothing: each charged byte was given back.
//
// The input: the template source, then (after the first NUL byte) the render's context. A
// context that parses as JSON is used as it is (an array: the messages; an object: its
// "messages" and the other keys as template variables); any other bytes become a conversation,
// one message per line, the roles taking turns (the first line is the system's when it starts
// with '#').
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

#include "chat/chat_template.h"
#include "memory/device.h"
#include "memory/pool.h"

namespace {

using fitllm::chat::ChatTemplate;
using fitllm::chat::RenderLimits;
using fitllm::chat::RenderOptions;
using fitllm::chat::TemplateError;
using Json = nlohmann::ordered_json;

[[noreturn]] void broken(const char* what, const std::string& detail) {
    std::fprintf(stderr, "jinja_fuzz: %s: %s\n", what, detail.c_str());
    std::abort();
}

// Limits well below the defaults, so that the fuzzer spends its time on many inputs rather than
// on a few that each run to a default limit; the mechanism is the same.
RenderLimits fuzz_limits() {
    RenderLimits limits;
    limits.max_steps = 200'000;
    limits.max_value_bytes = uint64_t{1} << 20;
    limits.max_output_bytes = uint64_t{4} << 20;
    limits.max_live_bytes = uint64_t{32} << 20;
    return limits;
}

Json conversation_from_lines(std::string_view text) {
    Json messages = Json::array();
    static const char* kRoles[] = {"user", "assistant"};
    size_t turn = 0;
    while (!text.empty()) {
        const size_t nl = text.find('\n');
        const std::string_view line = text.substr(0, nl);
        text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
        // Invalid UTF-8 is not valid JSON text; the server never passes it, nor do we.
        const std::string content = Json(std::string(line)).dump(-1, ' ', false, Json::error_handler_t::replace);
        const std::string role = messages.empty() && !line.empty() && line[0] == '#' ? "system" : kRoles[turn++ % 2];
        messages.push_back(Json{{"role", role}, {"content", Json::parse(content)}});
    }
    return messages;
}

void render_context(const std::string_view context, Json& messages, Json& variables) {
    Json parsed = Json::parse(context.begin(), context.end(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_array()) {
        messages = std::move(parsed);
    } else if (parsed.is_object()) {
        if (auto it = parsed.find("messages"); it != parsed.end()) {
            messages = std::move(*it);
            parsed.erase("messages");
        }
        variables = std::move(parsed);
    } else {
        messages = conversation_from_lines(context);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    const size_t split = input.find('\0');
    const std::string_view source = input.substr(0, split);
    const std::string_view context = split == std::string_view::npos ? std::string_view() : input.substr(split + 1);

    Json messages = Json::array({{{"role", "user"}, {"content", "Hi"}}});
    Json variables = Json::object();
    render_context(context, messages, variables);

    // A pool smaller than the render's own limit on live bytes, so that both ways of running out
    // (a limit, and the pool refusing) are reached.
    fitllm::memory::Device host("host", uint64_t{16} << 20);
    fitllm::memory::Pool& pool = host.pool("chat");
    try {
        const ChatTemplate tmpl = ChatTemplate::parse(source, "fuzz");
        RenderOptions options;
        options.bos_token = "<s>";
        options.eos_token = "</s>";
        options.extra_context = variables;
        options.limits = fuzz_limits();
        options.pool = &pool;
        options.now = std::tm{};
        (void)tmpl.render(messages, options);
    } catch (const TemplateError&) {
    } catch (const fitllm::memory::BudgetError&) {
    } catch (const fitllm::Error&) {
        // The messages are not an array of objects, the context not an object: the caller's error.
    } catch (const std::exception& e) {
        broken("unexpected exception", std::string(typeid(e).name()) + ": " + e.what());
    }
    if (pool.live() != 0) broken("the pool still holds bytes after the render", std::to_string(pool.live()));
    return 0;
}
