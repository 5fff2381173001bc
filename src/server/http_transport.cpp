#include "server/http_transport.h"

#include <malloc.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace fitllm::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// The memory a connection holds besides its request's body: the read buffer (the headers at
// most, plus one read), the parser and the socket's objects.
uint64_t connection_bytes(const TransportLimits& limits) {
    return uint64_t{limits.max_header_bytes} + 16384;
}
// After an error answered before the body was read, the connection reads (and drops) what the
// client still sends for up to this long and this many bytes before closing, so that the client
// sees the answer instead of a reset (closing a socket with unread data resets it).
constexpr std::chrono::milliseconds kLingerTime{1000};
constexpr uint64_t kLingerBytes = uint64_t{4} << 20;
// After a body this large, the heap's free pages go back to the system (glibc keeps freed memory
// resident, and raises its mmap threshold after a large free, so the next one would stay).
constexpr size_t kTrimAfterBodyBytes = size_t{8} << 20;

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
            return false;
        }
    }
    return true;
}

// Threads for the handlers that block, and a bounded line of requests waiting for one.
class WorkerPool {
public:
    WorkerPool(int n_threads, int max_waiting) : max_waiting_(static_cast<size_t>(std::max(0, max_waiting))) {
        for (int i = 0; i < std::max(1, n_threads); ++i) threads_.emplace_back([this] { loop(); });
    }
    ~WorkerPool() { stop(); }

    // false when every thread is busy and the line is full (or the pool stopped).
    bool try_post(std::function<void()> task) {
        std::lock_guard lock(mutex_);
        if (stopping_ || tasks_.size() >= static_cast<size_t>(idle_) + max_waiting_) return false;
        tasks_.push_back(std::move(task));
        cv_.notify_one();
        return true;
    }

    // Lets the running tasks end, drops the waiting ones, joins. Idempotent.
    void stop() {
        std::deque<std::function<void()>> dropped;
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
            dropped.swap(tasks_);
        }
        cv_.notify_all();
        for (std::thread& t : threads_) {
            if (t.joinable()) t.join();
        }
    }

    int busy() const {
        std::lock_guard lock(mutex_);
        return static_cast<int>(threads_.size()) - idle_;
    }
    int waiting() const {
        std::lock_guard lock(mutex_);
        return static_cast<int>(tasks_.size());
    }

private:
    void loop() {
        std::unique_lock lock(mutex_);
        while (true) {
            ++idle_;
            cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
            --idle_;
            if (stopping_) return;
            std::function<void()> task = std::move(tasks_.front());
            tasks_.pop_front();
            lock.unlock();
            task();
            task = nullptr;  // what it holds goes here, not under the lock
            lock.lock();
        }
    }

    const size_t max_waiting_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> tasks_;
    std::vector<std::thread> threads_;
    int idle_ = 0;
    bool stopping_ = false;
};

std::string status_line(int status) {
    return std::to_string(status) + " " + std::string(http::obsolete_reason(static_cast<http::status>(status)));
}

}  // namespace

const std::string* HttpRequest::header(std::string_view name) const {
    for (const auto& [k, v] : headers) {
        if (iequals(k, name)) return &v;
    }
    return nullptr;
}

void HttpRequest::free_body() {
    std::string().swap(body);
    body_charge.release();
}

class HttpTransport::Impl {
public:
    class Connection;

    Impl(HttpHandler& handler, TransportLimits limits, memory::Pool* pool)
        : handler_(handler),
          limits_(limits),
          pool_(pool),
          acceptor_(ioc_),
          accept_retry_(ioc_),
          workers_(limits.n_workers, limits.max_waiting) {}

    bool bind(const std::string& host, int port);
    void run();
    void stop();

    void accept();
    void admit_connection(tcp::socket socket);
    bool make_room(const std::string& client);
    bool evict_oldest_waiting(const std::string* client);
    void refuse(tcp::socket& socket, int status, std::string_view code, const std::string& message);
    void forget(uint64_t id, const std::string& client);

    HttpHandler& handler_;
    TransportLimits limits_;
    memory::Pool* pool_;
    net::io_context ioc_{1};
    tcp::acceptor acceptor_;
    net::steady_timer accept_retry_;
    WorkerPool workers_;
    std::string error_;
    int port_ = 0;
    std::atomic<bool> stopping_{false};

