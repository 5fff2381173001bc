// The HTTP transport with a stand-in handler, over raw loopback sockets: keep-alive, the whole-
// request deadline against clients that dribble bytes, quick answers while every worker is busy,
// the worker line's bound, the connection caps (the oldest waiting connection evicted, 503 when
// all are busy), the body and header limits before the body is read, 100-continue, the body's
// memory charged, streaming, and a client that hangs up noticed while its request runs.
#include "server/http_transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "memory/device.h"

namespace fitllm::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class StandIn : public HttpHandler {
public:
    bool admit(const HttpRequest& head, HttpResponse& res) override {
        if (head.path != "/refuse") return true;
        res.status = 403;
        res.body = "{\"code\":\"refused\"}";
        return false;
    }
    bool needs_worker(const HttpRequest& req) const override { return req.path != "/quick"; }
    void handle(HttpRequest& req, HttpResponse& res) override {
        if (req.path == "/quick") {
            res.body = "quick";
        } else if (req.path == "/echo") {
            res.body = req.body;
        } else if (req.path == "/block") {
            std::unique_lock lock(mutex_);
            ++blocked_;
            cv_.notify_all();
            while (!open_ && !req.client_gone()) cv_.wait_for(lock, 10ms);  // as handlers poll their job
            saw_gone_ = saw_gone_ || req.client_gone();
            --blocked_;
            cv_.notify_all();
            res.body = "done";
        } else if (req.path == "/stream") {
            res.content_type = "text/plain";
            res.stream = [this](BodyWriter& w) {
                for (int i = 0; i < 200; ++i) {
                    if (!w.write("piece " + std::to_string(i) + "\n")) {
                        std::lock_guard lock(mutex_);
                        stream_failed_at_ = i;
                        cv_.notify_all();
                        return;
                    }
                    std::this_thread::sleep_for(i < 3 ? 0ms : 20ms);
                }
            };
        } else if (req.path == "/throw") {
            throw std::runtime_error("boom");
        } else {
            res.status = 404;
        }
    }
    void refused(const HttpRequest*, int status, std::string_view code) override {
        std::lock_guard lock(mutex_);
        refusals_.push_back(std::to_string(status) + " " + std::string(code));
    }
    std::string error_body(int, std::string_view code, const std::string&) override {
        return "{\"code\":\"" + std::string(code) + "\"}";
    }

    void open_gate() {
        std::lock_guard lock(mutex_);
        open_ = true;
        cv_.notify_all();
    }
    // Waits (bounded) until pred() holds under the lock.
    template <class Pred>
    bool wait_for(Pred pred, std::chrono::milliseconds timeout = 5000ms) {
        std::unique_lock lock(mutex_);
        return cv_.wait_for(lock, timeout, [&] { return pred(); });
    }

    std::mutex mutex_;
    std::condition_variable cv_;
    int blocked_ = 0;
    bool open_ = false;
    bool saw_gone_ = false;
    int stream_failed_at_ = -1;
    std::vector<std::string> refusals_;
};

