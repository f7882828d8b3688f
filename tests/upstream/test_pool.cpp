// The upstream pool against a scripted fake backend on loopback. Pool, backend and test
// body share one io_context on the test thread, so the order of events is under the
// test's control: the backend signals what it saw (a request, a close) through AsyncEvent
// instead of the test sleeping.
#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include "upstream/client.hpp"

namespace idem::upstream {
namespace {

using namespace std::chrono_literals;
using tcp = asio::ip::tcp;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// Set once, awaited by any number of coroutines on the same (single) thread.
class AsyncEvent {
 public:
  explicit AsyncEvent(asio::io_context& ioc) : timer_(ioc) {
    timer_.expires_at(asio::steady_timer::time_point::max());
  }
  void set() {
    set_ = true;
    timer_.cancel();
  }
  asio::awaitable<void> wait() {
    while (!set_) co_await timer_.async_wait(use_tuple);
  }
  bool is_set() const { return set_; }

 private:
  asio::steady_timer timer_;
  bool set_ = false;
};

enum class Mode {
  normal,               // 200 with an echo, keep-alive
  close_after_response, // answers, then closes the connection (stale idle connection)
  connection_close,     // answers with "Connection: close"
  silent,               // reads the request and never answers
  close_after_request,  // reads the request and closes without answering
  big_body,             // a 2000-byte body
  garbage,              // not HTTP
  interim,              // "100 Continue" before the final response
  bodiless_then_stray,  // first answer 204, then bytes before the next answer on the connection
  chunked_with_trailer, // a chunked 200 whose trailer repeats Location and adds X-Trailer
  sized_header,         // "/N": a 200 whose header (start line and fields) is N bytes, half each
};

// A response whose header, start line and field section together, is exactly `size` bytes
// (at least 64): the reason phrase fills half of it, an X-Pad field the rest.
std::string response_with_header_of(std::size_t size) {
  const std::string start = "HTTP/1.1 200 ";
  const std::string fields = "Content-Length: 2\r\nX-Pad: ";
  const std::size_t reason = size / 2 - start.size() - 2;  // the start line is size / 2
  const std::size_t pad = size - size / 2 - fields.size() - 4;
  return start + std::string(reason, 'r') + "\r\n" + fields + std::string(pad, 'p') + "\r\n\r\nok";
}

class Backend {
  asio::io_context& ioc_;
  Mode mode_;
  tcp::acceptor acceptor_;

 public:
  Backend(asio::io_context& ioc, Mode mode)
      : ioc_(ioc), mode_(mode), acceptor_(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)),
        request_seen(ioc), closed(ioc) {
    asio::co_spawn(ioc_, accept_loop(), asio::detached);
  }

  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

  int connections = 0;
  int requests = 0;
  std::string last_host;
  AsyncEvent request_seen;  // a complete request was read
  AsyncEvent closed;        // the backend closed a connection on purpose

 private:
  asio::awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, socket] = co_await acceptor_.async_accept(use_tuple);
      if (ec) co_return;
      ++connections;
      asio::co_spawn(ioc_, serve(std::move(socket)), asio::detached);
    }
  }

  asio::awaitable<void> serve(tcp::socket socket) {
    beast::flat_buffer buffer;
    bool owes_stray = false;  // Mode::bodiless_then_stray
    for (;;) {
      http::request<http::string_body> req;
      auto [ec, n] = co_await http::async_read(socket, buffer, req, use_tuple);
      if (ec) co_return;
      ++requests;
      last_host = std::string(req[http::field::host]);
      request_seen.set();

      switch (mode_) {
        case Mode::silent: {
          // Hold the connection open until the client gives up on it.
          char sink[64];
          while (true) {
            auto [rec, rn] = co_await socket.async_read_some(asio::buffer(sink), use_tuple);
            if (rec) co_return;
          }
        }
        case Mode::close_after_request:
          socket.close();
          closed.set();
          co_return;
        case Mode::garbage: {
          const std::string junk = "HELLO THERE\r\n\r\n";
          co_await asio::async_write(socket, asio::buffer(junk), use_tuple);
          socket.close();
          co_return;
        }
        case Mode::interim: {
          const std::string cont = "HTTP/1.1 100 Continue\r\n\r\n";
          co_await asio::async_write(socket, asio::buffer(cont), use_tuple);
          break;
        }
        case Mode::bodiless_then_stray: {
          // "/a" gets a 204 whose body goes out only with the next answer on this
          // connection.
          if (req.target() == "/a") {
            const std::string bytes = "HTTP/1.1 204 No Content\r\n\r\n";
            co_await asio::async_write(socket, asio::buffer(bytes), use_tuple);
            owes_stray = true;
            continue;
          }
          if (owes_stray) {
            const std::string junk = "junk!";
            co_await asio::async_write(socket, asio::buffer(junk), use_tuple);
            owes_stray = false;
          }
          break;
        }
        case Mode::sized_header: {
          const std::string bytes = response_with_header_of(std::stoul(std::string(req.target().substr(1))));
          co_await asio::async_write(socket, asio::buffer(bytes), use_tuple);
          continue;
        }
        case Mode::chunked_with_trailer: {
          const std::string bytes =
              "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nLocation: /header\r\n\r\n"
              "5\r\nhello\r\n0\r\nLocation: /trailer\r\nX-Trailer: 1\r\n\r\n";
          co_await asio::async_write(socket, asio::buffer(bytes), use_tuple);
          continue;
        }
        default:
          break;
      }

      http::response<http::string_body> res{http::status::ok, 11};
      res.set(http::field::content_type, "text/plain");
      res.body() = mode_ == Mode::big_body ? std::string(2000, 'x')
                                           : "echo " + std::string(req.target()) + " " + req.body();
      res.keep_alive(mode_ != Mode::connection_close);
      res.prepare_payload();
      if (req.method() == http::verb::head) res.body().clear();  // length stays, no body
      auto [wec, wn] = co_await http::async_write(socket, res, use_tuple);
      if (wec) co_return;
      if (mode_ == Mode::close_after_response || mode_ == Mode::connection_close) {
        socket.close();
        closed.set();
        co_return;
      }
    }
  }
};