    std::mutex run_mutex_;
    std::condition_variable run_cv_;
    bool in_run_ = false;
    std::atomic<bool> running_{false};

    // The I/O thread's alone.
    std::unordered_map<uint64_t, std::shared_ptr<Connection>> connections_;
    std::unordered_map<std::string, int> per_client_;
    uint64_t next_id_ = 0;

    std::atomic<int> open_{0};
    std::atomic<uint64_t> accepted_{0}, refused_{0}, evicted_{0}, timed_out_{0};
};

// One client connection: reads a request (headers, then the body) under the deadline, hands it
// to the handler, writes the answer, and again while the client keeps it alive. Everything but
// the BodyWriter's calls runs on the I/O thread.
class HttpTransport::Impl::Connection : public std::enable_shared_from_this<Connection> {
public:
    Connection(Impl& t, tcp::socket socket, std::string client, uint64_t id, memory::Charge charge)
        : t_(t),
          stream_(std::move(socket)),
          buffer_(t.limits_.max_header_bytes + 4096),
          client_(std::move(client)),
          id_(id),
          charge_(std::move(charge)) {}

    void start() { read_request(); }
    bool waiting() const { return state_ == State::waiting; }
    Clock::time_point since() const { return since_; }
    const std::string& client() const { return client_; }

    void close() {
        if (state_ == State::closed) return;
        const auto self = shared_from_this();  // forget() drops the transport's reference
        state_ = State::closed;
        if (gone_) gone_->store(true);
        beast::error_code ec;
        stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
        stream_.close();
        t_.forget(id_, client_);
    }

private:
    enum class State { waiting, busy, closed };
    class StreamWriter;

    void read_request() {
        state_ = State::waiting;
        since_ = Clock::now();
        if (buffer_.size() == 0) buffer_.shrink_to_fit();  // an idle connection holds no buffer
        parser_.emplace();
        parser_->header_limit(t_.limits_.max_header_bytes);
        parser_->body_limit(t_.limits_.max_body);
        stream_.expires_after(t_.limits_.request_timeout);
        http::async_read_header(stream_, buffer_, *parser_,
                                [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
    }

    // A read that failed: the client left, was too slow, or sent something that is not HTTP.
    void read_failed(beast::error_code ec, const HttpRequest* head) {
        if (ec == beast::error::timeout) {
            if (!head && !parser_->got_some()) return close();  // an idle connection, not a slow request
            ++t_.timed_out_;
            t_.handler_.refused(head, 408, "request_timeout");
            return close();  // the stream closed the socket already
        }
        if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
            return answer_error(
                head, 431, "headers_too_large",
                "the request's headers are over " + std::to_string(t_.limits_.max_header_bytes) + " bytes");
        }
        if (ec == http::error::body_limit) return body_too_large(head, 0);
        if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
            ec == net::error::operation_aborted || ec == http::error::partial_message) {
            return close();
        }
        answer_error(head, 400, "bad_request", "malformed HTTP request: " + ec.message());
    }

    void on_header(beast::error_code ec) {
        if (state_ == State::closed) return;
        if (ec) return read_failed(ec, nullptr);
        const auto& msg = parser_->get();
        head_ = HttpRequest{};
        head_.method = std::string(msg.method_string());
        head_.target = std::string(msg.target());
        head_.path = head_.target.substr(0, head_.target.find('?'));
        head_.version = msg.version() >= 11 ? 11 : 10;
        version_ = head_.version;
        for (const auto& field : msg) head_.headers.emplace_back(field.name_string(), field.value());
        head_.client = client_;
        keep_alive_ = msg.keep_alive();

        const bool chunked = parser_->chunked();
        const uint64_t length = parser_->content_length().value_or(0);
        const bool has_body = chunked || length > 0;
        HttpResponse refusal;
        if (!t_.handler_.admit(head_, refusal)) {
            state_ = State::busy;
            refusal.close = refusal.close || has_body;
            return write_whole(std::move(refusal), /*linger=*/has_body);
        }
        if (length > t_.limits_.max_body) return body_too_large(&head_, length);
        // The body's memory, charged before it is read: a chunked body may grow to the limit.
        const uint64_t body_bytes = chunked ? t_.limits_.max_body : length;
        if (body_bytes > 0 && t_.pool_) {
            try {
                head_.body_charge = t_.pool_->charge(body_bytes, "a request's body");
            } catch (const memory::BudgetError& e) {
                const memory::Device& device = t_.pool_->device();
                const uint64_t others = device.live() - t_.pool_->live();  // the models' memory
                if (body_bytes > device.capacity() - std::min(others, device.capacity())) {
                    return answer_error(&head_, 413, "request_too_large",
                                        "the request's body of " + std::to_string(body_bytes) +
                                            " bytes is more than the memory budget holds besides the models (" +
                                            e.what() + ")");
                }
                return answer_error(&head_, 503, "over_budget",
                                    "the memory budget has no room for this request's body of " +
                                        std::to_string(body_bytes) + " bytes now; try again later (" + e.what() + ")",
                                    {{"Retry-After", "1"}});
            }
        }
        if (chunked) parser_->get().body().reserve(body_bytes);
        if (parser_->is_done()) return dispatch();
        const auto expect = msg.find(http::field::expect);
        if (expect != msg.end() && iequals(expect->value(), "100-continue")) {
            static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
            net::async_write(stream_, net::buffer(kContinue), [self = shared_from_this()](beast::error_code e, size_t) {
                if (self->state_ == State::closed) return;
                if (e) return self->close();
                self->read_body();
            });
            return;
        }
        read_body();
    }

