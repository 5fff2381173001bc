// Chat templates come from model files, which may be broken or hostile. Mutated copies of the
// fixture templates must either render or fail with a TemplateError: never crash, hang or
// throw anything else. (Run under ASan/UBSan by scripts/test.sh.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "chat/chat_template.h"
#include "test_support.h"

namespace fitllm::chat {
namespace {

TEST(JinjaRobustness, MutatedTemplatesRenderOrFailCleanly) {
    const auto dir = test::source_dir() / "tests" / "chat" / "fixtures" / "templates";
    std::vector<std::string> sources;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        std::ifstream in(entry.path(), std::ios::binary);
        sources.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    ASSERT_FALSE(sources.empty());
    const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo", "tool_calls": [{"id": "abcdefghi", "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "r", "tool_call_id": "abcdefghi"}, {"role": "user", "content": [{"type": "text", "text": "t"}]}])");
    static const std::string kPieces[] = {"{{", "}}", "{%",   "%}", "{#", "#}",    "-",    "+",    "'",
                                          "\"", "(",  ")",    "[",  "]",  "|",     ".",    ",",    "\\",
                                          "\n", " ",  "loop", "ns", "if", "endif", "for",  "in",   "not",
                                          "is", "~",  "**",   "//", ":",  "=",     "\xC3", "\xE9", "\0"};
    std::mt19937 rng(20240926);
    int rendered = 0, refused = 0;
    for (int round = 0; round < 3000; ++round) {
        std::string s = sources[rng() % sources.size()];
        const int edits = 1 + static_cast<int>(rng() % 4);
        for (int e = 0; e < edits && !s.empty(); ++e) {
            const size_t at = rng() % s.size();
            switch (rng() % 3) {
                case 0:
                    s.erase(at, 1 + rng() % 8);
                    break;
                case 1:
                    s.insert(at, kPieces[rng() % std::size(kPieces)]);
                    break;
                default:
                    s[at] = static_cast<char>(rng() % 128);
                    break;
            }
        }
        RenderOptions options;
        options.extra_context = {
            {"tools", nlohmann::ordered_json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})}};
        try {
            ChatTemplate::parse(s).render(messages, options);
            ++rendered;
        } catch (const TemplateError&) {
            ++refused;
        } catch (const std::exception& e) {
            ADD_FAILURE() << "unexpected " << typeid(e).name() << ": " << e.what() << "\nfor template:\n" << s;
            return;
        }
    }
    EXPECT_GT(rendered, 0);
    EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace fitllm::chat
