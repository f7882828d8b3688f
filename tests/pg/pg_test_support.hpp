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

#include <boost/asio/awaitable.hpp>
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

}  // namespace idem::test
