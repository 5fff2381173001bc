// Ollama's keep_alive as a request gives it (server::parse_keep_alive): seconds, Go durations,
// "forever" and what is refused; and the -m model, which never unloads, refusing a finite one.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "server/api_error.h"
#include "server/model_registry.h"
#include "server/request.h"
#include "test_support.h"

namespace fitllm::server {
namespace {

using nlohmann::json;

TEST(KeepAlive, SecondsAndDurations) {
    EXPECT_DOUBLE_EQ(parse_keep_alive(json(0)), 0);
    EXPECT_DOUBLE_EQ(parse_keep_alive(json(30)), 30);
    EXPECT_DOUBLE_EQ(parse_keep_alive(json(2.5)), 2.5);
    EXPECT_DOUBLE_EQ(parse_keep_alive(json("0")), 0);
    EXPECT_DOUBLE_EQ(parse_keep_alive(json("5m")), 300);
    EXPECT_DOUBLE_EQ(parse_keep_alive(json("1h30m")), 5400);
    EXPECT_DOUBLE_EQ(parse_keep_alive(json("1.5s")), 1.5);
    EXPECT_DOUBLE_EQ(parse_keep_alive(json("250ms")), 0.25);
    EXPECT_DOUBLE_EQ(parse_keep_alive(json("2m500ms")), 120.5);
    EXPECT_DOUBLE_EQ(parse_keep_alive(json("+10s")), 10);
}

TEST(KeepAlive, NegativeIsForever) {
    EXPECT_LT(parse_keep_alive(json(-1)), 0);
    EXPECT_LT(parse_keep_alive(json(-0.5)), 0);
    EXPECT_LT(parse_keep_alive(json("-1m")), 0);
    EXPECT_LT(parse_keep_alive(json(1e300)), 0);  // longer than a server runs
    EXPECT_LT(parse_keep_alive(json("1000000h")), 0);
}

TEST(KeepAlive, RefusesWhatIsNotADuration) {
    for (const json& bad : {json("300"), json("5 m"), json("5parsecs"), json("m"), json("1..5s"), json(""), json("-"),
                            json(true), json::array({1}), json::object()}) {
        SCOPED_TRACE(bad.dump());
        try {
            parse_keep_alive(bad);
            ADD_FAILURE() << "accepted";
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status(), 400);
            EXPECT_EQ(e.param(), "keep_alive");
        }
    }
}

TEST(KeepAlive, TheOllamaRequestCarriesIt) {
    const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
    EXPECT_EQ(parse_ollama_request({{"messages", msgs}}, true).keep_alive, std::nullopt);
    EXPECT_EQ(parse_ollama_request({{"messages", msgs}, {"keep_alive", nullptr}}, true).keep_alive, std::nullopt);
    EXPECT_EQ(parse_ollama_request({{"messages", msgs}, {"keep_alive", "10m"}}, true).keep_alive, 600.0);
    EXPECT_EQ(parse_ollama_request({{"prompt", "hi"}, {"keep_alive", 0}}, false).keep_alive, 0.0);
}

TEST(KeepAlive, TheOneModelOfMinusMOnlyStaysForever) {
    ModelRegistry reg({.model_path = (test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string(),
                       .context = {.n_ctx = 256}});
    const std::string id = reg.models().at(0).id;
    EXPECT_NO_THROW(reg.set_keep_alive(id, std::nullopt));
    EXPECT_NO_THROW(reg.set_keep_alive(id, -1.0));
    for (const double seconds : {0.0, 300.0}) {
        try {
            reg.set_keep_alive(id, seconds);
            ADD_FAILURE() << seconds << " accepted";
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status(), 400);
            EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
        }
    }
    EXPECT_EQ(reg.find("anything").id, id);  // -m answers to any name, as acquire() does
    EXPECT_FALSE(reg.find("").expires);      // never unloaded
}

}  // namespace
}  // namespace fitllm::server