    void read_body() {
        http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
            if (self->state_ == State::closed) return;
            if (ec) return self->read_failed(ec, &self->head_);
            self->dispatch();
        });
    }

    void body_too_large(const HttpRequest* head, uint64_t length) {
        answer_error(head, 413, "request_too_large",
                     (length > 0 ? "the request's body has " + std::to_string(length) + " bytes; "
                                 : std::string("the request's body is too large; ")) +
                         "this server takes at most " + std::to_string(t_.limits_.max_body) + " (--max-body)");
    }

    // Answers an error of the transport's own and closes the connection after it.
    void answer_error(const HttpRequest* head, int status, std::string_view code, const std::string& message,
                      Headers headers = {}) {
        state_ = State::busy;
        t_.handler_.refused(head, status, code);
        HttpResponse res;
        res.status = status;
        res.body = t_.handler_.error_body(status, code, message);
        res.headers = std::move(headers);
        res.close = true;
        write_whole(std::move(res), /*linger=*/true);
    }

    void dispatch() {
        state_ = State::busy;
        since_ = Clock::now();
        stream_.expires_never();
        auto req = std::make_shared<HttpRequest>(std::move(head_));
        req->body = std::move(parser_->get().body());
        parser_.reset();
        gone_ = std::make_shared<std::atomic<bool>>(false);
        req->gone = gone_;
        watch();
        if (!t_.handler_.needs_worker(*req)) {  // a quick one, answered whole
            HttpResponse res;
            run_handler(*req, res);
            if (res.stream) {
                res = HttpResponse{};
                res.status = 500;
                res.body = t_.handler_.error_body(500, "internal_error", "a quick handler cannot stream");
            }
            return write_whole(std::move(res), false);
        }
        if (!t_.workers_.try_post([self = shared_from_this(), req] { self->work(*req); })) {
            answer_error(req.get(), 503, "server_busy",
                         "every worker thread is busy and " + std::to_string(t_.limits_.max_waiting) +
                             " requests wait for one; try again later",
                         {{"Retry-After", "1"}});
        }
    }

    void run_handler(HttpRequest& req, HttpResponse& res) {
        try {
            t_.handler_.handle(req, res);
        } catch (const std::exception& e) {
            res = HttpResponse{};
            res.status = 500;
            res.body = t_.handler_.error_body(500, "internal_error", std::string("internal error: ") + e.what());
        }
    }

    // On a worker thread.
    void work(HttpRequest& req) {
        const size_t body_bytes = req.body.size();
        HttpResponse res;
        run_handler(req, res);
        req.free_body();
        if (body_bytes >= kTrimAfterBodyBytes) malloc_trim(0);  // a large body's pages go back
        auto self = shared_from_this();
        if (!res.stream) {
            net::post(t_.ioc_, [self, res = std::make_shared<HttpResponse>(std::move(res))] {
                if (self->state_ != State::closed) self->write_whole(std::move(*res), false);
            });
            return;
        }
        bool ok = stream_answer(res);
        net::post(t_.ioc_, [self, ok] {
            if (self->state_ == State::closed) return;
            if (ok && self->keep_alive_ && !self->t_.stopping_) return self->next_request();
            self->close();
        });
    }

    bool stream_answer(HttpResponse& res);

    // Notices a client that hangs up while its request runs: the socket turns readable with
    // nothing to read. (Bytes of a next, pipelined request stop the watch: they wait.)
    void watch() {
        const uint64_t generation = ++watch_;
        stream_.socket().async_wait(
            tcp::socket::wait_read, [self = shared_from_this(), generation](beast::error_code ec) {
                if (ec || generation != self->watch_ || self->state_ != State::busy) return;
                char c;
                const ssize_t n = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                    self->gone_->store(true);
                    return self->close();
                }
                if (n < 0) self->watch();
            });
    }

    void next_request() {
        ++watch_;
        beast::error_code ec;
        stream_.socket().cancel(ec);  // the watch
        read_request();
    }

    void write_whole(HttpResponse res, bool linger) {
        auto msg =
            std::make_shared<http::response<http::string_body>>(static_cast<http::status>(res.status), head_version());
        if (!res.content_type.empty()) msg->set(http::field::content_type, res.content_type);
        for (const auto& [k, v] : res.headers) msg->set(k, v);
        msg->body() = std::move(res.body);
        const bool keep = keep_alive_ && !res.close && !t_.stopping_;
        msg->keep_alive(keep);
        msg->prepare_payload();
        stream_.expires_after(t_.limits_.write_timeout);
        http::async_write(stream_, *msg, [self = shared_from_this(), msg, keep, linger](beast::error_code ec, size_t) {
            if (self->state_ == State::closed) return;
            if (ec) {
                if (ec == beast::error::timeout) ++self->t_.timed_out_;
                return self->close();
            }
            if (keep) return self->next_request();
            if (linger) return self->linger();
            self->close();
        });
    }

    unsigned head_version() const { return version_ == 10 ? 10 : 11; }

    // Half-closes, then drops what the client still sends for a while (see kLingerTime).
    void linger() {
        ++watch_;
        beast::error_code ec;
        stream_.socket().cancel(ec);  // the watch, if any: the drain reads now
        stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
        stream_.expires_after(kLingerTime);
        scratch_ = std::make_unique<std::array<char, 4096>>();
        drain();
    }
    void drain() {
        stream_.async_read_some(net::buffer(*scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
            if (self->state_ == State::closed) return;
            self->drained_ += n;
            if (ec || self->drained_ > kLingerBytes) return self->close();
            self->drain();
        });
    }

    // --- for StreamWriter (on the I/O thread) ---
    template <class Buffers>
    void write_buffers(const Buffers& buffers, std::function<void(bool)> done) {
        if (state_ == State::closed) return done(false);
        stream_.expires_after(t_.limits_.write_timeout);
        net::async_write(stream_, buffers,
                         [self = shared_from_this(), done = std::move(done)](beast::error_code ec, size_t) {
                             if (ec) {
                                 if (ec == beast::error::timeout) ++self->t_.timed_out_;
                                 self->close();
                             }
                             done(!ec);
                         });
    }

    Impl& t_;
    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    HttpRequest head_;
    int version_ = 11;
    bool keep_alive_ = false;
    State state_ = State::waiting;
    Clock::time_point since_ = Clock::now();
    std::shared_ptr<std::atomic<bool>> gone_;
    uint64_t watch_ = 0;
    std::unique_ptr<std::array<char, 4096>> scratch_;
    uint64_t drained_ = 0;
    std::string client_;
    uint64_t id_;
    memory::Charge charge_;
};