PoolOptions options_for(std::uint16_t port) {
  PoolOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = 500ms;
  o.response_timeout = 2s;
  return o;
}

Request make_request(std::string target, std::string body = {},
                     http::verb method = http::verb::post) {
  Request req{method, target, 11};
  req.body() = std::move(body);
  return req;
}

// Runs one test body to completion on `ioc`; fails the test if it does not finish.
template <class Body>
void run(asio::io_context& ioc, Body body, std::chrono::milliseconds limit = 10s) {
  bool done = false;
  std::exception_ptr error;
  asio::co_spawn(ioc, body(), [&](std::exception_ptr e) {
    error = e;
    done = true;
    ioc.stop();
  });
  ioc.run_for(limit);
  REQUIRE_MESSAGE(done, "the test body did not finish in time");
  if (error) std::rethrow_exception(error);
}

std::uint16_t unused_port(asio::io_context& ioc) {
  tcp::acceptor probe(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto port = probe.local_endpoint().port();
  probe.close();  // nobody listens there any more: connects are refused
  return port;
}

}  // namespace

TEST_CASE("upstream: sequential requests reuse one connection") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::normal);
  Pool pool(ioc.get_executor(), options_for(backend.port()));
  run(ioc, [&]() -> asio::awaitable<void> {
    for (int i = 0; i < 10; ++i) {
      auto out = co_await pool.send(make_request("/orders", "n" + std::to_string(i)));
      REQUIRE(out.failure == Failure::none);
      CHECK(out.response.result() == http::status::ok);
      CHECK(out.response.body() == "echo /orders n" + std::to_string(i));
      CHECK(out.reused_connection == (i > 0));
    }
  });
  CHECK(backend.connections == 1);
  CHECK(backend.requests == 10);
  CHECK(pool.idle_count() == 1);
  CHECK(backend.last_host == "127.0.0.1:" + std::to_string(backend.port()));
}

TEST_CASE("upstream: a Host header set by the caller is kept") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::normal);
  Pool pool(ioc.get_executor(), options_for(backend.port()));
  run(ioc, [&]() -> asio::awaitable<void> {
    auto req = make_request("/orders");
    req.set(http::field::host, "orders.internal");
    auto out = co_await pool.send(std::move(req));
    CHECK(out.failure == Failure::none);
  });
  CHECK(backend.last_host == "orders.internal");
}

TEST_CASE("upstream: a refused connect is connect_failed") {
  asio::io_context ioc;
  Pool pool(ioc.get_executor(), options_for(unused_port(ioc)));
  run(ioc, [&]() -> asio::awaitable<void> {
    auto out = co_await pool.send(make_request("/orders", "{}"));
    CHECK(out.failure == Failure::connect_failed);
    CHECK_FALSE(out.reused_connection);
  });
  CHECK(pool.idle_count() == 0);
}

TEST_CASE("upstream: a backend that never answers is a timeout, after the request was sent") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::silent);
  auto options = options_for(backend.port());
  options.response_timeout = 200ms;
  Pool pool(ioc.get_executor(), options);
  run(ioc, [&]() -> asio::awaitable<void> {
    const auto start = SteadyClock::now();
    auto out = co_await pool.send(make_request("/orders", "{}"));
    CHECK(out.failure == Failure::timeout);
    CHECK(SteadyClock::now() - start < 200ms + 1500ms);
  });
  CHECK(backend.request_seen.is_set());
  CHECK(backend.requests == 1);
  CHECK(pool.idle_count() == 0);
}

