#pragma once
// The HTTP/1.1 side of `fitllm serve` (no models here), on Boost.Beast: one I/O thread accepts,
// reads and writes every connection without blocking, and a pool of worker threads runs the
// handlers that take time (completions, tokenizing). What a slow or hostile client can hold is
// bounded:
// - a request's headers and body must arrive within request_timeout of the connection waiting
//   for it (a deadline for the whole request, not per read), every write of an answer within
//   write_timeout; a client that misses one is disconnected;
// - headers over max_header_bytes get 431, a body over max_body 413 before it is read, and the
//   body is charged to a memory pool before it is read (503 or 413 when the budget has no room);
// - at most max_connections open connections and max_connections_per_client per client address:
//   one more makes the oldest connection that is still waiting for its request (the slowest)
//   close, or is refused with 503 when every connection is busy;
// - handlers that block run on at most n_workers threads with max_waiting requests waiting for
//   one (more get 503), so quick ones (the handler says which) are answered at once meanwhile.
// A client that hangs up while its request runs is noticed at once (HttpRequest::client_gone).
//
//   HttpTransport t(handler, {.max_body = 1 << 20}, &device.pool("requests"));
//   t.bind("127.0.0.1", 0);
//   std::thread io([&] { t.run(); });  // until t.stop()
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memory/pool.h"

namespace fitllm::server {

struct TransportLimits {
    uint64_t max_body = uint64_t{1} << 20;
    uint32_t max_header_bytes = 16 << 10;
    std::chrono::milliseconds request_timeout{30'000};  // the whole request: headers and body
    std::chrono::milliseconds write_timeout{30'000};    // each write of an answer
    int max_connections = 1024;
    int max_connections_per_client = 256;
    int n_workers = 16;
    int max_waiting = 64;  // requests waiting for a worker; more get 503
};

using Headers = std::vector<std::pair<std::string, std::string>>;

// One request: its headers, then (once read) its body.
struct HttpRequest {
    std::string method;  // "GET", "POST", ...
    std::string target;  // as sent: the path and the query
    std::string path;    // the target up to '?'
    int version = 11;    // 10 (HTTP/1.0) or 11
    Headers headers;
    std::string body;
    memory::Charge body_charge;  // the body's bytes on the transport's request pool
    std::string client;          // the peer's address
    std::shared_ptr<const std::atomic<bool>> gone;

    // The first header of that name (case-insensitive); nullptr when there is none.
    const std::string* header(std::string_view name) const;
    // Set once the client hung up (or the server is stopping): its answer has nobody to go to.
    bool client_gone() const { return gone && gone->load(); }
    // Gives the body's memory and its charge back (once the handler has parsed it).
    void free_body();
};

// The body of an answer being streamed, written from a worker thread.
class BodyWriter {
public:
    virtual ~BodyWriter() = default;
    // Sends data (one chunk); false when the client is gone or did not take it within the write
    // timeout. Blocks until the data is written.
    virtual bool write(std::string_view data) = 0;
    virtual bool client_gone() const = 0;
};

struct HttpResponse {
    int status = 200;
    std::string content_type = "application/json";
    Headers headers;
    std::string body;
    // Set: after the status and headers, this streams the body (chunked) from the worker thread.
    std::function<void(BodyWriter&)> stream;
    bool close = false;  // close the connection after this answer
};

class HttpHandler {
public:
    virtual ~HttpHandler() = default;
    // On the I/O thread once a request's headers are in, before its body is read: return false
    // with `res` filled to refuse it (the body is then not read). Must be quick.
    virtual bool admit(const HttpRequest& head, HttpResponse& res) = 0;
    // Whether handle() may take long (it then runs on a worker thread) or is quick (it runs on
    // the I/O thread, so it is answered even when every worker is busy).
    virtual bool needs_worker(const HttpRequest& req) const = 0;
    // Fills res; an exception becomes a 500.
    virtual void handle(HttpRequest& req, HttpResponse& res) = 0;
    // An error the transport answered itself (400, 408, 413, 431, 503), for the counters;
    // `head` is nullptr when the request's headers were not read.
    virtual void refused(const HttpRequest* head, int status, std::string_view code) = 0;
    // The body of such an error: an error body naming `message`, with `code`.
    virtual std::string error_body(int status, std::string_view code, const std::string& message) = 0;
};

struct TransportStats {
    int open_connections = 0;
    uint64_t accepted = 0;
    uint64_t refused = 0;    // connections refused: every one busy at a cap
    uint64_t evicted = 0;    // connections closed to make room (they were waiting for a request)
    uint64_t timed_out = 0;  // requests not in within request_timeout, writes not taken in time
    int busy_workers = 0;
    int waiting_requests = 0;
};

class HttpTransport {
public:
    // handler and request_pool (may be nullptr: nothing charged) must outlive the transport.
    HttpTransport(HttpHandler& handler, TransportLimits limits, memory::Pool* request_pool);
    ~HttpTransport();  // stop()
    HttpTransport(const HttpTransport&) = delete;
    HttpTransport& operator=(const HttpTransport&) = delete;

    // Binds and listens on host:port (port 0: a free one). Returns false with error() set when it
    // cannot.
    bool bind(const std::string& host, int port);
    const std::string& error() const;
    int port() const;
    // Serves until stop(). Call once, after bind().
    void run();
    // Closes the listener and every connection, lets the running handlers end (their clients
    // are gone), then makes run() return. From any thread but a worker; idempotent.
    void stop();
    bool running() const;
    TransportStats stats() const;
    const TransportLimits& limits() const;

private:
    class Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace fitllm::server