// Writes a streamed answer from a worker: each write is done by the I/O thread while the worker
// waits for it (the I/O thread runs until every worker has stopped, so the wait ends).
class HttpTransport::Impl::Connection::StreamWriter : public BodyWriter {
public:
    StreamWriter(Connection& c, bool chunked) : c_(c), chunked_(chunked) {}

    bool write(std::string_view data) override {
        if (failed_ || c_.gone_->load()) return false;
        if (data.empty()) return true;
        return run([this, data](std::function<void(bool)> done) {
            if (chunked_) {
                c_.write_buffers(http::make_chunk(net::buffer(data.data(), data.size())), std::move(done));
            } else {
                c_.write_buffers(net::buffer(data.data(), data.size()), std::move(done));
            }
        });
    }
    bool client_gone() const override { return failed_ || c_.gone_->load(); }

    bool write_raw(std::string_view data) {
        return run([this, data](std::function<void(bool)> done) {
            c_.write_buffers(net::buffer(data.data(), data.size()), std::move(done));
        });
    }
    bool finish() {
        if (failed_) return false;
        if (!chunked_) return true;
        return run(
            [this](std::function<void(bool)> done) { c_.write_buffers(http::make_chunk_last(), std::move(done)); });
    }

private:
    template <class Op>
    bool run(Op op) {
        std::promise<bool> promise;
        std::future<bool> result = promise.get_future();
        net::post(c_.t_.ioc_,
                  [op = std::move(op), &promise]() mutable { op([&promise](bool ok) { promise.set_value(ok); }); });
        if (!result.get()) failed_ = true;
        return !failed_;
    }

