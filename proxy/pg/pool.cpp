#include "pg/pool.hpp"

#include <algorithm>
#include <deque>
#include <stdexcept>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "pg/connection.hpp"

namespace idem::pg {

using detail::Command;
using detail::Connection;
using ConnectionPtr = std::shared_ptr<Connection>;

struct Pool::Impl {
  // A caller waiting for a connection. It lives in the waiting coroutine's frame; the
  // pool only points at it while it is queued.
  struct Waiter {
    Impl& impl;
    asio::steady_timer timer;
    ConnectionPtr handed;  // a connection given directly to this waiter
    bool woken = false;    // woken to retry: a slot was freed or the pool closed

    Waiter(Impl& i, asio::any_io_executor ex) : impl(i), timer(ex) {}
    Waiter(const Waiter&) = delete;
    Waiter& operator=(const Waiter&) = delete;
    ~Waiter() {
      // If the waiting coroutine is destroyed (cancelled, io_context shut down) after a
      // connection was handed to it, the connection must go back or its slot leaks.
      impl.unqueue(this);
      if (handed) impl.release(std::move(handed));
    }
  };

  // Returns a checked-out connection to the pool however the call ends.
  struct Checkout {
    std::shared_ptr<Pool> pool;  // keeps the pool alive while the call runs
    ConnectionPtr conn;
    Checkout(std::shared_ptr<Pool> p, ConnectionPtr c) : pool(std::move(p)), conn(std::move(c)) {}
    Checkout(const Checkout&) = delete;
    Checkout& operator=(const Checkout&) = delete;
    ~Checkout() {
      if (conn) pool->impl_->release(std::move(conn));
    }
  };

  // Counts a connection slot as taken while a connect is in flight; gives it back unless
  // the connect succeeded (also when the connecting coroutine is destroyed).
  struct OpenSlot {
    Impl& impl;
    bool kept = false;
    explicit OpenSlot(Impl& i) : impl(i) { ++impl.open; }
    OpenSlot(const OpenSlot&) = delete;
    OpenSlot& operator=(const OpenSlot&) = delete;
    ~OpenSlot() {
      if (!kept) {
        --impl.open;
        impl.wake_one();
      }
    }
  };

  Impl(asio::any_io_executor ex, PoolOptions o) : executor(std::move(ex)), options(std::move(o)) {}

  asio::any_io_executor executor;
  PoolOptions options;
  std::vector<ConnectionPtr> idle;  // most recently used at the back
  std::size_t open = 0;             // connecting + in use + idle
  std::deque<Waiter*> waiters;      // FIFO: first come, first served
  bool closed = false;
  SteadyClock::time_point fail_fast_until{};
  error_code last_connect_error;
  std::string last_error;

  Millis statement_deadline() const { return options.statement_timeout + options.deadline_margin; }

  void unqueue(Waiter* w) {
    auto it = std::find(waiters.begin(), waiters.end(), w);
    if (it != waiters.end()) waiters.erase(it);
  }

  // A slot freed up (a connection was dropped or a connect failed): let the longest
  // waiter retry, so it can open a connection instead of waiting for a busy one.
  void wake_one() {
    if (waiters.empty()) return;
    Waiter* w = waiters.front();
    waiters.pop_front();
    w->woken = true;
    w->timer.cancel();
  }

  void release(ConnectionPtr conn) {
    if (!closed && conn->reusable()) {
      if (!waiters.empty()) {
        // Hand over directly: a connection put back on the idle list could be taken by a
        // newcomer before the waiter resumes, which would starve waiters under load.
        Waiter* w = waiters.front();
        waiters.pop_front();
        w->handed = std::move(conn);
        w->timer.cancel();
        return;
      }
      idle.push_back(std::move(conn));
      return;
    }
    conn->close();
    --open;
    wake_one();
  }

  void drop_idle(ConnectionPtr conn) {
    conn->close();
    --open;
  }

  // One pooled connection, within acquire_timeout (or connect_timeout for a new one).
  asio::awaitable<result<ConnectionPtr>> acquire() {
    const auto deadline = SteadyClock::now() + options.acquire_timeout;
    for (;;) {
      if (closed) co_return make_error_code(errc::pool_closed);

      // Most recently used first: it is the likeliest to be healthy, and the others can
      // age out on the server side without affecting traffic.
      while (!idle.empty()) {
        ConnectionPtr c = std::move(idle.back());
        idle.pop_back();
        if (c->idle_healthy()) co_return c;
        drop_idle(std::move(c));
      }

      if (open < options.size) {
        // Right after a failed connect, answer with that failure instead of trying
        // again: a dead database then costs callers nothing, and a recovering one is not
        // hit by a connection storm. The first call after the window tries again.
        if (SteadyClock::now() < fail_fast_until) {
          last_error = "not retrying a failed connect yet: " + last_connect_error.message();
          co_return last_connect_error;
        }
        OpenSlot slot(*this);
        auto conn = std::make_shared<Connection>(executor);
        error_code ec = co_await conn->connect(options);
        if (!ec && closed) ec = make_error_code(errc::pool_closed);
        if (ec) {
          last_error = conn->error_message();
          if (ec != errc::pool_closed) {
            last_connect_error = ec;
            fail_fast_until = SteadyClock::now() + options.reconnect_backoff;
          }
          conn->close();
          co_return ec;  // ~OpenSlot gives the slot back and wakes a waiter
        }
        slot.kept = true;
        fail_fast_until = {};
        co_return conn;
      }

      Waiter w(*this, executor);
      w.timer.expires_at(deadline);
      waiters.push_back(&w);
      error_code ec;
      co_await w.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (w.handed) co_return std::move(w.handed);
      if (w.woken) continue;  // a slot freed up, or the pool closed: look again
      unqueue(&w);
      if (!ec) {
        last_error = "no connection became free within acquire_timeout";
        co_return make_error_code(errc::pool_exhausted);
      }
      last_error = "call cancelled while waiting for a connection";
      co_return make_error_code(errc::cancelled);
    }
  }

