#include "pg/listener.hpp"

#include <stdexcept>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include "pg/connection.hpp"

namespace idem::pg {
namespace {

// PostgreSQL truncates longer identifiers in LISTEN but refuses them in pg_notify(): the
// two would silently disagree.
constexpr std::size_t kMaxIdentifier = 63;

bool plain_identifier(std::string_view s) {
  if (s.empty() || s.size() > kMaxIdentifier) return false;
  const auto lower_or_underscore = [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; };
  if (!lower_or_underscore(s[0])) return false;
  for (char c : s) {
    if (!lower_or_underscore(c) && !(c >= '0' && c <= '9')) return false;
  }
  return true;
}

// The conninfo's password, so that no logged message can carry it. libpq's connection
// errors do not quote it, but its parse errors quote pieces of the conninfo; a conninfo
// that does not parse is refused up front for the same reason.
std::string password_of(const std::string& conninfo) {
  char* parse_error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &parse_error);
  if (parse_error) PQfreemem(parse_error);
  if (!parsed) throw std::invalid_argument("pg listener: the connection string does not parse");
  std::string password;
  for (PQconninfoOption* o = parsed; o->keyword; ++o) {
    if (o->val && std::string_view(o->keyword) == "password") password = o->val;
  }
  PQconninfoFree(parsed);
  return password;
}

// One log line: libpq's messages end in a newline and continue on tab-indented lines.
std::string one_line(std::string message, const std::string& password) {
  if (!password.empty()) {
    for (std::size_t at = message.find(password); at != std::string::npos;
         at = message.find(password, at)) {
      message.replace(at, password.size(), "********");
      at += 8;
    }
  }
  std::string out;
  out.reserve(message.size());
  bool space = false;
  for (char c : message) {
    if (c == '\n' || c == '\r' || c == '\t' || c == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

using detail::Command;
using detail::Connection;

Listener::Listener(asio::any_io_executor executor, ListenerOptions options,
                   OnNotification on_notification, OnState on_state, std::string password)
    : executor_(std::move(executor)),
      options_(std::move(options)),
      // Quoted, although the validated name needs no quoting, so that a channel that
      // happens to be a reserved word ("user", "select") still parses.
      listen_sql_("LISTEN \"" + options_.channel + "\""),
      password_(std::move(password)),
      on_notification_(std::move(on_notification)),
      on_state_(std::move(on_state)) {
  connect_options_.conninfo = options_.conninfo;
  connect_options_.size = 1;
  connect_options_.connect_timeout = options_.connect_timeout;
  connect_options_.statement_timeout = options_.statement_timeout;
  connect_options_.application_name = options_.application_name;
}

Listener::~Listener() = default;

std::shared_ptr<Listener> Listener::start(asio::any_io_executor executor, ListenerOptions options,
                                          OnNotification on_notification, OnState on_state) {
  if (!plain_identifier(options.channel)) {
    throw std::invalid_argument("pg listener: channel must match [a-z_][a-z0-9_]* (at most 63 "
                                "characters)");
  }
  if (options.connect_timeout <= Millis::zero() || options.statement_timeout <= Millis::zero() ||
      options.ping_interval <= Millis::zero() || options.reconnect_backoff <= Millis::zero()) {
    // A zero backoff would retry a refused connect in a busy loop.
    throw std::invalid_argument("pg listener timeouts must be positive");
  }
  std::string password = password_of(options.conninfo);
  std::shared_ptr<Listener> self(new Listener(executor, std::move(options),
                                              std::move(on_notification), std::move(on_state),
                                              std::move(password)));
  asio::co_spawn(executor, run(self),
                 [self](std::exception_ptr e) { self->finished(e); });
  return self;
}

void Listener::stop() {
  if (stopped_) return;
  stopped_ = true;
  // Both wake the coroutine wherever it waits (a closed connection aborts its socket
  // waits and name lookups); it sees stopped_ and ends.
  if (timer_) timer_->cancel();
  if (conn_) conn_->close();
  if (listening_) {
    listening_ = false;
    if (on_state_) on_state_(false);
  }
}

bool Listener::listening() const noexcept { return listening_; }

void Listener::set_listening(bool listening) {
  if (stopped_ || listening_ == listening) return;
  listening_ = listening;
  if (on_state_) on_state_(listening);
}

void Listener::session_failed(std::string_view what, std::string message) {
  if (stopped_) return;
  // One warning per outage, not one per retry: a database down for an hour would
  // otherwise log every reconnect_backoff.
  if (!failure_logged_) {
    failure_logged_ = true;
    spdlog::warn("pg listener on channel {}: {}: {}; retrying every {} ms", options_.channel,
                 what, one_line(std::move(message), password_),
                 options_.reconnect_backoff.count());
  }
  set_listening(false);
}

void Listener::deliver(Connection& conn) {
  for (const detail::Notification& n : conn.take_notifications()) {
    // A callback may have called stop().
    if (stopped_) return;
    if (n.channel == options_.channel && on_notification_) on_notification_(n.payload);
  }
}

void Listener::finished(std::exception_ptr e) noexcept {
  if (e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      spdlog::error("pg listener on channel {} stopped by an exception: {}", options_.channel,
                    ex.what());
    } catch (...) {
      spdlog::error("pg listener on channel {} stopped by an unknown exception",
                    options_.channel);
    }
    // The owner must not go on trusting a listener that no longer listens.
    try {
      set_listening(false);
    } catch (...) {
    }
  }
  stopped_ = true;
  listening_ = false;
  // No callback can run any more: release whatever they captured (possibly this
  // listener).
  on_notification_ = nullptr;
  on_state_ = nullptr;
}

asio::awaitable<void> Listener::run(std::shared_ptr<Listener> self) {
  asio::steady_timer timer(self->executor_);
  struct TimerAttached {
    Listener& listener;
    ~TimerAttached() { listener.timer_ = nullptr; }
  };
  TimerAttached attached{*self};
  self->timer_ = &timer;
  while (!self->stopped_) {
    co_await self->session();
    if (self->stopped_) break;
    timer.expires_after(self->options_.reconnect_backoff);
    error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

asio::awaitable<void> Listener::session() {
  auto conn = std::make_shared<Connection>(executor_);
  // However the session ends (lost, stopped, the frame destroyed with the io_context),
  // the connection is closed and stop() no longer sees it.
  struct SessionAttached {
    Listener& listener;
    std::shared_ptr<Connection> conn;
    ~SessionAttached() {
      conn->close();
      if (listener.conn_ == conn) listener.conn_.reset();
    }
  };
  SessionAttached attached{*this, conn};
  conn_ = conn;
  if (!co_await start_listening(*conn)) co_return;
  if (failure_logged_) {
    failure_logged_ = false;
    spdlog::info("pg listener on channel {}: listening again", options_.channel);
  }
  set_listening(true);
  co_await listen(*conn);
}

// Connects, LISTENs and runs the ready check; false (the failure reported) when the
// session cannot start or the listener was stopped meanwhile.
asio::awaitable<bool> Listener::start_listening(Connection& conn) {
  const error_code connected = co_await conn.connect(connect_options_);
  if (stopped_) co_return false;
  if (connected) {
    session_failed("cannot connect", conn.error_message());
    co_return false;
  }
  const Command listen{Command::Kind::sql, listen_sql_, nullptr};
  auto listened = co_await conn.run(listen, options_.statement_timeout);
  if (stopped_) co_return false;
  if (!listened) {
    session_failed("LISTEN failed", conn.error_message());
    co_return false;
  }
  if (options_.ready_check_sql.empty()) co_return true;
  const Command check{Command::Kind::sql, options_.ready_check_sql, nullptr};
  auto checked = co_await conn.run(check, options_.statement_timeout);
  if (stopped_) co_return false;
  if (!checked) {
    session_failed("ready check failed", conn.error_message());
    co_return false;
  }
  if (checked->rows() < 1 || checked->columns() < 1 || !checked->boolean(0, 0).value_or(false)) {
    session_failed("not ready", options_.ready_check_failure);
    co_return false;
  }
  co_return true;
}

// Delivers notifications until the session is lost or the listener stopped, pinging the
// server when nothing arrived for a whole interval.
asio::awaitable<void> Listener::listen(Connection& conn) {
  const Command ping{Command::Kind::sql, "SELECT 1", nullptr};
  asio::steady_timer& timer = *timer_;
  for (;;) {
    // Notifications libpq read during the last call (LISTEN, a ping) or the last
    // consume_input() are delivered before the next wait: the socket will not signal
    // them again.
    deliver(conn);
    if (stopped_) co_return;
    // The ping interval has its own timer, not the connection's call deadline: an
    // interval that elapses is the normal idle case and must leave the session usable.
    timer.expires_after(options_.ping_interval);
    auto [order, input_ec, timer_ec] =
        co_await asio::experimental::make_parallel_group(conn.async_wait_input(asio::deferred),
                                                         timer.async_wait(asio::deferred))
            .async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
    (void)timer_ec;
    if (stopped_) co_return;
    if (order[0] == 0) {
      if (input_ec) {
        session_failed("lost the session", "socket wait failed: " + input_ec.message());
        co_return;
      }
      if (conn.consume_input()) {
        // Whatever libpq parsed before the loss was committed while we listened.
        deliver(conn);
        session_failed("lost the session", conn.error_message());
        co_return;
      }
      continue;
    }
    // Nothing arrived for a whole interval: a session whose server or network went away
    // silently looks exactly like this, so prove it alive.
    auto pong = co_await conn.run(ping, options_.statement_timeout);
    if (stopped_) co_return;
    if (!pong) {
      deliver(conn);
      session_failed("liveness ping failed", conn.error_message());
      co_return;
    }
  }
}

}  // namespace idem::pg
