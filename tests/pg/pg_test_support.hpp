#pragma once
// Test helpers shared by tests/pg and tests/store on top of test_support/postgres.hpp:
// stopping and starting the throwaway server, running an awaitable to completion on an
// io_context, and a ticker that shows whether anything blocked the event loop.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <array>
#include <atomic>
#include <thread>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include "common/types.hpp"
#include "test_support/postgres.hpp"

namespace idem::test {

// The server (database_url()), blocking SQL to inspect rows (Db) and databases of a test's
// own (ScratchDatabase) are the shared test support's (test_support/postgres.hpp).
using test::database_url;

// The control script of a throwaway server (pg-up), or "" when the server is not ours to
// stop.
inline std::string pgctl() { return env("IDEM_TEST_PGCTL").value_or(""); }

inline void pgctl_run(const std::string& action) {
  const std::string cmd = "'" + pgctl() + "' " + action;
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("pgctl " + action + " failed");
}

// Runs `a` to completion on `ctx` (which must be idle) and returns its value.
template <class T>
T run(asio::io_context& ctx, asio::awaitable<T> a) {
  auto f = asio::co_spawn(ctx, std::move(a), asio::use_future);
  ctx.restart();
  ctx.run();
  return f.get();
}

inline Millis elapsed_since(SteadyClock::time_point start) {
  return std::chrono::duration_cast<Millis>(SteadyClock::now() - start);
}

// Counts 10 ms ticks of a timer on the same io_context: if anything blocked the thread,
// the count falls behind the wall clock.
struct Ticker {
  explicit Ticker(asio::any_io_executor ex) : timer(std::move(ex)) {}
  asio::steady_timer timer;
  int ticks = 0;
  bool stop = false;
};

inline asio::awaitable<void> tick(std::shared_ptr<Ticker> t) {
  while (!t->stop) {
    t->timer.expires_after(Millis{10});
    error_code ec;
    co_await t->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (!ec) ++t->ticks;
  }
}

// A TCP server on loopback, on its own thread, that answers every connection's startup
// packet the way a server that is up but will not serve does: with a FATAL ErrorResponse
// (by default 53300, "sorry, too many clients already", a standby out of connection
// slots), then closes. libpq given a host list stops there (it moves on after 57P03
// only). Connection strings to it need sslmode=disable (no SSL request first) and
// gssencmode=disable.
class FatalServer {
 public:
  explicit FatalServer(std::string sqlstate = "53300",
                       std::string message = "sorry, too many clients already")
      : acceptor_(ctx_, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    std::string fields;
    const auto field = [&](char type, const std::string& value) {
      fields.push_back(type);
      fields += value;
      fields.push_back('\0');
    };
    field('S', "FATAL");
    field('V', "FATAL");
    field('C', sqlstate);
    field('M', message);
    fields.push_back('\0');
    const auto length = static_cast<std::uint32_t>(fields.size() + 4);
    reply_.push_back('E');
    for (int shift = 24; shift >= 0; shift -= 8) reply_.push_back(static_cast<char>(length >> shift));
    reply_ += fields;
    acceptor_.listen();
    accept();
    thread_ = std::thread([this] { ctx_.run(); });
  }
  ~FatalServer() {
    asio::post(ctx_, [this] {
      error_code ignored;
      acceptor_.close(ignored);
    });
    ctx_.stop();
    thread_.join();
  }
  FatalServer(const FatalServer&) = delete;
  FatalServer& operator=(const FatalServer&) = delete;

  std::uint16_t port() const { return port_; }
  int answered() const { return answered_.load(); }

 private:
  void accept() {
    acceptor_.async_accept([this](const error_code& ec, asio::ip::tcp::socket socket) {
      if (ec) return;
      auto s = std::make_shared<asio::ip::tcp::socket>(std::move(socket));
      auto buf = std::make_shared<std::array<char, 1024>>();
      // The startup packet fits one read on loopback; whatever it says, the answer is no.
      s->async_read_some(asio::buffer(*buf), [this, s, buf](const error_code& rec, std::size_t) {
        if (rec) return;
        asio::async_write(*s, asio::buffer(reply_), [this, s](const error_code&, std::size_t) {
          ++answered_;
          error_code ignored;
          s->shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
        });
      });
      accept();
    });
  }

  asio::io_context ctx_;
  asio::ip::tcp::acceptor acceptor_;
  std::uint16_t port_ = acceptor_.local_endpoint().port();
  std::string reply_;
  std::atomic<int> answered_{0};
  std::thread thread_;
};

}  // namespace idem::test