  // One call: a connection, the command within the statement deadline, the connection
  // back (or closed) however the call ends.
  static asio::awaitable<result<Result>> run(std::shared_ptr<Pool> self, Command::Kind kind,
                                             std::string text, std::vector<Param> params) {
    Impl& impl = *self->impl_;
    auto conn = co_await impl.acquire();
    if (!conn) co_return conn.error();
    Checkout checkout(self, std::move(*conn));
    const Command command{kind, text, &params};
    auto r = co_await checkout.conn->run(command, impl.statement_deadline());
    if (!r) impl.last_error = checkout.conn->error_message();
    co_return r;
  }

  // Several prepared statements on one connection in one round trip.
  static asio::awaitable<result<std::vector<Result>>> run_pipeline(
      std::shared_ptr<Pool> self, std::vector<std::string> names,
      std::vector<std::vector<Param>> params) {
    Impl& impl = *self->impl_;
    auto conn = co_await impl.acquire();
    if (!conn) co_return conn.error();
    Checkout checkout(self, std::move(*conn));
    std::vector<Command> commands;
    commands.reserve(names.size());
    for (std::size_t i = 0; i < names.size(); ++i) {
      commands.push_back(Command{Command::Kind::prepared, names[i], &params[i]});
    }
    auto r = co_await checkout.conn->run_pipeline(commands, impl.statement_deadline());
    if (!r) impl.last_error = checkout.conn->error_message();
    co_return r;
  }

  void close_all() {
    closed = true;
    for (auto& c : idle) drop_idle(std::move(c));
    idle.clear();
    while (!waiters.empty()) wake_one();
  }
};

Pool::Pool(asio::any_io_executor executor, PoolOptions options)
    : impl_(std::make_unique<Impl>(std::move(executor), std::move(options))) {}

std::shared_ptr<Pool> Pool::create(asio::any_io_executor executor, PoolOptions options) {
  if (options.size == 0) throw std::invalid_argument("pg pool size must be at least 1");
  if (options.connect_timeout <= Millis::zero() || options.statement_timeout <= Millis::zero() ||
      options.acquire_timeout <= Millis::zero() || options.deadline_margin < Millis::zero() ||
      options.reconnect_backoff < Millis::zero()) {
    throw std::invalid_argument("pg pool timeouts must be positive");
  }
  return std::shared_ptr<Pool>(new Pool(std::move(executor), std::move(options)));
}

Pool::~Pool() {
  // Calls in flight hold a reference to the pool, so only idle connections remain.
  impl_->close_all();
}

// execute() and query() are plain functions returning the coroutine below, not
// coroutines themselves: a coroutine's body (and so any shared_from_this() in it) only
// runs when first awaited, and a caller may drop its last reference to the pool between
// creating the call and running it (co_spawn, then release). Taking the reference here,
// eagerly, keeps the pool alive for the whole call; the statement text is copied for the
// same reason.
asio::awaitable<result<Result>> Pool::execute(std::string_view statement,
                                              std::vector<Param> params) {
  return Impl::run(shared_from_this(), Command::Kind::prepared, std::string(statement),
                   std::move(params));
}

asio::awaitable<result<std::vector<Result>>> Pool::execute_pipeline(
    std::vector<Batched> statements) {
  std::vector<std::string> names;
  std::vector<std::vector<Param>> params;
  names.reserve(statements.size());
  params.reserve(statements.size());
  for (auto& s : statements) {
    names.emplace_back(s.statement);
    params.push_back(std::move(s.params));
  }
  return Impl::run_pipeline(shared_from_this(), std::move(names), std::move(params));
}

asio::awaitable<result<Result>> Pool::query(std::string_view sql) {
  return Impl::run(shared_from_this(), Command::Kind::sql, std::string(sql), {});
}

asio::awaitable<result<Result>> Pool::query(std::string_view sql, std::vector<Param> params) {
  return Impl::run(shared_from_this(), Command::Kind::sql, std::string(sql), std::move(params));
}

void Pool::close() { impl_->close_all(); }

std::size_t Pool::open_connections() const noexcept { return impl_->open; }

std::size_t Pool::idle_connections() const noexcept { return impl_->idle.size(); }

const PoolOptions& Pool::options() const noexcept { return impl_->options; }

const asio::any_io_executor& Pool::executor() const noexcept { return impl_->executor; }

const std::string& Pool::last_error_message() const noexcept { return impl_->last_error; }

}  // namespace idem::pg