    Connection& c_;
    const bool chunked_;
    bool failed_ = false;
};

bool HttpTransport::Impl::Connection::stream_answer(HttpResponse& res) {
    // HTTP/1.0 has no chunks: the body goes as it is and the connection closes after it.
    const bool chunked = version_ != 10;
    if (!chunked) keep_alive_ = false;
    std::string head = "HTTP/1.1 " + status_line(res.status) + "\r\n";
    if (!res.content_type.empty()) head += "Content-Type: " + res.content_type + "\r\n";
    for (const auto& [k, v] : res.headers) head += k + ": " + v + "\r\n";
    head += chunked ? "Transfer-Encoding: chunked\r\n" : "";
    head += keep_alive_ && !t_.stopping_ ? "" : "Connection: close\r\n";
    head += "\r\n";
    StreamWriter writer(*this, chunked);
    if (!writer.write_raw(head)) return false;
    res.stream(writer);
    return writer.finish();
}

bool HttpTransport::Impl::bind(const std::string& host, int port) {
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    const auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
    if (ec) {
        error_ = "cannot resolve '" + host + "': " + ec.message();
        return false;
    }
    for (const auto& entry : endpoints) {
        beast::error_code e;
        acceptor_.open(entry.endpoint().protocol(), e);
        if (!e) acceptor_.set_option(net::socket_base::reuse_address(true), e);
        if (!e) acceptor_.bind(entry.endpoint(), e);
        if (!e) acceptor_.listen(net::socket_base::max_listen_connections, e);
        if (!e) {
            port_ = acceptor_.local_endpoint().port();
            break;
        }
        error_ = e.message();
        acceptor_.close(e);
    }
    if (!acceptor_.is_open()) return false;

    // Every connection is a file descriptor: make room for the cap where the hard limit allows.
    rlimit rl{};
    const rlim_t wanted = static_cast<rlim_t>(limits_.max_connections) + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < wanted) {
        rl.rlim_cur = std::min(wanted, rl.rlim_max);
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < wanted) limits_.max_connections = std::max(16, static_cast<int>(rl.rlim_cur) - 256);
    }
    return true;
}

void HttpTransport::Impl::run() {
    {
        std::lock_guard lock(run_mutex_);
        if (stopping_ || in_run_ || !acceptor_.is_open()) return;
        in_run_ = true;
    }
    running_ = true;
    accept();
    ioc_.run();
    running_ = false;
    {
        std::lock_guard lock(run_mutex_);
        in_run_ = false;
    }
    run_cv_.notify_all();
}

void HttpTransport::Impl::stop() {
    if (!stopping_.exchange(true)) {
        net::post(ioc_, [this] {
            beast::error_code ec;
            acceptor_.close(ec);
            accept_retry_.cancel();
            const auto connections = connections_;  // close() erases
            for (const auto& [id, c] : connections) c->close();
        });
        workers_.stop();  // the running handlers see their clients gone and end
        net::post(ioc_, [this] { ioc_.stop(); });
    }
    std::unique_lock lock(run_mutex_);
    run_cv_.wait(lock, [this] { return !in_run_; });
}

void HttpTransport::Impl::accept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
        if (stopping_ || ec == net::error::operation_aborted) return;
        if (ec) {
            // Out of file descriptors or buffers: try again shortly instead of spinning.
            accept_retry_.expires_after(std::chrono::milliseconds(50));
            accept_retry_.async_wait([this](beast::error_code e) {
                if (!e && !stopping_) accept();
            });
            return;
        }
        admit_connection(std::move(socket));
        accept();
    });
}

