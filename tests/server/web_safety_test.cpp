// The Host and Origin checks that keep a web page from driving a local server (DNS rebinding,
// blind cross-origin POSTs), the CORS headers for allowed origins, and the API key's comparison.
#include "server/web_safety.h"

#include <gtest/gtest.h>

namespace fitllm::server {
namespace {

bool host_ok(const WebSafety& s, const std::string& host) {
    return s.host_allowed(&host);
}

TEST(WebSafety, HostNameParsesPortsAndBrackets) {
    EXPECT_EQ(WebSafety::host_name("LocalHost:8080"), "localhost");
    EXPECT_EQ(WebSafety::host_name("127.0.0.1"), "127.0.0.1");
    EXPECT_EQ(WebSafety::host_name("[::1]:80"), "::1");
    EXPECT_EQ(WebSafety::host_name("example.com.:80"), "example.com");
    EXPECT_EQ(WebSafety::host_name(""), std::nullopt);
    EXPECT_EQ(WebSafety::host_name("a:b"), std::nullopt);         // a port that is not a number
    EXPECT_EQ(WebSafety::host_name("::1"), std::nullopt);         // a v6 address without brackets
    EXPECT_EQ(WebSafety::host_name("evil.com/x"), std::nullopt);  // not a host
    EXPECT_EQ(WebSafety::host_name("[::1"), std::nullopt);
}

TEST(WebSafety, LoopbackServerTakesItsOwnNamesOnly) {
    const WebSafety s({.bind_host = "127.0.0.1"});
    EXPECT_TRUE(host_ok(s, "127.0.0.1:8080"));
    EXPECT_TRUE(host_ok(s, "localhost:8080"));
    EXPECT_TRUE(host_ok(s, "localhost"));
    EXPECT_TRUE(host_ok(s, "[::1]:8080"));
    EXPECT_FALSE(host_ok(s, "evil.example:8080"));  // DNS rebinding
    EXPECT_FALSE(host_ok(s, "10.1.2.3:8080"));
    EXPECT_FALSE(host_ok(s, "x"));
    EXPECT_FALSE(host_ok(s, "localhost.evil.example"));
    EXPECT_TRUE(s.host_allowed(nullptr));  // no Host: not a browser
}

TEST(WebSafety, AllowedHostsAddNamesAndStarTurnsTheCheckOff) {
    const WebSafety s({.bind_host = "127.0.0.1", .allowed_hosts = {"my.box", "Other.Box:9000"}});
    EXPECT_TRUE(host_ok(s, "my.box:8080"));
    EXPECT_TRUE(host_ok(s, "other.box"));
    EXPECT_FALSE(host_ok(s, "third.box"));
    const WebSafety any({.bind_host = "127.0.0.1", .allowed_hosts = {"*"}});
    EXPECT_TRUE(host_ok(any, "whatever.example"));
}

TEST(WebSafety, EveryInterfaceTakesAddressLiteralsButNotNames) {
    const WebSafety s({.bind_host = "0.0.0.0"});
    EXPECT_TRUE(host_ok(s, "192.168.1.20:8080"));  // a literal cannot be re-resolved
    EXPECT_TRUE(host_ok(s, "[fe80::1]:8080"));
    EXPECT_TRUE(host_ok(s, "localhost:8080"));
    EXPECT_FALSE(host_ok(s, "evil.example:8080"));
}

TEST(WebSafety, SpecificAddressTakesThatAddress) {
    const WebSafety s({.bind_host = "192.168.1.20"});
    EXPECT_TRUE(host_ok(s, "192.168.1.20:8080"));
    EXPECT_FALSE(host_ok(s, "localhost:8080"));
    EXPECT_FALSE(host_ok(s, "192.168.1.21:8080"));
}

TEST(WebSafety, OriginsSameCrossAndRefused) {
    const WebSafety s({.bind_host = "127.0.0.1", .cors_origins = {"http://localhost:3000/", "https://app.example"}});
    const std::string host = "127.0.0.1:8080";
    auto verdict = [&](const std::string& origin) { return s.check_origin(&origin, &host); };
    EXPECT_EQ(s.check_origin(nullptr, &host), OriginVerdict::none);
    EXPECT_EQ(verdict("http://127.0.0.1:8080"), OriginVerdict::same_origin);  // the server's own page
    EXPECT_EQ(verdict("http://localhost:3000"), OriginVerdict::cross_origin);
    EXPECT_EQ(verdict("HTTPS://APP.example:443"), OriginVerdict::cross_origin);
    EXPECT_EQ(verdict("http://evil.example"), OriginVerdict::refused);
    EXPECT_EQ(verdict("http://127.0.0.1:9999"), OriginVerdict::refused);  // another port is another origin
    EXPECT_EQ(verdict("null"), OriginVerdict::refused);                   // sandboxed frames, file://
    const std::string port80 = "localhost:80";
    const std::string origin80 = "http://localhost";
    EXPECT_EQ(s.check_origin(&origin80, &port80), OriginVerdict::same_origin);

    const WebSafety any({.bind_host = "127.0.0.1", .cors_origins = {"*"}});
    const std::string evil = "http://evil.example";
    EXPECT_EQ(any.check_origin(&evil, &host), OriginVerdict::cross_origin);
}

TEST(WebSafety, PagesOnThisMachineByDefaultOrNone) {
    const std::string host = "127.0.0.1:8080";
    const WebSafety local({.bind_host = "127.0.0.1"});  // no --cors-origin
    auto verdict = [&](const WebSafety& s, const std::string& origin) { return s.check_origin(&origin, &host); };
    for (const char* o : {"http://localhost:5173", "http://127.0.0.1:3000", "https://[::1]:8443", "http://localhost",
                          "HTTP://LocalHost:3000/", "http://127.1.2.3:80"}) {
        EXPECT_EQ(verdict(local, o), OriginVerdict::cross_origin) << o;
    }
    for (const char* o :
         {"http://evil.example", "http://localhost.evil.example", "http://127.0.0.1.evil.example", "null", "file://",
          "http://user@localhost:3000", "ws://localhost:3000", "http://127.0.0.1.5:80", "http://[::2]:80"}) {
        EXPECT_EQ(verdict(local, o), OriginVerdict::refused) << o;
    }
    EXPECT_EQ(verdict(local, "http://127.0.0.1:8080"), OriginVerdict::same_origin);
    // A list replaces the default; "none" allows no other origin at all.
    const WebSafety listed({.bind_host = "127.0.0.1", .cors_origins = {"https://app.example"}});
    EXPECT_EQ(verdict(listed, "http://localhost:5173"), OriginVerdict::refused);
    EXPECT_EQ(verdict(listed, "https://app.example"), OriginVerdict::cross_origin);
    const WebSafety none({.bind_host = "127.0.0.1", .cors_origins = {"none"}});
    EXPECT_EQ(verdict(none, "http://localhost:5173"), OriginVerdict::refused);
    EXPECT_EQ(verdict(none, "http://none"), OriginVerdict::refused);
    EXPECT_EQ(verdict(none, "http://127.0.0.1:8080"), OriginVerdict::same_origin);
}

TEST(WebSafety, CorsHeadersEchoTheOrigin) {
    const WebSafety s({.bind_host = "127.0.0.1", .cors_origins = {"http://localhost:3000"}});
    const Headers h = s.cors_headers("http://localhost:3000");
    EXPECT_EQ(h[0], (std::pair<std::string, std::string>{"Access-Control-Allow-Origin", "http://localhost:3000"}));
    const std::string asked = "content-type, authorization";
    const Headers p = s.preflight_headers("http://localhost:3000", &asked);
    bool methods = false, headers = false;
    for (const auto& [k, v] : p) {
        methods |= k == "Access-Control-Allow-Methods" && v.find("POST") != std::string::npos;
        headers |= k == "Access-Control-Allow-Headers" && v == asked;
    }
    EXPECT_TRUE(methods && headers);
}

TEST(WebSafety, KeyComparison) {
    EXPECT_TRUE(constant_time_equal("secret", "secret"));
    EXPECT_FALSE(constant_time_equal("secreT", "secret"));
    EXPECT_FALSE(constant_time_equal("secret-and-more", "secret"));
    EXPECT_FALSE(constant_time_equal("sec", "secret"));
    EXPECT_FALSE(constant_time_equal("", "secret"));
    EXPECT_TRUE(constant_time_equal("", ""));
    const std::string good = "Bearer k3y", lower = "bearer k3y", bad = "Bearer k3", basic = "Basic k3y";
    EXPECT_TRUE(bearer_matches(&good, "k3y"));
    EXPECT_TRUE(bearer_matches(&lower, "k3y"));
    EXPECT_FALSE(bearer_matches(&bad, "k3y"));
    EXPECT_FALSE(bearer_matches(&basic, "k3y"));
    EXPECT_FALSE(bearer_matches(nullptr, "k3y"));
}

}  // namespace
}  // namespace fitllm::server
