// Ollama's model management on `fitllm serve --models-dir` (/api/copy, /api/delete, /api/create,
// /api/pull, /api/push; server/ollama_endpoints.cpp, ModelRegistry::put_model and remove_model):
// names checked (no path out of the directory), a busy model refused, a created model's system
// prompt and parameters the defaults of its requests, and -m refusing what cannot apply to it.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/model_registry.h"
#include "test_support.h"

namespace fitllm::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path tiny_llama() {
    return test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf";
}

// A server on a free loopback port, over `registry`, stopped when it goes.
class TestServer {
public:
    explicit TestServer(ModelRegistry& registry) : server_(registry, {}) {
        EXPECT_TRUE(server_.bind("127.0.0.1", 0));
        thread_ = std::thread([this] { server_.listen_after_bind(); });
        for (int i = 0; i < 500 && !server_.is_running(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ~TestServer() {
        server_.stop();
        thread_.join();
    }
    // The status and the body (JSON when it parses, else the text as a JSON string).
    std::pair<int, json> call(const std::string& method, const std::string& path, const json& body) {
        const test::HttpResult r = test::http_request(server_.bound_port(), method, path, body.dump());
        const size_t at = r.response.find("\r\n\r\n");
        const std::string text = at == std::string::npos ? "" : r.response.substr(at + 4);
        json parsed = json::parse(text, nullptr, false);
        return {r.status, parsed.is_discarded() ? json(text) : parsed};
    }

private:
    HttpServer server_;
    std::thread thread_;
};

std::vector<std::string> tag_names(TestServer& s) {
    std::vector<std::string> names;
    const json tags = s.call("GET", "/api/tags", json::object()).second;
    for (const json& m : tags["models"]) names.push_back(m["name"]);
    return names;
}

// The error message of an Ollama error answer ({"error": "..."}) with that status.
std::string error_of(const std::pair<int, json>& answer, int status) {
    EXPECT_EQ(answer.first, status) << answer.second.dump();
    if (!answer.second.is_object() || !answer.second.contains("error") || !answer.second["error"].is_string()) {
        ADD_FAILURE() << "not an Ollama error: " << answer.second.dump();
        return "";
    }
    return answer.second["error"].get<std::string>();
}

TEST(OllamaManage, NamesThatCannotBeFiles) {
    for (const char* ok : {"llama", "my-model:v2", "a_b.c:1.0", "_x", "X9"}) {
        EXPECT_EQ(ModelRegistry::name_problem(ok, true), "") << ok;
    }
    for (const char* bad : {"", "../x", "a/b", "a\\b", ".hidden", "-x", "x:", ":v1", "a:b:c", "x y", "x:../y"}) {
        EXPECT_NE(ModelRegistry::name_problem(bad, true), "") << bad;
    }
    EXPECT_NE(ModelRegistry::name_problem(std::string(129, 'a'), true), "");
    EXPECT_EQ(ModelRegistry::name_problem(std::string(128, 'a'), true), "");
    // Looked up only: any name a file in the directory may have, but no way out of it.
    EXPECT_EQ(ModelRegistry::name_problem("a file name with spaces", false), "");
    for (const char* bad : {"../x", "a/b", ".x", ""}) EXPECT_NE(ModelRegistry::name_problem(bad, false), "") << bad;
}

TEST(OllamaManage, CopyCreateDeleteThroughTheApi) {
    const test::TempDir dir;
    fs::copy_file(tiny_llama(), dir / "tiny.gguf");
    ModelRegistry registry({.models_dir = dir.path(), .context = {.n_ctx = 256}});
    TestServer s(registry);

    EXPECT_EQ(s.call("POST", "/api/copy", {{"source", "tiny:latest"}, {"destination", "alias:v2"}}).first, 200);
    EXPECT_TRUE(fs::exists(dir / "alias:v2.gguf"));
    EXPECT_EQ(fs::hard_link_count(dir / "tiny.gguf"), 2u) << "a copy is a hard link: no bytes copied";
    EXPECT_EQ(tag_names(s), (std::vector<std::string>{"alias:v2", "tiny"}));

    // Hostile and wrong names are refused naming them; nothing is written outside the directory.
    std::string e = error_of(s.call("POST", "/api/copy", {{"source", "tiny"}, {"destination", "../escape"}}), 400);
    EXPECT_NE(e.find("'../escape'"), std::string::npos) << e;
    EXPECT_NE(e.find("destination"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(dir.path().parent_path() / "escape.gguf"));
    e = error_of(s.call("POST", "/api/copy", {{"source", "nope"}, {"destination", "x"}}), 404);
    EXPECT_NE(e.find("'nope'"), std::string::npos) << e;
    error_of(s.call("POST", "/api/copy", {{"source", "tiny"}}), 400);
    e = error_of(s.call("DELETE", "/api/delete", {{"model", "../tiny"}}), 400);
    EXPECT_NE(e.find("'../tiny'"), std::string::npos) << e;
    e = error_of(s.call("DELETE", "/api/delete", {{"model", "nope"}}), 404);
    EXPECT_NE(e.find("'nope'"), std::string::npos) << e;

    // Create from a GGUF path with a system prompt and parameters: streamed status lines.
    const json create = {{"model", "brief"},
                         {"from", tiny_llama().string()},
                         {"system", "Be brief."},
                         {"parameters", {{"temperature", 0}, {"num_predict", 3}}}};
    const auto created = s.call("POST", "/api/create", create);
    ASSERT_EQ(created.first, 200) << created.second.dump();
    const std::string lines = created.second.get<std::string>();  // NDJSON: not one JSON value
    EXPECT_NE(lines.find("{\"status\":\"reading model metadata\"}\n"), std::string::npos) << lines;
    EXPECT_EQ(lines.substr(lines.size() - 21), "{\"status\":\"success\"}\n") << lines;
    EXPECT_TRUE(fs::exists(dir / "brief.fitllm.json"));
    // Its parameters are its requests' defaults: three tokens, greedy; a request's own win.
    const json chat = {{"model", "brief"}, {"stream", false}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
    auto answer = s.call("POST", "/api/chat", chat);
    ASSERT_EQ(answer.first, 200) << answer.second.dump();
    EXPECT_EQ(answer.second["eval_count"], 3);
    const auto again = s.call("POST", "/api/chat", chat);
    EXPECT_EQ(again.second["message"]["content"], answer.second["message"]["content"]) << "temperature 0";
    // The system prompt went first: the prompt is longer than the same chat to the plain model.
    json plain = chat;
    plain["model"] = "tiny";
    plain["options"] = {{"num_predict", 1}};
    const auto plain_answer = s.call("POST", "/api/chat", plain);
    EXPECT_GT(answer.second["prompt_eval_count"], plain_answer.second["prompt_eval_count"]);
    json own = chat;
    own["options"] = {{"num_predict", 2}};
    EXPECT_EQ(s.call("POST", "/api/chat", own).second["eval_count"], 2);
    // A request's own system message replaces the model's.
    json with_system = chat;
    with_system["messages"] = {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "hi"}}};
    EXPECT_EQ(s.call("POST", "/api/chat", with_system).second["prompt_eval_count"], answer.second["prompt_eval_count"]);
    const auto shown = s.call("POST", "/api/show", {{"model", "brief"}});
    EXPECT_EQ(shown.second["system"], "Be brief.");
    EXPECT_NE(shown.second["parameters"].get<std::string>().find("num_predict"), std::string::npos);
    EXPECT_NE(shown.second["modelfile"].get<std::string>().find("SYSTEM \"\"\"Be brief.\"\"\""), std::string::npos);

    // Create from a model here keeps its settings; copy keeps them too.
    EXPECT_EQ(s.call("POST", "/api/create", {{"model", "brief2"}, {"from", "brief"}, {"stream", false}}).second,
              json({{"status", "success"}}));
    EXPECT_EQ(s.call("POST", "/api/show", {{"model", "brief2"}}).second["system"], "Be brief.");
    // A copy onto a name that exists replaces that model, settings included (as Ollama does).
    EXPECT_EQ(s.call("POST", "/api/copy", {{"source", "tiny"}, {"destination", "brief2"}}).first, 200);
    EXPECT_EQ(s.call("POST", "/api/show", {{"model", "brief2"}}).second["system"], "");
    EXPECT_FALSE(fs::exists(dir / "brief2.fitllm.json"));
    EXPECT_EQ(s.call("POST", "/api/create", {{"model", "brief2"}, {"from", "brief"}, {"stream", false}}).first, 200);

    // What create cannot keep is refused naming the field.
    for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{{"template", "{{ .Prompt }}"},
                                                                                {"quantize", "q4_K_M"},
                                                                                {"adapters", {{"a.gguf", "sha256:00"}}},
                                                                                {"files", {{"m.gguf", "sha256:00"}}},
                                                                                {"modelfile", "FROM tiny"},
                                                                                {"bogus", 1}}) {
        json bad = {{"model", "x"}, {"from", "tiny"}, {field, value}};
        e = error_of(s.call("POST", "/api/create", bad), 400);
        EXPECT_NE(e.find(field), std::string::npos) << e;
    }
    e = error_of(s.call("POST", "/api/create", {{"model", "x"}, {"from", "tiny"}, {"parameters", {{"mirostat", 2}}}}),
                 400);
    EXPECT_NE(e.find("parameters.mirostat"), std::string::npos) << e;
    e = error_of(s.call("POST", "/api/create", {{"model", "x"}, {"from", (dir / "missing.gguf").string()}}), 404);
    EXPECT_NE(e.find("missing.gguf"), std::string::npos) << e;
    test::write_file(dir / "not-gguf.bin", std::as_bytes(std::span("not a model")));
    e = error_of(s.call("POST", "/api/create", {{"model", "x"}, {"from", (dir / "not-gguf.bin").string()}}), 400);
    EXPECT_NE(e.find("GGUF"), std::string::npos) << e;
    error_of(s.call("POST", "/api/create", {{"model", "x"}}), 400);
    EXPECT_FALSE(fs::exists(dir / "x.gguf"));

    // Pull: a model here is up to date; any other is refused saying how to add one. Push: never.
    EXPECT_EQ(s.call("POST", "/api/pull", {{"model", "tiny:latest"}, {"stream", false}}).second,
              json({{"status", "success"}}));
    e = error_of(s.call("POST", "/api/pull", {{"model", "llama3.2"}}), 404);
    EXPECT_NE(e.find("downloads no models"), std::string::npos) << e;
    EXPECT_NE(e.find("/api/create"), std::string::npos) << e;
    e = error_of(s.call("POST", "/api/push", {{"model", "tiny"}}), 501);
    EXPECT_NE(e.find("uploads no models"), std::string::npos) << e;

    // Delete: the file and its settings go; the other names of the file stay.
    EXPECT_EQ(s.call("DELETE", "/api/delete", {{"model", "brief"}}).first, 200);
    EXPECT_FALSE(fs::exists(dir / "brief.gguf"));
    EXPECT_FALSE(fs::exists(dir / "brief.fitllm.json"));
    EXPECT_EQ(s.call("DELETE", "/api/delete", {{"model", "alias:v2"}}).first, 200);
    EXPECT_EQ(tag_names(s), (std::vector<std::string>{"brief2", "tiny"}));
    EXPECT_EQ(s.call("POST", "/api/generate",
                     {{"model", "tiny"}, {"prompt", "hi"}, {"stream", false}, {"options", {{"num_predict", 2}}}})
                  .second["eval_count"],
              2);
    error_of(s.call("POST", "/api/embed", {{"model", "tiny"}, {"input", "hi"}}), 501);
    registry.shutdown();
}

// A created model's settings apply on the OpenAI endpoints too, as Ollama's /v1 does: its
// parameters are the defaults the request's own fields override, its system prompt the system
// message of a chat that has none. Each answer is compared with the same request spelled out
// to the plain model.
TEST(OllamaManage, ACreatedModelsSettingsApplyOnTheOpenAiEndpoints) {
    const test::TempDir dir;
    fs::copy_file(tiny_llama(), dir / "tiny.gguf");
    ModelRegistry registry({.models_dir = dir.path(), .context = {.n_ctx = 256}});
    TestServer s(registry);
    const json create = {{"model", "brief"},
                         {"from", "tiny"},
                         {"system", "Be brief."},
                         {"parameters", {{"temperature", 0}, {"num_predict", 3}, {"top_k", 1}, {"num_ctx", 256}}},
                         {"stream", false}};
    ASSERT_EQ(s.call("POST", "/api/create", create).first, 200);
    const auto post = [&](const std::string& path, const json& body) {
        const auto answer = s.call("POST", path, body);
        EXPECT_EQ(answer.first, 200) << path << " " << body.dump() << ": " << answer.second.dump();
        return answer.second;
    };
    const json user = {{"role", "user"}, {"content", "hi"}};
    const json system = {{"role", "system"}, {"content", "Be brief."}};

    // Chat: the model's system message and parameters, as if the request had said them.
    const json chat = post("/v1/chat/completions", {{"model", "brief"}, {"messages", {user}}});
    const json spelled =
        post("/v1/chat/completions",
             {{"model", "tiny"}, {"messages", {system, user}}, {"temperature", 0}, {"top_k", 1}, {"max_tokens", 3}});
    EXPECT_EQ(chat["usage"]["completion_tokens"], 3) << chat.dump();
    EXPECT_EQ(chat["usage"]["prompt_tokens"], spelled["usage"]["prompt_tokens"]);
    EXPECT_EQ(chat["choices"][0]["message"]["content"], spelled["choices"][0]["message"]["content"]);
    EXPECT_EQ(chat["model"], "brief");
    const json plain = post("/v1/chat/completions", {{"model", "tiny"}, {"messages", {user}}, {"max_tokens", 1}});
    EXPECT_GT(chat["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"]) << "the system prompt went first";
    // The request's own fields win: max_tokens, max_completion_tokens, its system message.
    EXPECT_EQ(post("/v1/chat/completions",
                   {{"model", "brief"}, {"messages", {user}}, {"max_tokens", 2}})["usage"]["completion_tokens"],
              2);
    EXPECT_EQ(
        post("/v1/chat/completions",
             {{"model", "brief"}, {"messages", {user}}, {"max_completion_tokens", 1}})["usage"]["completion_tokens"],
        1);
    const json own_system = {{"role", "system"}, {"content", "You are a pirate who answers at length."}};
    const json with_own = post("/v1/chat/completions", {{"model", "brief"}, {"messages", {own_system, user}}});
    const json own_spelled =
        post("/v1/chat/completions", {{"model", "tiny"}, {"messages", {own_system, user}}, {"max_tokens", 3}});
    EXPECT_EQ(with_own["usage"]["prompt_tokens"], own_spelled["usage"]["prompt_tokens"]) << "one system message";
    EXPECT_EQ(with_own["usage"]["completion_tokens"], 3);
    // Streamed too: the same text as the whole answer.
    const auto streamed =
        s.call("POST", "/v1/chat/completions", {{"model", "brief"}, {"messages", {user}}, {"stream", true}});
    ASSERT_EQ(streamed.first, 200);
    std::string text;
    const std::string events = streamed.second.get<std::string>();
    for (size_t at = events.find("data: {"); at != std::string::npos; at = events.find("data: {", at + 1)) {
        const json e = json::parse(events.substr(at + 6, events.find('\n', at) - at - 6));
        if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content") &&
            e["choices"][0]["delta"]["content"].is_string())
            text += e["choices"][0]["delta"]["content"].get<std::string>();
    }
    EXPECT_EQ(text, chat["choices"][0]["message"]["content"]);

    // Text completions: the parameters (no system prompt: the prompt runs as it is).
    const json done = post("/v1/completions", {{"model", "brief"}, {"prompt", "Once upon a time"}});
    const json done_spelled =
        post("/v1/completions",
             {{"model", "tiny"}, {"prompt", "Once upon a time"}, {"temperature", 0}, {"top_k", 1}, {"max_tokens", 3}});
    EXPECT_EQ(done["usage"]["completion_tokens"], 3) << done.dump();
    EXPECT_EQ(done["usage"]["prompt_tokens"], done_spelled["usage"]["prompt_tokens"]);
    EXPECT_EQ(done["choices"][0]["text"], done_spelled["choices"][0]["text"]);
    EXPECT_EQ(
        post("/v1/completions",
             {{"model", "brief"}, {"prompt", "Once upon a time"}, {"max_tokens", 1}})["usage"]["completion_tokens"],
        1);
    // num_predict -1 is no limit: max_tokens stays unset (up to the end of the context).
    ASSERT_EQ(s.call("POST", "/api/create",
                     {{"model", "endless"}, {"from", "tiny"}, {"parameters", {{"num_predict", -1}}}, {"stream", false}})
                  .first,
              200);
    EXPECT_GT(
        post("/v1/completions", {{"model", "endless"}, {"prompt", "Once upon a time"}})["usage"]["completion_tokens"],
        3);
    registry.shutdown();
}

TEST(OllamaManage, ABusyModelIsNotDeletedNorReplaced) {
    const test::TempDir dir;
    fs::copy_file(tiny_llama(), dir / "tiny.gguf");
    ModelRegistry registry({.models_dir = dir.path(), .context = {.n_ctx = 256}});
    {
        const auto held = registry.acquire("tiny");  // a request holds it
        for (const auto& attempt :
             {std::function<void()>([&] { registry.remove_model("tiny"); }), std::function<void()>([&] {
                  registry.put_model("tiny",
                                     [](const fs::path& gguf, const fs::path&) { fs::copy_file(tiny_llama(), gguf); });
              })}) {
            try {
                attempt();
                ADD_FAILURE() << "a busy model was changed";
            } catch (const ApiError& e) {
                EXPECT_EQ(e.status(), 409);
                EXPECT_NE(std::string(e.what()).find("'tiny'"), std::string::npos) << e.what();
            }
        }
        EXPECT_TRUE(fs::exists(dir / "tiny.gguf"));
        EXPECT_FALSE(fs::exists(dir / ".tiny.gguf.partial"));
    }
    // Idle now: unloaded, then removed.
    ASSERT_TRUE(registry.models().at(0).loaded);
    registry.remove_model("tiny");
    EXPECT_FALSE(fs::exists(dir / "tiny.gguf"));
    EXPECT_TRUE(registry.models().empty());
    EXPECT_EQ(registry.n_unloads(), 1u);
    registry.shutdown();
}

TEST(OllamaManage, TheOneModelOfMinusMIsNotManaged) {
    ModelRegistry registry({.model_path = tiny_llama(), .context = {.n_ctx = 256}});
    registry.load_startup_model();
    TestServer s(registry);
    for (const auto& [method, path, body] : std::vector<std::tuple<std::string, std::string, json>>{
             {"POST", "/api/copy", {{"source", "a"}, {"destination", "b"}}},
             {"DELETE", "/api/delete", {{"model", "tiny-llama-q8_0"}}},
             {"POST", "/api/create", {{"model", "b"}, {"from", tiny_llama().string()}}}}) {
        const std::string e = error_of(s.call(method, path, body), 400);
        EXPECT_NE(e.find("--models-dir"), std::string::npos) << path << ": " << e;
    }
    // -m answers to any name, so a pull of any name is up to date.
    EXPECT_EQ(s.call("POST", "/api/pull", {{"model", "llama3"}, {"stream", false}}).second,
              json({{"status", "success"}}));
    registry.shutdown();
}

}  // namespace
}  // namespace fitllm::server