void HttpTransport::Impl::admit_connection(tcp::socket socket) {
    beast::error_code ec;
    const tcp::endpoint peer = socket.remote_endpoint(ec);
    if (ec) return;  // gone already
    net::ip::address address = peer.address();
    if (address.is_v6() && address.to_v6().is_v4_mapped()) {
        address = net::ip::make_address_v4(net::ip::v4_mapped, address.to_v6());
    }
    std::string client = address.to_string();
    if (!make_room(client)) {
        ++refused_;
        return refuse(socket, 503, "too_many_connections",
                      "too many open connections (at most " + std::to_string(limits_.max_connections) + ", " +
                          std::to_string(limits_.max_connections_per_client) +
                          " per client address), all of them busy; try again later");
    }
    memory::Charge charge;
    if (pool_) {
        try {
            charge = pool_->charge(connection_bytes(limits_), "a connection's buffers");
        } catch (const memory::BudgetError& e) {
            ++refused_;
            return refuse(socket, 503, "over_budget",
                          std::string("the memory budget has no room for another connection now: ") + e.what());
        }
    }
    const uint64_t id = ++next_id_;
    auto c = std::make_shared<Connection>(*this, std::move(socket), client, id, std::move(charge));
    connections_.emplace(id, c);
    ++per_client_[client];
    ++open_;
    ++accepted_;
    c->start();
}

bool HttpTransport::Impl::make_room(const std::string& client) {
    const auto it = per_client_.find(client);
    if (it != per_client_.end() && it->second >= limits_.max_connections_per_client && !evict_oldest_waiting(&client)) {
        return false;
    }
    if (static_cast<int>(connections_.size()) >= limits_.max_connections && !evict_oldest_waiting(nullptr)) {
        return false;
    }
    return true;
}

bool HttpTransport::Impl::evict_oldest_waiting(const std::string* client) {
    Connection* oldest = nullptr;
    for (const auto& [id, c] : connections_) {
        if (c->waiting() && (!client || c->client() == *client) && (!oldest || c->since() < oldest->since())) {
            oldest = c.get();
        }
    }
    if (!oldest) return false;
    ++evicted_;
    oldest->close();
    return true;
}

void HttpTransport::Impl::refuse(tcp::socket& socket, int status, std::string_view code, const std::string& message) {
    handler_.refused(nullptr, status, code);
    const std::string body = handler_.error_body(status, code, message);
    const std::string answer = "HTTP/1.1 " + status_line(status) +
                               "\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
                               "Content-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body;
    // One try, without waiting: a refused client gets no more of the server's time.
    (void)::send(socket.native_handle(), answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    beast::error_code ec;
    socket.shutdown(tcp::socket::shutdown_both, ec);
    socket.close(ec);
}

void HttpTransport::Impl::forget(uint64_t id, const std::string& client) {
    if (connections_.erase(id) == 0) return;
    --open_;
    const auto it = per_client_.find(client);
    if (it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
}

HttpTransport::HttpTransport(HttpHandler& handler, TransportLimits limits, memory::Pool* request_pool)
    : impl_(std::make_unique<Impl>(handler, limits, request_pool)) {}

HttpTransport::~HttpTransport() {
    stop();
}

bool HttpTransport::bind(const std::string& host, int port) {
    return impl_->bind(host, port);
}
const std::string& HttpTransport::error() const {
    return impl_->error_;
}
int HttpTransport::port() const {
    return impl_->port_;
}
void HttpTransport::run() {
    impl_->run();
}
void HttpTransport::stop() {
    impl_->stop();
}
bool HttpTransport::running() const {
    return impl_->running_;
}
const TransportLimits& HttpTransport::limits() const {
    return impl_->limits_;
}

TransportStats HttpTransport::stats() const {
    TransportStats s;
    s.open_connections = impl_->open_;
    s.accepted = impl_->accepted_;
    s.refused = impl_->refused_;
    s.evicted = impl_->evicted_;
    s.timed_out = impl_->timed_out_;
    s.busy_workers = impl_->workers_.busy();
    s.waiting_requests = impl_->workers_.waiting();
    return s;
}

}  // namespace fitllm::server