TEST_CASE("upstream: a backend that closes after reading the request is broken") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::close_after_request);
  Pool pool(ioc.get_executor(), options_for(backend.port()));
  run(ioc, [&]() -> asio::awaitable<void> {
    auto out = co_await pool.send(make_request("/orders", "{}"));
    CHECK(out.failure == Failure::broken);
  });
  CHECK(backend.requests == 1);
  CHECK(pool.idle_count() == 0);
}

TEST_CASE("upstream: a body over max_response_body is response_too_large") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::big_body);
  auto options = options_for(backend.port());
  options.max_response_body = 1000;
  Pool pool(ioc.get_executor(), options);
  run(ioc, [&]() -> asio::awaitable<void> {
    auto out = co_await pool.send(make_request("/orders", "{}"));
    CHECK(out.failure == Failure::response_too_large);
  });
  CHECK(pool.idle_count() == 0);
}

TEST_CASE("upstream: a response that is not HTTP is bad_response") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::garbage);
  Pool pool(ioc.get_executor(), options_for(backend.port()));
  run(ioc, [&]() -> asio::awaitable<void> {
    auto out = co_await pool.send(make_request("/orders", "{}"));
    CHECK(out.failure == Failure::bad_response);
  });
}

TEST_CASE("upstream: an idle connection the backend closed is detected and not used") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::close_after_response);
  Pool pool(ioc.get_executor(), options_for(backend.port()));
  run(ioc, [&]() -> asio::awaitable<void> {
    auto first = co_await pool.send(make_request("/one", "1"));
    REQUIRE(first.failure == Failure::none);
    CHECK(pool.idle_count() == 1);  // it said keep-alive, so it was pooled
    co_await backend.closed.wait();  // ...and then the backend closed it

    auto second = co_await pool.send(make_request("/two", "2"));
    CHECK(second.failure == Failure::none);  // not `broken`: the stale one was skipped
    CHECK_FALSE(second.reused_connection);
    CHECK(second.response.body() == "echo /two 2");
  });
  CHECK(backend.connections == 2);
  CHECK(backend.requests == 2);
}

TEST_CASE("upstream: a response with Connection: close is not pooled") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::connection_close);
  Pool pool(ioc.get_executor(), options_for(backend.port()));
  run(ioc, [&]() -> asio::awaitable<void> {
    for (int i = 0; i < 3; ++i) {
      auto out = co_await pool.send(make_request("/orders", "x"));
      CHECK(out.failure == Failure::none);
      CHECK_FALSE(out.reused_connection);
      CHECK(pool.idle_count() == 0);
    }
  });
  CHECK(backend.connections == 3);
}

TEST_CASE("upstream: connections idle longer than idle_ttl are not reused") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::normal);
  auto options = options_for(backend.port());
  options.idle_ttl = Millis{0};  // every idle connection is already too old
  Pool pool(ioc.get_executor(), options);
  run(ioc, [&]() -> asio::awaitable<void> {
    for (int i = 0; i < 3; ++i) {
      auto out = co_await pool.send(make_request("/orders", "x"));
      CHECK(out.failure == Failure::none);
      CHECK_FALSE(out.reused_connection);
    }
  });
  CHECK(backend.connections == 3);
}

// The listener's fuzzing finding 4 (docs/fuzzing.md) held for the upstream read too: when the whole header is already buffered at Beast's first look, it applies header_limit
// to the start line and to the field section separately, so a header of up to twice the
// limit passed when it arrived in one read (a fresh connection's first read is 512 bytes)
// and failed when it arrived in pieces.
TEST_CASE("upstream: the header limit counts the start line and the fields together") {
  CHECK(response_with_header_of(450).find("\r\n\r\n") + 4 == 450);
  asio::io_context ioc;
  Backend backend(ioc, Mode::sized_header);
  auto options = options_for(backend.port());
  options.max_response_header = 300;
  Pool pool(ioc.get_executor(), options);
  run(ioc, [&]() -> asio::awaitable<void> {
    // 225 + 225 bytes: each part under the limit, the header over it.
    auto over = co_await pool.send(make_request("/450", {}, http::verb::get));
    CHECK(over.failure == Failure::response_too_large);
    auto limit = co_await pool.send(make_request("/300", {}, http::verb::get));
    REQUIRE(limit.failure == Failure::none);
    CHECK(limit.response.body() == "ok");
    auto just_over = co_await pool.send(make_request("/301", {}, http::verb::get));
    CHECK(just_over.failure == Failure::response_too_large);
  });
  CHECK(backend.requests == 3);
}

