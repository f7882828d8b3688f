// The listener over real loopback sockets: a Server on its own io_context thread, driven
// by a raw connection (test_support/http.hpp) that sends exactly the bytes a test needs.
// Synchronization is by events (the handler signals when a request arrived, a gate holds
// it), never by sleeping; timeouts are short and only bounded from above.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "test_support/http.hpp"
#include "test_support/problem.hpp"
#include "server/server.hpp"

namespace idem::server {
namespace {

using namespace std::chrono_literals;
using test::RawConnection;

// A one-shot signal between the server thread and the test thread.
class Event {
 public:
  void set() {
    std::lock_guard lock(m_);
    set_ = true;
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds timeout = 5s) {
    std::unique_lock lock(m_);
    return cv_.wait_for(lock, timeout, [&] { return set_; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool set_ = false;
};

settings::Limits test_limits() {
  settings::Limits l;
  l.max_header_bytes = 16 * 1024;
  l.max_request_body = 64 * 1024;
  l.header_timeout = 200ms;
  l.body_timeout = 200ms;
  l.idle_timeout = 200ms;
  l.max_connections = 100;
  return l;
}

// Polls a condition with a deadline; for state that has no event (a counter going down).
template <class F>
bool eventually(F condition, std::chrono::milliseconds limit = 5s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

// Handler behaviour by target: "/throw" throws, "/block" waits on the gate after
// signalling `arrived`, anything else echoes "<target>:<body>".
class Harness {
  // First member, so it is destroyed last: everything below (the server, the gate timer)
  // is bound to it.
  asio::io_context ioc_{1};

 public:
  explicit Harness(settings::Limits limits = test_limits(), std::uint16_t port = 0)
      : gauge(std::make_shared<ConnectionGauge>()), limits_(limits), gate_(ioc_) {
    ListenerOptions options;
    options.endpoint = settings::Endpoint{"127.0.0.1", port};
    server = std::make_unique<Server>(
        ioc_, options, [this] { return limits_; },
        [this](Request& req, const RequestContext& ctx) { return handle(req, ctx); }, gauge,
        [this](const RequestContext&, int status, std::string_view code) {
          std::lock_guard lock(m_);
          rejects_.push_back(std::to_string(status) + " " + std::string(code));
        });
    server->start();
    thread_ = std::thread([this] { ioc_.run(); });
  }
  ~Harness() {
    ioc_.stop();
    thread_.join();
  }

  std::uint16_t port() const { return server->port(); }

  // Runs f on the server's thread and waits for it.
  template <class F>
  void on_loop(F f) {
    std::promise<void> done;
    asio::post(ioc_, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }

  void release_gate() {
    asio::post(ioc_, [this] {
      gate_open_ = true;
      gate_.cancel();
    });
  }

  std::vector<std::string> rejects() {
    std::lock_guard lock(m_);
    return rejects_;
  }
  std::set<std::uint64_t> connection_ids() {
    std::lock_guard lock(m_);
    return connection_ids_;
  }

  std::atomic<int> calls{0};
  Event arrived;
  std::shared_ptr<ConnectionGauge> gauge;
  std::unique_ptr<Server> server;

 private:
  asio::awaitable<Response> handle(Request& req, const RequestContext& ctx) {
    ++calls;
    {
      std::lock_guard lock(m_);
      connection_ids_.insert(ctx.connection_id);
    }
    if (req.target() == "/throw") throw std::runtime_error("handler bug");
    if (req.target() == "/block") {
      arrived.set();
      while (!gate_open_) {
        gate_.expires_at(asio::steady_timer::time_point::max());
        co_await gate_.async_wait(asio::as_tuple(asio::use_awaitable));
      }
    }
    Response res{http::status::ok, req.version()};
    res.set(http::field::content_type, "text/plain");
    res.body() = std::string(req.target()) + ":" + req.body();
    if (req.target().starts_with("/fields")) {
      // The header exactly as the handler received it, one "name: value" per line.
      for (const auto& f : req) {
        res.body() += "\n" + std::string(f.name_string()) + ": " + std::string(f.value());
      }
    }
    res.prepare_payload();
    co_return res;
  }

  settings::Limits limits_;
  asio::steady_timer gate_;
  bool gate_open_ = false;
  std::mutex m_;
  std::vector<std::string> rejects_;
  std::set<std::uint64_t> connection_ids_;
  std::thread thread_;
};

std::string get(std::string_view target, std::string_view extra = "") {
  return "GET " + std::string(target) + " HTTP/1.1\r\nHost: t\r\n" + std::string(extra) + "\r\n";
}

std::string post(std::string_view target, std::string_view body, std::string_view extra = "") {
  return "POST " + std::string(target) + " HTTP/1.1\r\nHost: t\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + std::string(extra) + "\r\n" + std::string(body);
}

// Sends raw bytes, expects a problem response with `status` and `code`, then a close.
void expect_refusal(Harness& h, std::string_view bytes, http::status status, std::string_view code) {
  RawConnection c(h.port());
  REQUIRE(c.try_send(bytes));
  const auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->result() == status);
  CHECK(test::problem_code(*res) == code);
  CHECK(res->header("Content-Type").value_or("") == "application/problem+json");
  CHECK_FALSE(res->keep_alive);
  CHECK(c.closed_by_peer());
}

}  // namespace

TEST_CASE("server: keep-alive serves many requests on one connection") {
  Harness h;
  RawConnection c(h.port());
  for (int i = 0; i < 100; ++i) {
    const std::string body = "n=" + std::to_string(i);
    REQUIRE(c.try_send(post("/orders", body)));
    const auto res = c.next_response();
    REQUIRE(res);
    CHECK(res->result() == http::status::ok);
    CHECK(res->body == "/orders:" + body);
    CHECK(res->keep_alive);
  }
  CHECK(h.calls == 100);
  CHECK(h.connection_ids().size() == 1);
}

TEST_CASE("server: Content-Length together with Transfer-Encoding is refused in either order") {
  Harness h;
  expect_refusal(h,
                 "POST /orders HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                 http::status::bad_request, "bad_request");
  expect_refusal(h,
                 "POST /orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
                 "Content-Length: 5\r\n\r\n0\r\n\r\n",
                 http::status::bad_request, "bad_request");
  // The variant Beast 1.81 lets through: a non-chunked coding followed by a length.
  expect_refusal(h,
                 "POST /orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n"
                 "Content-Length: 5\r\n\r\nhello",
                 http::status::bad_request, "bad_request");
  CHECK(h.calls == 0);
}

TEST_CASE("server: duplicate Content-Length and non-chunked Transfer-Encoding are refused") {
  Harness h;
  expect_refusal(h, "POST /orders HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
                 http::status::bad_request, "bad_request");
  expect_refusal(h, "POST /orders HTTP/1.1\r\nHost: t\r\nContent-Length: 5, 5\r\n\r\nhello",
                 http::status::bad_request, "bad_request");
  // Beast would read this as a request without a body and the "body" as the next request.
  expect_refusal(h,
                 "POST /orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n"
                 "GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n",
                 http::status::bad_request, "bad_request");
  expect_refusal(h, "POST /orders HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                 http::status::bad_request, "bad_request");
  CHECK(h.calls == 0);
}

TEST_CASE("server: malformed requests and bad chunking answer 400 and close") {
  Harness h;
  expect_refusal(h, "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", http::status::bad_request,
                 "bad_request");
  expect_refusal(h,
                 "POST /orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "zz\r\nhello\r\n0\r\n\r\n",
                 http::status::bad_request, "bad_request");
  CHECK(h.calls == 0);
  CHECK(h.rejects().size() == 2);
}

TEST_CASE("server: headers over the limit answer 431") {
  Harness h;
  const std::string big(20 * 1024, 'a');
  expect_refusal(h, get("/", "X-Big: " + big + "\r\n"), http::status::request_header_fields_too_large,
                 "headers_too_large");
  CHECK(h.calls == 0);
}

// Found by fuzz/request: Beast measures the start line and the field section against the
// limit separately when the whole header is already buffered at its first look, so a
// header over the limit passed or got 431 depending on how its bytes arrived. Here the
// session's first read (1 KiB) and the next (512 bytes) deliver a 1530-byte header whose
// start line and fields are each under a 1500-byte limit.
TEST_CASE("server: the header limit counts the start line and the fields together") {
  settings::Limits limits = test_limits();
  limits.max_header_bytes = 1500;
  Harness h(limits);
  const std::string head = "GET /" + std::string(780, 'a') + " HTTP/1.1\r\nHost: t\r\n";
  const std::string bytes = head + "X-Big: " + std::string(1530 - head.size() - 11, 'b') + "\r\n\r\n";
  REQUIRE(bytes.size() == 1530);
  expect_refusal(h, bytes, http::status::request_header_fields_too_large, "headers_too_large");
  CHECK(h.calls == 0);
}

TEST_CASE("server: a Content-Length over the limit answers 413 without reading the body") {
  Harness h;
  // No body follows: the 413 must come from the header alone.
  expect_refusal(h, "POST /orders HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000\r\n\r\n",
                 http::status::payload_too_large, "request_too_large");

  // With Expect: 100-continue the refusal replaces the go-ahead.
  RawConnection c(h.port());
  REQUIRE(c.try_send("POST /orders HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000\r\n"
                 "Expect: 100-continue\r\n\r\n"));
  const auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::payload_too_large);
  CHECK(c.closed_by_peer());
  CHECK(h.calls == 0);
  CHECK(h.rejects() == std::vector<std::string>{"413 request_too_large", "413 request_too_large"});
}

TEST_CASE("server: chunked bodies are decoded, and refused with 413 past the limit") {
  auto limits = test_limits();
  limits.max_request_body = 1000;
  Harness h(limits);
  {
    RawConnection c(h.port());
    REQUIRE(c.try_send("POST /orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"));
    const auto res = c.next_response();
    REQUIRE(res);
    CHECK(res->result() == http::status::ok);
    CHECK(res->body == "/orders:hello world");
  }
  const std::string chunk(600, 'x');
  expect_refusal(h,
                 "POST /orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "258\r\n" + chunk + "\r\n258\r\n" + chunk + "\r\n0\r\n\r\n",
                 http::status::payload_too_large, "request_too_large");
  CHECK(h.calls == 1);
}

TEST_CASE("server: Expect: 100-continue gets an interim response before the body") {
  Harness h;
  RawConnection c(h.port());
  const std::string body(2000, 'b');
  REQUIRE(c.try_send("POST /orders HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n"
                 "Expect: 100-continue\r\n\r\n"));
  const auto interim = c.next_response();
  REQUIRE(interim);
  CHECK(interim->result() == http::status::continue_);
  CHECK(h.calls == 0);
  REQUIRE(c.try_send(body));
  const auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::ok);
  CHECK(res->body == "/orders:" + body);
}

TEST_CASE("server: a header that never completes is answered 408 and closed (slowloris)") {
  Harness h;
  RawConnection c(h.port());
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(c.try_send("POST /orders HTTP/1.1\r\nHost: t\r\nContent-"));
  const auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::request_timeout);
  CHECK(test::problem_code(*res) == "request_timeout");
  CHECK(c.closed_by_peer());
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK(h.calls == 0);
}

TEST_CASE("server: a body that stops arriving is answered 408") {
  Harness h;
  RawConnection c(h.port());
  REQUIRE(c.try_send("POST /orders HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nonly-part"));
  const auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::request_timeout);
  CHECK(c.closed_by_peer());
  CHECK(h.calls == 0);
}

TEST_CASE("server: idle connections are closed silently after the idle timeout") {
  Harness h;
  {
    RawConnection c(h.port());
    REQUIRE(c.try_send(get("/a")));
    REQUIRE(c.next_response());
    const auto start = std::chrono::steady_clock::now();
    CHECK(c.closed_by_peer());  // no 408: no request had started
    CHECK(std::chrono::steady_clock::now() - start < 3s);
  }
  {
    RawConnection never_speaks(h.port());
    CHECK(never_speaks.closed_by_peer());
  }
  CHECK(eventually([&] { return h.server->active_connections() == 0; }));
  CHECK(h.rejects().empty());
}

TEST_CASE("server: pipelined requests are answered in order") {
  Harness h;
  RawConnection c(h.port());
  REQUIRE(c.try_send(post("/one", "1") + get("/two") + post("/three", "333")));
  const auto r1 = c.next_response();
  const auto r2 = c.next_response();
  const auto r3 = c.next_response();
  REQUIRE((r1 && r2 && r3));
  CHECK(r1->body == "/one:1");
  CHECK(r2->body == "/two:");
  CHECK(r3->body == "/three:333");
  CHECK(h.calls == 3);
}

TEST_CASE("server: HTTP/1.0 closes unless it asks for keep-alive; HEAD gets no body") {
  Harness h;
  {
    RawConnection c(h.port());
    REQUIRE(c.try_send("GET /old HTTP/1.0\r\n\r\n"));
    const auto res = c.next_response();
    REQUIRE(res);
    CHECK(res->version == 10);
    CHECK(res->body == "/old:");
    CHECK(c.closed_by_peer());
  }
  {
    RawConnection c(h.port());
    REQUIRE(c.try_send("GET /ka HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    auto res = c.next_response();
    REQUIRE(res);
    CHECK(res->keep_alive);
    REQUIRE(c.try_send("HEAD /head HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    res = c.next_response(5s, /*head_request=*/true);
    REQUIRE(res);
    CHECK(res->body.empty());
    CHECK(res->header("Content-Length") == "6");  // what the GET body would be
    REQUIRE(c.try_send("GET /after HTTP/1.0\r\n\r\n"));      // still in sync after HEAD
    res = c.next_response();
    REQUIRE(res);
    CHECK(res->body == "/after:");
  }
}

TEST_CASE("server: a handler exception answers 500 and the server keeps serving") {
  Harness h;
  RawConnection c(h.port());
  REQUIRE(c.try_send(get("/throw")));
  auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::internal_server_error);
  CHECK(test::problem_code(*res) == "internal_error");
  REQUIRE(c.try_send(get("/fine")));  // same connection
  res = c.next_response();
  REQUIRE(res);
  CHECK(res->body == "/fine:");
  RawConnection other(h.port());  // and new connections
  REQUIRE(other.try_send(get("/other")));
  REQUIRE(other.next_response());
  CHECK(h.calls == 3);
  CHECK(h.rejects() == std::vector<std::string>{"500 internal_error"});
}

TEST_CASE("server: connections over max_connections get 503 and are closed") {
  auto limits = test_limits();
  limits.max_connections = 2;
  limits.idle_timeout = 10s;  // the two admitted connections must stay open
  Harness h(limits);
  RawConnection a(h.port()), b(h.port());
  for (RawConnection* c : {&a, &b}) {
    REQUIRE(c->try_send(get("/x")));
    REQUIRE(c->next_response());
  }
  CHECK(h.gauge->open == 2);

  RawConnection refused(h.port());
  const auto res = refused.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::service_unavailable);
  CHECK(test::problem_code(*res) == "too_many_connections");
  CHECK(refused.closed_by_peer());
  CHECK(h.rejects() == std::vector<std::string>{"503 too_many_connections"});

  a.close();
  REQUIRE(eventually([&] { return h.gauge->open == 1; }));
  RawConnection admitted(h.port());
  REQUIRE(admitted.try_send(get("/y")));
  const auto ok = admitted.next_response();
  REQUIRE(ok);
  CHECK(ok->result() == http::status::ok);
}

TEST_CASE("server: stop_accepting refuses new connects while an in-flight request completes") {
  Harness h;
  RawConnection busy(h.port());
  REQUIRE(busy.try_send(get("/block")));
  REQUIRE(h.arrived.wait());

  h.on_loop([&] { h.server->stop_accepting(); });
  CHECK(test::connect_errno(h.port()) == ECONNREFUSED);

  h.release_gate();
  const auto res = busy.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::ok);
  CHECK(res->body == "/block:");
  CHECK_FALSE(res->keep_alive);  // draining: the last response says so
  CHECK(busy.closed_by_peer());
  CHECK(eventually([&] { return h.gauge->open == 0; }));
}

TEST_CASE("server: close_idle closes idle connections now and busy ones after their response") {
  auto limits = test_limits();
  limits.idle_timeout = 10s;
  Harness h(limits);
  RawConnection idle(h.port());
  REQUIRE(idle.try_send(get("/warm")));
  REQUIRE(idle.next_response());
  RawConnection busy(h.port());
  REQUIRE(busy.try_send(get("/block")));
  REQUIRE(h.arrived.wait());

  h.on_loop([&] { h.server->close_idle(); });
  CHECK(idle.closed_by_peer());

  h.release_gate();
  const auto res = busy.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::ok);
  CHECK_FALSE(res->keep_alive);
  CHECK(busy.closed_by_peer());
}

TEST_CASE("server: several servers share a port with SO_REUSEPORT") {
  Harness first;
  Harness second(test_limits(), first.port());
  CHECK(second.port() == first.port());
  RawConnection c(first.port());
  REQUIRE(c.try_send(get("/shared")));
  const auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->body == "/shared:");
  CHECK(first.calls + second.calls == 1);
}

}  // namespace idem::server

namespace idem::server {

TEST_CASE("server: trailer fields never reach the handler as header fields") {
  Harness h;
  RawConnection c(h.port());
  REQUIRE(c.try_send("POST /fields HTTP/1.1\r\nHost: t\r\nX-Tenant-Id: me\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n"
                 "5\r\nhello\r\n0\r\nX-Tenant-Id: victim\r\nHost: evil\r\nX-User-Id: admin\r\n\r\n"));
  const auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::ok);
  CHECK(res->body ==
        "/fields:hello\nHost: t\nX-Tenant-Id: me\nTransfer-Encoding: chunked");
  CHECK(res->keep_alive);
}

TEST_CASE("server: a chunk extension or a trailer that never ends is refused at the budget") {
  // Bounded by max_header_bytes (16 KiB here), long before the 200 ms body timeout, which
  // would answer 408: the buffer does not grow with what the client sends.
  Harness h;
  const std::string head = "POST /orders HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  expect_refusal(h, head + "1;" + std::string(40 * 1024, 'e'), http::status::bad_request,
                 "bad_request");
  expect_refusal(h, head + "1\r\nx\r\n0\r\nX-Long: " + std::string(40 * 1024, 't'),
                 http::status::request_header_fields_too_large, "headers_too_large");
  // Many complete extensions, each short, that add up past the budget.
  std::string many = head;
  for (int i = 0; i < 40; ++i) many += "1;" + std::string(500, 'e') + "\r\nx\r\n";
  expect_refusal(h, many + "0\r\n\r\n", http::status::bad_request, "bad_request");
  // Many complete trailer fields that add up past it.
  std::string fields = head + "1\r\nx\r\n0\r\n";
  for (int i = 0; i < 40; ++i) fields += "X-T" + std::to_string(i) + ": " + std::string(500, 't') + "\r\n";
  expect_refusal(h, fields + "\r\n", http::status::request_header_fields_too_large,
                 "headers_too_large");
  CHECK(h.calls == 0);
  CHECK(h.rejects() == std::vector<std::string>{"400 bad_request", "431 headers_too_large",
                                                "400 bad_request", "431 headers_too_large"});
}

