// A request body's JSON: every kind of malformed text is a 400 invalid_json naming what is wrong
// (never a 500 or a crash), nesting is bounded before anything is built, and the memory bound
// charged before parsing is at least what the parsed value takes (measured with glibc's
// mallinfo2), not wildly more.
#include "server/json_body.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <string>

#include "server/api_error.h"

namespace fitllm::server {
namespace {

std::string error_of(const std::string& text) {
    try {
        const JsonBody body(text);
        (void)body.parse();
    } catch (const ApiError& e) {
        EXPECT_EQ(e.status(), 400);
        EXPECT_EQ(e.code(), "invalid_json");
        return e.what();
    }
    return "";
}

TEST(JsonBody, MalformedTextOfEveryKindIsInvalidJson) {
    EXPECT_NE(error_of("{not json").find("at byte"), std::string::npos);
    EXPECT_NE(error_of("{\"temperature\": 1e400}").find("number overflow"), std::string::npos);
    EXPECT_NE(error_of("{\"a\": -1e999}").find("number overflow"), std::string::npos);
    EXPECT_NE(error_of("{\"a\": \"\xff\xfe\"}").find("UTF-8"), std::string::npos);
    EXPECT_NE(error_of("").find("empty"), std::string::npos);
    EXPECT_NE(error_of(" \r\n").find("empty"), std::string::npos);
    EXPECT_FALSE(error_of("{} trailing").empty());
    EXPECT_FALSE(error_of("{\"a\": 1,}").empty());
    EXPECT_FALSE(error_of("[1, 2").empty());
    EXPECT_FALSE(error_of("{\"a\": \"\\ud800\"}").empty());                // a lone surrogate
    EXPECT_FALSE(error_of(std::string("{\"a\": \"x\0y\"}", 12)).empty());  // a raw control character
    EXPECT_FALSE(error_of("/* c */ {}").empty());
    // Numbers that fit are fine, big integers too (as unsigned or as a double).
    EXPECT_EQ(error_of("{\"a\": 1e300, \"b\": 18446744073709551615, \"c\": 1e-400}"), "");
}

TEST(JsonBody, NestingIsBoundedBeforeAnythingIsBuilt) {
    const int depth = kMaxJsonDepth;
    const std::string ok = std::string(depth, '[') + std::string(depth, ']');
    EXPECT_EQ(JsonBody(ok).depth(), depth);
    EXPECT_NE(error_of(std::string(depth + 1, '[') + std::string(depth + 1, ']')).find("deeper than 64"),
              std::string::npos);
    // 10 MB of brackets: refused at once, without building a million nested arrays.
    const std::string deep(10 << 20, '[');
    EXPECT_NE(error_of(deep).find("deeper than"), std::string::npos);
    EXPECT_NE(error_of(std::string(100, '{')).find("at byte"), std::string::npos);  // a key expected
    EXPECT_NE(error_of("{\"a\":" + std::string(70, '[')).find("deeper than"), std::string::npos);
}

#ifndef FITLLM_UNDER_ASAN  // tests/CMakeLists.txt sets it in the sanitizer build
#define FITLLM_UNDER_ASAN 0
#endif

[[maybe_unused]] uint64_t heap_in_use() {
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

TEST(JsonBody, MemoryBoundCoversWhatTheParsedValueTakes) {
#if FITLLM_UNDER_ASAN
    GTEST_SKIP() << "AddressSanitizer's allocator is not glibc's: mallinfo2 does not see the JSON's heap";
#else
    auto repeat = [](const std::string& item, int n, const char* open, const char* close) {
        std::string s = open;
        for (int i = 0; i < n; ++i) s += (i ? "," : "") + item;
        return s + close;
    };
    std::string numbered = "{";
    for (int i = 0; i < 20000; ++i)
        numbered += (i ? ",\"key" : "\"key") + std::to_string(i) + "\":" + std::to_string(i);
    numbered += "}";
    const std::vector<std::pair<std::string, std::string> > shapes = {
        {"zeros", repeat("0", 200000, "[", "]")},
        {"empty arrays", repeat("[]", 100000, "[", "]")},
        {"empty objects", repeat("{}", 100000, "[", "]")},
        {"short strings", repeat("\"\"", 100000, "[", "]")},
        {"long strings", repeat("\"" + std::string(100, 'x') + "\"", 5000, "[", "]")},
        {"one huge string", "{\"prompt\": \"" + std::string(4 << 20, 'a') + "\"}"},
        {"members", numbered},
        {"nested", repeat(repeat("[1,{\"a\":\"bb\"}]", 4, "[", "]"), 20000, "[", "]")},
        {"messages",
         repeat("{\"role\":\"user\",\"content\":\"" + std::string(300, 'q') + "\"}", 3000, "{\"messages\":[", "]}")},
    };
    for (const auto& [name, text] : shapes) {
        const JsonBody body(text);
        malloc_trim(0);
        const uint64_t before = heap_in_use();
        const nlohmann::json value = body.parse();
        const uint64_t used = heap_in_use() - before;
        EXPECT_GE(body.memory_bound(), used) << name;
        EXPECT_LE(body.memory_bound(), 4 * used + 16384) << name << ": the bound is far above what it takes";
    }
#endif
}

}  // namespace
}  // namespace fitllm::server