TEST_CASE("upstream: interim responses keep the connection in sync; HEAD answers retire it") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::interim);
  Pool pool(ioc.get_executor(), options_for(backend.port()));
  run(ioc, [&]() -> asio::awaitable<void> {
    auto first = co_await pool.send(make_request("/f", {}, http::verb::get));
    REQUIRE(first.failure == Failure::none);
    CHECK(first.response.result() == http::status::ok);  // the 100 was skipped
    auto head = co_await pool.send(make_request("/h", {}, http::verb::head));
    REQUIRE(head.failure == Failure::none);
    CHECK(head.reused_connection);
    CHECK(head.response.result() == http::status::ok);
    CHECK(head.response.body().empty());
    CHECK(head.response[http::field::content_length] == "8");  // "echo /h "
    // A HEAD answer's framing forbids a body, so a body the backend sent anyway would
    // still be on the connection: it is not pooled.
    auto get = co_await pool.send(make_request("/g", {}, http::verb::get));
    REQUIRE(get.failure == Failure::none);
    CHECK_FALSE(get.reused_connection);
    CHECK(get.response.body() == "echo /g ");
  });
  CHECK(backend.connections == 2);
}

TEST_CASE("upstream: a 204 whose body bytes arrive late does not desync the next exchange") {
  // The backend answers the first request "204" and sends body bytes anyway, but only
  // once the next request reached it on the same connection: too late for any check of
  // the idle connection, so only not pooling it after a bodiless status helps.
  asio::io_context ioc;
  Backend backend(ioc, Mode::bodiless_then_stray);
  Pool pool(ioc.get_executor(), options_for(backend.port()));
  run(ioc, [&]() -> asio::awaitable<void> {
    auto first = co_await pool.send(make_request("/a", "1"));
    REQUIRE(first.failure == Failure::none);
    CHECK(first.response.result() == http::status::no_content);
    auto second = co_await pool.send(make_request("/b", "2"));
    REQUIRE(second.failure == Failure::none);
    CHECK_FALSE(second.reused_connection);
    CHECK(second.response.result() == http::status::ok);
    CHECK(second.response.body() == "echo /b 2");
  });
  CHECK(backend.connections == 2);
}

TEST_CASE("upstream: a response's trailer fields are dropped, never merged into its header") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::chunked_with_trailer);
  Pool pool(ioc.get_executor(), options_for(backend.port()));
  run(ioc, [&]() -> asio::awaitable<void> {
    auto out = co_await pool.send(make_request("/t", "x"));
    REQUIRE(out.failure == Failure::none);
    CHECK(out.response.body() == "hello");
    CHECK(out.response.count(http::field::location) == 1);
    CHECK(out.response[http::field::location] == "/header");
    CHECK(out.response.count("X-Trailer") == 0);
    auto again = co_await pool.send(make_request("/u", "y"));
    REQUIRE(again.failure == Failure::none);
    CHECK(again.reused_connection);
  });
}

TEST_CASE("upstream: 50 concurrent sends on one pool all succeed") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::normal);
  auto options = options_for(backend.port());
  options.max_idle = 10;
  Pool pool(ioc.get_executor(), options);
  int succeeded = 0;
  run(ioc, [&]() -> asio::awaitable<void> {
    AsyncEvent all_done(ioc);
    int finished = 0;
    for (int i = 0; i < 50; ++i) {
      asio::co_spawn(
          ioc,
          [&, i]() -> asio::awaitable<void> {
            auto out = co_await pool.send(make_request("/c", std::to_string(i)));
            if (out.failure == Failure::none && out.response.body() == "echo /c " + std::to_string(i)) {
              ++succeeded;
            }
            if (++finished == 50) all_done.set();
          },
          asio::detached);
    }
    co_await all_done.wait();
  });
  CHECK(succeeded == 50);
  CHECK(backend.requests == 50);
  CHECK(backend.connections <= 50);
  CHECK(pool.idle_count() == 10);  // bounded by max_idle
}

TEST_CASE("upstream: shutdown closes idle connections and stops pooling") {
  asio::io_context ioc;
  Backend backend(ioc, Mode::normal);
  Pool pool(ioc.get_executor(), options_for(backend.port()));
  run(ioc, [&]() -> asio::awaitable<void> {
    auto out = co_await pool.send(make_request("/a", "1"));
    CHECK(out.failure == Failure::none);
    CHECK(pool.idle_count() == 1);
    pool.shutdown();
    CHECK(pool.idle_count() == 0);
    out = co_await pool.send(make_request("/b", "2"));
    CHECK(out.failure == Failure::none);
    CHECK(pool.idle_count() == 0);
  });
  CHECK(backend.connections == 2);
}

TEST_CASE("upstream: failure names") {
  CHECK(std::string(to_string(Failure::connect_failed)) == "connect_failed");
  CHECK(std::string(to_string(Failure::response_too_large)) == "response_too_large");
}

}  // namespace idem::upstream
