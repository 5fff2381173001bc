// Fields a request may not carry (server::parse_completion_request, parse_ollama_request): each
// is refused with a 400 naming it, also when its name holds control characters (the fuzzer's
// find: a name starting with NUL gave an empty message).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "server/api_error.h"
#include "server/request.h"

namespace fitllm::server {
namespace {

using nlohmann::json;

ApiError refusal(const json& body, bool ollama) {
    try {
        if (ollama) {
            parse_ollama_request(body, /*chat=*/false);
        } else {
            parse_completion_request(body, /*chat=*/false);
        }
    } catch (const ApiError& e) {
        return e;
    }
    ADD_FAILURE() << "accepted: " << body.dump();
    return ApiError::unsupported("-", "-");
}

TEST(RequestFields, UnknownFieldIsRefusedByName) {
    const ApiError e = refusal({{"model", "m"}, {"prompt", "hi"}, {"frobnicate", 1}}, false);
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.code(), "unsupported_parameter");
    EXPECT_NE(std::string(e.what()).find("frobnicate"), std::string::npos) << e.what();
}

TEST(RequestFields, ControlCharactersInANameAreEscapedInTheMessage) {
    for (const bool ollama : {false, true}) {
        const std::string name = std::string(1, '\0') + "x\n";
        const ApiError e = refusal({{"model", "m"}, {"prompt", "hi"}, {name, 1}}, ollama);
        EXPECT_EQ(e.status(), 400);
        EXPECT_EQ(e.code(), "unsupported_parameter");
        const std::string what = e.what();
        EXPECT_NE(what.find("\"\\u0000x\\n\""), std::string::npos) << what;
        EXPECT_EQ(e.body()["error"]["param"], name);  // the field itself, as the client sent it
    }
}

}  // namespace
}  // namespace fitllm::server

namespace fitllm::server {
namespace {

// OpenAI's presence and frequency penalties count the generated text only; with llama.cpp's
// repeat_penalty, and on Ollama's endpoints (llama.cpp's options), the prompt counts too.
TEST(RequestFields, PenaltiesCountThePromptOnlyWithRepeatPenalty) {
    const nlohmann::json openai = {{"prompt", "x"}, {"presence_penalty", 1.0}, {"frequency_penalty", 0.5}};
    EXPECT_FALSE(parse_completion_request(openai, /*chat=*/false).params.penalize_prompt);
    nlohmann::json llama = openai;
    llama["repeat_penalty"] = 1.1;
    EXPECT_TRUE(parse_completion_request(llama, /*chat=*/false).params.penalize_prompt);
    const nlohmann::json ollama = {{"model", "m"}, {"prompt", "x"}, {"options", {{"presence_penalty", 1.0}}}};
    EXPECT_TRUE(parse_ollama_request(ollama, /*chat=*/false).completion.params.penalize_prompt);
}

// n: the choices a request asks for (1 when absent); 0, a fraction or a string is refused naming
// n; Ollama's endpoints have no n (refused as a field they do not know).
TEST(RequestFields, NChoices) {
    EXPECT_EQ(parse_completion_request({{"prompt", "x"}}, /*chat=*/false).n, 1);
    EXPECT_EQ(parse_completion_request({{"prompt", "x"}, {"n", 3}}, /*chat=*/false).n, 3);
    EXPECT_EQ(parse_completion_request({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"n", 2}}, true).n, 2);
    for (const json& n : {json(0), json(-1), json(1.5), json("2")}) {
        const ApiError e = refusal({{"prompt", "x"}, {"n", n}}, false);
        EXPECT_EQ(e.status(), 400);
        EXPECT_EQ(e.param().value_or(""), "n") << n.dump();
    }
    EXPECT_EQ(refusal({{"model", "m"}, {"prompt", "x"}, {"n", 2}}, true).param().value_or(""), "n");
}

}  // namespace
}  // namespace fitllm::server