TEST_CASE("server: HTTP/1.1 without exactly one valid Host answers 400 and closes") {
  Harness h;
  expect_refusal(h, "GET / HTTP/1.1\r\n\r\n", http::status::bad_request, "bad_request");
  expect_refusal(h, "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", http::status::bad_request,
                 "bad_request");
  expect_refusal(h, "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", http::status::bad_request,
                 "bad_request");
  expect_refusal(h, "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", http::status::bad_request,
                 "bad_request");
  CHECK(h.calls == 0);
  RawConnection c(h.port());
  REQUIRE(c.try_send("GET /old HTTP/1.0\r\n\r\n"));  // HTTP/1.0 may omit it
  const auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::ok);
}

TEST_CASE("server: the handler sees the normalized target; absolute-form sets Host") {
  Harness h;
  RawConnection c(h.port());
  REQUIRE(c.try_send("GET http://Backend.example:81/x/../%6Frders?a=%6f HTTP/1.1\r\nHost: other\r\n\r\n"));
  auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->body == "/orders?a=o:");
  REQUIRE(c.try_send(get("/fields/./x")));
  res = c.next_response();
  REQUIRE(res);
  CHECK(res->body == "/fields/x:\nHost: t");
  REQUIRE(c.try_send("GET http://h.example/fields HTTP/1.1\r\nHost: other\r\n\r\n"));
  res = c.next_response();
  REQUIRE(res);
  CHECK(res->body == "/fields:\nHost: h.example");
  expect_refusal(h, get("/orders#frag"), http::status::bad_request, "bad_request");
  expect_refusal(h, get("/%zz"), http::status::bad_request, "bad_request");
  expect_refusal(h, "CONNECT h.example:443 HTTP/1.1\r\nHost: h.example:443\r\n\r\n",
                 http::status::bad_request, "bad_request");
}

TEST_CASE("server: Connection: close in a second Connection field closes the connection") {
  Harness h;
  RawConnection c(h.port());
  REQUIRE(c.try_send(get("/x", "Connection: keep-alive\r\nConnection: close\r\n")));
  const auto res = c.next_response();
  REQUIRE(res);
  CHECK(res->result() == http::status::ok);
  CHECK_FALSE(res->keep_alive);
  CHECK(c.closed_by_peer());
}

}  // namespace idem::server
