#pragma once
// What keeps a web page from driving a server on this machine, and the API key's check.
// - Host: a browser that a page turned against a local server (DNS rebinding: evil.example
//   re-resolved to 127.0.0.1) still sends Host: evil.example. Only the names and addresses the
//   server serves are accepted: its listening address, `localhost` when it listens on loopback or
//   on every interface, any address literal when it listens on every interface (a literal cannot
//   be re-resolved), and the names given with --allowed-hosts ("*": any).
// - Origin: browsers send it with every cross-origin request (and every POST), simple
//   `text/plain` POSTs included. A request from another origin is refused unless it is allowed,
//   and then answered with the CORS headers; the server's own page is same-origin. Allowed by
//   default: pages served from this machine (http or https on localhost, 127.x.x.x or [::1], any
//   port: a local front end during development); --cors-origin replaces that with its list ("*":
//   any origin, "none": no other origin at all).
// - The API key is compared in constant time.
//
//   WebSafety safety({.bind_host = "127.0.0.1", .cors_origins = {"http://localhost:3000"}});
//   safety.host_allowed("localhost:8080");                       // true
//   safety.check_origin("http://evil.example", "localhost:8080"); // refused
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/http_transport.h"

namespace fitllm::server {

struct WebSafetyOptions {
    std::string bind_host;                   // the address the server listens on (--host)
    std::vector<std::string> allowed_hosts;  // --allowed-hosts: more names; "*" turns the check off
    // --cors-origin: origins a page may call from; "*" any, "none" none; empty: this machine's
    std::vector<std::string> cors_origins;
};

enum class OriginVerdict {
    none,          // no Origin header: not a cross-origin browser request
    same_origin,   // the server's own page
    cross_origin,  // another origin that --cors-origin allows: answer with the CORS headers
    refused,
};

class WebSafety {
public:
    explicit WebSafety(WebSafetyOptions options);

    // Whether a request with this Host header is for this server; a request without one (not
    // from a browser) is.
    bool host_allowed(const std::string* host_header) const;
    OriginVerdict check_origin(const std::string* origin, const std::string* host_header) const;
    // The headers of an answer to an allowed cross-origin request.
    Headers cors_headers(const std::string& origin) const;
    // The answer's headers to a CORS preflight (OPTIONS) from an allowed origin.
    Headers preflight_headers(const std::string& origin, const std::string* requested_headers) const;

    // "evil.example:8080" -> "evil.example", "[::1]:80" -> "::1"; lower-cased, a trailing dot
    // dropped. std::nullopt when it is not a host.
    static std::optional<std::string> host_name(std::string_view host_header);
    // Whether an origin is a page on this machine: http or https on localhost, 127.x.x.x or ::1.
    static bool is_local_origin(std::string_view origin);

private:
    bool allow_any_host_ = false;
    bool allow_any_origin_ = false;
    bool allow_local_origins_ = false;  // no --cors-origin: pages on this machine
    bool any_address_ = false;          // listening on every interface
    std::vector<std::string> hosts_;
    std::vector<std::string> origins_;
};

// a == b in a time that depends on b's length only (b: the secret).
bool constant_time_equal(std::string_view a, std::string_view b);

// The API key check: "Bearer KEY" in an Authorization header.
bool bearer_matches(const std::string* authorization, const std::string& key);

}  // namespace fitllm::server