// A client socket with bounded reads.
class Client {
public:
    explicit Client(int port) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ADD_FAILURE() << "connect failed";
    }
    ~Client() { close(); }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    bool send(const std::string& s) {
        size_t done = 0;
        while (done < s.size()) {
            const ssize_t n = ::send(fd_, s.data() + done, s.size() - done, MSG_NOSIGNAL);
            if (n <= 0) return false;
            done += static_cast<size_t>(n);
        }
        return true;
    }
    // Reads until `until` is in what came (or the peer closed, or the timeout).
    std::string read_until(const std::string& until, std::chrono::milliseconds timeout = 5000ms) {
        const auto deadline = Clock::now() + timeout;
        while (got_.find(until) == std::string::npos && !closed_) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
            if (left <= 0) break;
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
            char buf[65536];
            const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) {
                closed_ = true;
                break;
            }
            got_.append(buf, static_cast<size_t>(n));
        }
        return got_;
    }
    // One whole answer with a Content-Length body; what came after it stays for the next.
    std::string response(std::chrono::milliseconds timeout = 5000ms) {
        read_until("\r\n\r\n", timeout);
        const size_t end = got_.find("\r\n\r\n");
        if (end == std::string::npos) return std::exchange(got_, "");
        size_t length = 0;
        const size_t cl = got_.find("Content-Length: ");
        if (cl != std::string::npos && cl < end) length = std::stoul(got_.substr(cl + 16));
        const auto deadline = Clock::now() + timeout;
        while (got_.size() < end + 4 + length && !closed_ && Clock::now() < deadline) read_until("\x01", 100ms);
        std::string r = got_.substr(0, std::min(got_.size(), end + 4 + length));
        got_.erase(0, r.size());
        return r;
    }
    bool closed_by_peer(std::chrono::milliseconds timeout) {
        read_until("\x01", timeout);
        return closed_;
    }

private:
    int fd_ = -1;
    std::string got_;
    bool closed_ = false;
};

std::string get(const std::string& path) {
    return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
}
std::string post(const std::string& path, const std::string& body) {
    return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body;
}

class TransportTest : public ::testing::Test {
protected:
    void start(TransportLimits limits, uint64_t budget = 64 << 20) {
        device_ = std::make_unique<memory::Device>("host", budget);
        transport_ = std::make_unique<HttpTransport>(handler_, limits, &device_->pool("requests"));
        ASSERT_TRUE(transport_->bind("127.0.0.1", 0)) << transport_->error();
        io_ = std::thread([this] { transport_->run(); });
    }
    void TearDown() override {
        handler_.open_gate();
        if (transport_) transport_->stop();
        if (io_.joinable()) io_.join();
    }
    int port() const { return transport_->port(); }
    static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

    StandIn handler_;
    std::unique_ptr<memory::Device> device_;
    std::unique_ptr<HttpTransport> transport_;
    std::thread io_;
};

TEST_F(TransportTest, AnswersAndKeepsTheConnectionAlive) {
    start({});
    Client c(port());
    ASSERT_TRUE(c.send(get("/quick") + post("/echo", "hello")));  // pipelined
    const std::string a = c.response();
    EXPECT_EQ(a.substr(0, 15), "HTTP/1.1 200 OK");
    EXPECT_NE(a.find("\r\n\r\nquick"), std::string::npos);
    EXPECT_NE(c.response().find("\r\n\r\nhello"), std::string::npos);
    ASSERT_TRUE(c.send(get("/throw")));
    const std::string e = c.response();
    EXPECT_NE(e.find("500"), std::string::npos);
    EXPECT_NE(e.find("internal_error"), std::string::npos);
    ASSERT_TRUE(c.send(get("/refuse")));
    EXPECT_NE(c.response().find("403"), std::string::npos);
    ASSERT_TRUE(c.send(get("/quick")));  // still alive after the refusal (it had no body)
    EXPECT_NE(c.response().find("quick"), std::string::npos);
}

