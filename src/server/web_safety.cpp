#include "server/web_safety.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>

namespace fitllm::server {
namespace {

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

bool is_ip_literal(const std::string& host) {
    unsigned char buf[16];
    return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

bool is_wildcard(const std::string& host) {
    return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

bool is_loopback(const std::string& host) {
    return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// "http://Example.com:80/" -> "http://example.com" (scheme and host lower-cased, the scheme's
// default port and a trailing slash dropped), for comparing origins.
std::string normalize_origin(std::string_view origin) {
    std::string o = lower(origin);
    while (!o.empty() && o.back() == '/') o.pop_back();
    if (o.size() > 3 && o.compare(o.size() - 3, 3, ":80") == 0 && o.rfind("http://", 0) == 0) o.resize(o.size() - 3);
    if (o.size() > 4 && o.compare(o.size() - 4, 4, ":443") == 0 && o.rfind("https://", 0) == 0) o.resize(o.size() - 4);
    return o;
}

}  // namespace

std::optional<std::string> WebSafety::host_name(std::string_view host_header) {
    std::string_view h = host_header;
    while (!h.empty() && (h.front() == ' ' || h.front() == '\t')) h.remove_prefix(1);
    while (!h.empty() && (h.back() == ' ' || h.back() == '\t')) h.remove_suffix(1);
    if (h.empty()) return std::nullopt;
    std::string_view name;
    std::string_view port;
    if (h.front() == '[') {  // [v6]:port
        const size_t close = h.find(']');
        if (close == std::string_view::npos) return std::nullopt;
        name = h.substr(1, close - 1);
        const std::string_view rest = h.substr(close + 1);
        if (!rest.empty()) {
            if (rest.front() != ':') return std::nullopt;
            port = rest.substr(1);
        }
    } else {
        const size_t colon = h.rfind(':');
        name = h.substr(0, colon);
        if (colon != std::string_view::npos) port = h.substr(colon + 1);
        if (name.find(':') != std::string_view::npos) return std::nullopt;  // a bare v6 address is not a Host
    }
    if (!std::all_of(port.begin(), port.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
        return std::nullopt;
    }
    std::string out = lower(name);
    if (!out.empty() && out.back() == '.') out.pop_back();
    if (out.empty()) return std::nullopt;
    const bool ok = std::all_of(out.begin(), out.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' || c == ':' || c == '%';
    });
    if (!ok) return std::nullopt;
    return out;
}

bool WebSafety::is_local_origin(std::string_view origin) {
    const std::string o = normalize_origin(origin);
    std::string_view rest = o;
    if (rest.rfind("http://", 0) == 0) {
        rest.remove_prefix(7);
    } else if (rest.rfind("https://", 0) == 0) {
        rest.remove_prefix(8);
    } else {
        return false;
    }
    if (rest.find_first_of("/?#@") != std::string_view::npos) return false;  // an origin has no path or user
    const std::optional<std::string> name = host_name(rest);
    if (!name) return false;
    unsigned char buf[16];
    const bool v4_loopback = name->rfind("127.", 0) == 0 && inet_pton(AF_INET, name->c_str(), buf) == 1;
    return *name == "localhost" || *name == "::1" || v4_loopback;
}

WebSafety::WebSafety(WebSafetyOptions options) {
    const std::string bind = lower(options.bind_host);
    any_address_ = is_wildcard(bind);
    std::string bound = bind;
    if (bound.size() > 2 && bound.front() == '[' && bound.back() == ']') bound = bound.substr(1, bound.size() - 2);
    if (!any_address_) hosts_.push_back(bound);
    if (any_address_ || is_loopback(bound)) {
        hosts_.insert(hosts_.end(), {"localhost", "127.0.0.1", "::1"});
    }
    if (any_address_) {
        char name[256] = {};
        if (gethostname(name, sizeof name - 1) == 0 && name[0]) hosts_.push_back(lower(name));
    }
    for (const std::string& h : options.allowed_hosts) {
        if (h == "*") {
            allow_any_host_ = true;
        } else if (const auto name = host_name(h)) {
            hosts_.push_back(*name);
        }
    }
    allow_local_origins_ = options.cors_origins.empty();
    for (const std::string& o : options.cors_origins) {
        if (o == "*") {
            allow_any_origin_ = true;
        } else if (o != "none") {
            origins_.push_back(normalize_origin(o));
        }
    }
}

bool WebSafety::host_allowed(const std::string* host_header) const {
    if (!host_header || allow_any_host_) return true;
    const std::optional<std::string> name = host_name(*host_header);
    if (!name) return false;
    if (std::find(hosts_.begin(), hosts_.end(), *name) != hosts_.end()) return true;
    return any_address_ && is_ip_literal(*name);
}

OriginVerdict WebSafety::check_origin(const std::string* origin, const std::string* host_header) const {
    if (!origin) return OriginVerdict::none;
    const std::string o = normalize_origin(*origin);
    if (host_header && o != "null") {
        const size_t scheme_end = o.find("://");
        if (scheme_end != std::string::npos) {
            const std::string authority = o.substr(scheme_end + 3);
            std::string host = lower(*host_header);
            if (o.rfind("http://", 0) == 0 && host.size() > 3 && host.compare(host.size() - 3, 3, ":80") == 0) {
                host.resize(host.size() - 3);
            }
            if (authority == host) return OriginVerdict::same_origin;
        }
    }
    if (allow_any_origin_ || (allow_local_origins_ && is_local_origin(o)) ||
        std::find(origins_.begin(), origins_.end(), o) != origins_.end()) {
        return OriginVerdict::cross_origin;
    }
    return OriginVerdict::refused;
}

Headers WebSafety::cors_headers(const std::string& origin) const {
    return {{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}};
}

Headers WebSafety::preflight_headers(const std::string& origin, const std::string* requested_headers) const {
    Headers h = cors_headers(origin);
    h.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    h.emplace_back("Access-Control-Allow-Headers", requested_headers && !requested_headers->empty()
                                                       ? *requested_headers
                                                       : "Authorization, Content-Type");
    h.emplace_back("Access-Control-Max-Age", "600");
    return h;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
    // Every byte of b is looked at whatever a holds; the lengths' difference is folded in.
    volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
    for (size_t i = 0; i < b.size(); ++i) {
        const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        diff = diff | static_cast<unsigned char>(x ^ static_cast<unsigned char>(b[i]));
    }
    return diff == 0;
}

bool bearer_matches(const std::string* authorization, const std::string& key) {
    if (!authorization) return false;
    constexpr std::string_view kBearer = "Bearer ";
    if (authorization->size() < kBearer.size() || lower(authorization->substr(0, kBearer.size())) != "bearer ") {
        return false;
    }
    return constant_time_equal(std::string_view(*authorization).substr(kBearer.size()), key);
}

}  // namespace fitllm::server
