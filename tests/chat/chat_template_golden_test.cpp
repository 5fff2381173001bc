// Byte-for-byte agreement with jinja2: every published template in tests/chat/fixtures is
// rendered over every fixture conversation (with and without add_generation_prompt), and
// every one-construct snippet is rendered, and each result must equal what jinja2 produced
// through Hugging Face transformers (tools/gen_chat_template_goldens.py wrote goldens.json).
// Where jinja2 raised, fitllm must raise too: the same message for raise_exception.
#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>

#include "chat/chat_template.h"
#include "test_support.h"

namespace fitllm::chat {
namespace {

using Json = nlohmann::ordered_json;

Json load_fixture(const std::string& name) {
    std::ifstream in(test::source_dir() / "tests" / "chat" / "fixtures" / name);
    if (!in) return Json();
    return Json::parse(in);
}

std::string read_text(const std::string& relative) {
    std::ifstream in(test::source_dir() / "tests" / "chat" / "fixtures" / relative, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct Fixtures {
    Json templates = load_fixture("templates.json");
    Json conversations = load_fixture("conversations.json");
    Json snippets = load_fixture("snippets.json");
    Json goldens = load_fixture("goldens.json");
};
const Fixtures& fixtures() {
    static const Fixtures f;
    return f;
}

// The goldens' pinned clock ("2024-09-26T12:00:00") as strftime_now reads it.
std::tm pinned_now() {
    std::tm t{};
    const std::string iso = fixtures().goldens.value("now", "2024-09-26T12:00:00");
    std::sscanf(iso.c_str(), "%d-%d-%dT%d:%d:%d", &t.tm_year, &t.tm_mon, &t.tm_mday, &t.tm_hour, &t.tm_min, &t.tm_sec);
    t.tm_year -= 1900;
    t.tm_mon -= 1;
    const std::time_t seconds = timegm(&t);  // fills in the weekday and day of the year
    gmtime_r(&seconds, &t);
    return t;
}

std::string test_name(std::string s) {
    for (char& c : s)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return s;
}

std::string param_name(const ::testing::TestParamInfo<std::string>& p) {
    return test_name(p.param);
}

// Renders and compares one case against its golden: {"output": ...} or {"error": {type, message}}.
void expect_golden(const std::string& source, const std::string& name, const Json& messages,
                   const RenderOptions& options, const Json& golden, bool unsupported_by_fitllm) {
    std::optional<std::string> output;
    std::optional<TemplateError> error;
    try {
        output = ChatTemplate::parse(source, name).render(messages, options);
    } catch (const TemplateError& e) {
        error = e;
    }
    if (unsupported_by_fitllm) {
        ASSERT_TRUE(error.has_value()) << "fitllm rendered a construct it claims not to support";
        EXPECT_EQ(error->kind(), TemplateError::Kind::unsupported) << error->what();
        return;
    }
    if (golden.contains("output")) {
        ASSERT_FALSE(error.has_value()) << "jinja2 rendered this, fitllm failed: " << error->what();
        EXPECT_EQ(*output, golden["output"].get<std::string>());
        return;
    }
    const std::string type = golden["error"]["type"];
    const std::string message = golden["error"]["message"];
    ASSERT_TRUE(error.has_value()) << "jinja2 raised " << type << " (" << message << "), fitllm rendered:\n" << *output;
    if (type == "TemplateError") {  // raise_exception
        EXPECT_EQ(error->kind(), TemplateError::Kind::raised) << error->what();
        EXPECT_EQ(error->detail(), message);
    } else if (type == "TemplateSyntaxError" || type == "TemplateAssertionError") {
        EXPECT_TRUE(error->kind() == TemplateError::Kind::syntax || error->kind() == TemplateError::Kind::unsupported)
            << "jinja2: " << type << ": " << message << "\nfitllm: " << error->what();
    } else {
        EXPECT_NE(error->kind(), TemplateError::Kind::syntax)
            << "jinja2 parsed this (then raised " << type << ": " << message << "); fitllm: " << error->what();
    }
}

// ---- published templates x conversations ----

std::vector<std::string> template_names() {
    std::vector<std::string> names;
    for (const auto& t : fixtures().templates.value("templates", Json::array())) names.push_back(t["name"]);
    return names;
}

class ChatTemplateGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateGolden, MatchesJinja2OverEveryConversation) {
    const std::string name = GetParam();
    Json manifest;
    for (const auto& t : fixtures().templates["templates"])
        if (t["name"] == name) manifest = t;
    const std::string source = read_text("templates/" + name + ".jinja");
    ASSERT_FALSE(source.empty()) << "missing tests/chat/fixtures/templates/" << name << ".jinja";
    std::map<std::string, Json> conversations;
    for (const auto& c : fixtures().conversations["conversations"]) conversations[c["name"]] = c;
    int cases = 0;
    for (const auto& golden : fixtures().goldens["templates"]) {
        if (golden["template"] != name) continue;
        ++cases;
        const Json& conv = conversations.at(golden["conversation"]);
        RenderOptions options;
        options.add_generation_prompt = golden["add_generation_prompt"];
        options.bos_token = manifest["bos_token"];
        options.eos_token = manifest["eos_token"];
        options.extra_context = conv.value("extra_context", Json::object());
        options.now = pinned_now();
        SCOPED_TRACE("conversation " + golden["conversation"].get<std::string>() +
                     (options.add_generation_prompt ? ", with" : ", without") + " add_generation_prompt");
        expect_golden(source, name, conv["messages"], options, golden, false);
    }
    EXPECT_EQ(cases, 2 * static_cast<int>(fixtures().conversations["conversations"].size()))
        << "goldens.json is stale: rerun tools/gen_chat_template_goldens.py";
}

INSTANTIATE_TEST_SUITE_P(ChatTemplates, ChatTemplateGolden, ::testing::ValuesIn(template_names()), param_name);

TEST(ChatTemplateGoldenFiles, ArePresentAndCoverEveryFixture) {
    ASSERT_FALSE(fixtures().goldens.is_null()) << "tests/chat/fixtures/goldens.json is missing";
    EXPECT_GE(template_names().size(), 7u);
    EXPECT_EQ(fixtures().goldens["templates"].size(),
              template_names().size() * 2 * fixtures().conversations["conversations"].size());
    EXPECT_EQ(fixtures().goldens["snippets"].size(), fixtures().snippets["snippets"].size());
}

// ---- one construct per snippet ----

std::vector<std::string> snippet_names() {
    std::vector<std::string> names;
    for (const auto& s : fixtures().snippets.value("snippets", Json::array())) names.push_back(s["name"]);
    return names;
}

class JinjaSnippetGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(JinjaSnippetGolden, MatchesJinja2) {
    const std::string name = GetParam();
    Json snippet, golden;
    for (const auto& s : fixtures().snippets["snippets"])
        if (s["name"] == name) snippet = s;
    for (const auto& g : fixtures().goldens["snippets"])
        if (g["name"] == name) golden = g;
    ASSERT_FALSE(golden.is_null()) << "no golden for snippet " << name << ": rerun tools/gen_chat_template_goldens.py";
    Json context = snippet.value("context", Json::object());
    Json messages = context.contains("messages") ? context["messages"] : Json::array();
    context.erase("messages");
    RenderOptions options;
    options.add_generation_prompt = snippet.value("add_generation_prompt", false);
    options.bos_token = "<s>";
    options.eos_token = "</s>";
    options.extra_context = context;
    options.now = pinned_now();
    SCOPED_TRACE("template: " + snippet["template"].get<std::string>());
    // Snippets named unsupported_* use what jinja2 has and fitllm deliberately leaves out.
    expect_golden(snippet["template"], name, messages, options, golden, name.rfind("unsupported_", 0) == 0);
}

INSTANTIATE_TEST_SUITE_P(JinjaConstructs, JinjaSnippetGolden, ::testing::ValuesIn(snippet_names()), param_name);

}  // namespace
}  // namespace fitllm::chat