TEST_F(TransportTest, SlowRequestsAreCutAtTheDeadlineAndDoNotHoldUpOthers) {
    start({.request_timeout = 1000ms, .n_workers = 2});
    std::vector<std::unique_ptr<Client>> slow;
    for (int i = 0; i < 32; ++i) slow.push_back(std::make_unique<Client>(port()));
    const auto began = Clock::now();
    const std::string head = get("/echo");
    // One byte every 100 ms: each read is quick, the whole request is not.
    for (size_t b = 0; b < 5; ++b) {
        for (auto& c : slow) c->send(head.substr(b, 1));
        Client quick(port());
        const auto asked = Clock::now();
        quick.send(get("/quick"));
        EXPECT_NE(quick.response().find("quick"), std::string::npos);
        EXPECT_LT(seconds_since(asked), 0.5) << "a quick request waited behind slow ones";
        std::this_thread::sleep_for(100ms);
    }
    for (auto& c : slow) EXPECT_TRUE(c->closed_by_peer(3000ms)) << "a dribbling client outlived the deadline";
    EXPECT_GT(seconds_since(began), 0.9);
    const auto deadline = Clock::now() + 2s;  // the counters follow the closes on the I/O thread
    while (transport_->stats().timed_out < 32 && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
    EXPECT_EQ(transport_->stats().timed_out, 32u);
    EXPECT_EQ(transport_->stats().open_connections, 0);
}

TEST_F(TransportTest, QuickAnswersWhileEveryWorkerIsBusyAndTheLineIsBounded) {
    start({.n_workers = 2, .max_waiting = 1});
    std::vector<std::unique_ptr<Client>> busy;
    for (int i = 0; i < 2; ++i) {
        busy.push_back(std::make_unique<Client>(port()));
        busy.back()->send(get("/block"));
    }
    ASSERT_TRUE(handler_.wait_for([&] { return handler_.blocked_ == 2; }));
    Client waiting(port());
    waiting.send(get("/block"));  // waits for a worker
    std::this_thread::sleep_for(100ms);
    Client refused(port());
    refused.send(get("/block"));
    const std::string r = refused.response();
    EXPECT_NE(r.find("503"), std::string::npos) << r;
    EXPECT_NE(r.find("server_busy"), std::string::npos);
    EXPECT_NE(r.find("Retry-After"), std::string::npos);
    Client quick(port());
    quick.send(get("/quick"));
    EXPECT_NE(quick.response(1000ms).find("quick"), std::string::npos);
    handler_.open_gate();
    for (auto& c : busy) EXPECT_NE(c->response().find("done"), std::string::npos);
    EXPECT_NE(waiting.response().find("done"), std::string::npos);
}

TEST_F(TransportTest, ConnectionCapsEvictTheOldestWaitingOrRefuse) {
    start({.max_connections = 6, .max_connections_per_client = 3, .n_workers = 4});
    std::vector<std::unique_ptr<Client>> idle;
    for (int i = 0; i < 3; ++i) {
        idle.push_back(std::make_unique<Client>(port()));
        std::this_thread::sleep_for(20ms);
    }
    // A 4th from the same address: the oldest idle one goes, the new one is served.
    Client fourth(port());
    fourth.send(get("/quick"));
    EXPECT_NE(fourth.response().find("quick"), std::string::npos);
    EXPECT_TRUE(idle[0]->closed_by_peer(2000ms));
    EXPECT_FALSE(idle[1]->closed_by_peer(100ms));
    EXPECT_GE(transport_->stats().evicted, 1u);
    fourth.close();
    for (auto& c : idle) c->close();
    std::this_thread::sleep_for(100ms);

    // Three busy ones: nobody to evict, so a 4th is refused.
    std::vector<std::unique_ptr<Client>> busy;
    for (int i = 0; i < 3; ++i) {
        busy.push_back(std::make_unique<Client>(port()));
        busy.back()->send(get("/block"));
    }
    ASSERT_TRUE(handler_.wait_for([&] { return handler_.blocked_ == 3; }));
    Client refused(port());
    const std::string r = refused.response();
    EXPECT_NE(r.find("503"), std::string::npos) << r;
    EXPECT_NE(r.find("too_many_connections"), std::string::npos);
    EXPECT_GE(transport_->stats().refused, 1u);
    handler_.open_gate();
}

TEST_F(TransportTest, BodyAndHeaderLimitsBeforeTheBodyIsRead) {
    start({.max_body = 1000, .max_header_bytes = 2048});
    {
        Client c(port());  // the headers alone: the answer comes without the body being sent
        c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 30000000\r\n\r\n");
        const std::string r = c.response();
        EXPECT_NE(r.find("413"), std::string::npos) << r;
        EXPECT_NE(r.find("request_too_large"), std::string::npos);
    }
    {
        Client c(port());  // chunked, over the limit as it comes
        c.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
        for (int i = 0; i < 3; ++i) c.send("200\r\n" + std::string(512, 'a') + "\r\n");
        EXPECT_NE(c.response().find("413"), std::string::npos);
    }
    {
        Client c(port());
        c.send("GET /quick HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4000, 'b') + "\r\n\r\n");
        const std::string r = c.response();
        EXPECT_NE(r.find("431"), std::string::npos) << r;
    }
    {
        Client c(port());
        c.send("NOT HTTP AT ALL\r\n\r\n");
        EXPECT_NE(c.response().find("400"), std::string::npos);
    }
    {
        Client c(port());  // 100-continue: the body is asked for once the headers passed
        c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
        EXPECT_NE(c.read_until("\r\n\r\n").find("100 Continue"), std::string::npos);
        c.send("hello");
        EXPECT_NE(c.read_until("hello").find("200 OK"), std::string::npos);
    }
    {
        Client c(port());  // chunked within the limit
        c.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
        EXPECT_NE(c.response().find("\r\n\r\nhello"), std::string::npos);
    }
}

TEST_F(TransportTest, TheBodyIsChargedBeforeItIsRead) {
    start({.max_body = 1 << 20}, /*budget=*/256 << 10);
    memory::Pool& pool = device_->pool("requests");
    Client c(port());  // more than the whole budget: 413
    c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\n");
    std::string r = c.response();
    EXPECT_NE(r.find("413"), std::string::npos) << r;
    EXPECT_NE(r.find("request_too_large"), std::string::npos);
    {
        const memory::Charge other = pool.charge(150000, "another request");  // the room is taken: 503
        Client e(port());
        e.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
        r = e.response();
        EXPECT_NE(r.find("503"), std::string::npos) << r;
        EXPECT_NE(r.find("over_budget"), std::string::npos);
        EXPECT_NE(r.find("Retry-After"), std::string::npos);
    }
    Client d(port());
    d.send(post("/echo", std::string(100000, 'z')));
    EXPECT_NE(d.response().find("zzzz"), std::string::npos);
    d.close();
    c.close();
    const auto deadline = Clock::now() + 2s;
    while (pool.live() != 0 && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
    EXPECT_EQ(pool.live(), 0u) << "the body's and the connections' charges are given back";
    EXPECT_GE(pool.peak(), 100000u);
}

TEST_F(TransportTest, StreamsChunksAndNoticesAClientThatLeaves) {
    start({});
    {
        Client c(port());
        c.send(get("/stream"));
        const std::string got = c.read_until("piece 2\n");
        EXPECT_NE(got.find("Transfer-Encoding: chunked"), std::string::npos);
        EXPECT_NE(got.find("piece 0\n"), std::string::npos);
    }  // closed mid-stream
    ASSERT_TRUE(handler_.wait_for([&] { return handler_.stream_failed_at_ >= 0; }, 3000ms))
        << "the stream went on after its client left";
    EXPECT_LT(handler_.stream_failed_at_, 100);

    // A request that runs without writing: its client's leaving shows in client_gone().
    {
        Client c(port());
        c.send(get("/block"));
        ASSERT_TRUE(handler_.wait_for([&] { return handler_.blocked_ == 1; }));
    }
    EXPECT_TRUE(handler_.wait_for([&] { return handler_.saw_gone_; }, 2000ms));
}

TEST_F(TransportTest, StopEndsRunningRequests) {
    start({});
    Client c(port());
    c.send(get("/block"));
    ASSERT_TRUE(handler_.wait_for([&] { return handler_.blocked_ == 1; }));
    const auto asked = Clock::now();
    transport_->stop();
    io_.join();
    EXPECT_LT(seconds_since(asked), 5.0);
    EXPECT_TRUE(handler_.saw_gone_);
}

}  // namespace
}  // namespace fitllm::server
