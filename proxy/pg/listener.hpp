#pragma once
// PostgreSQL LISTEN on one channel, driven by Asio: one dedicated session (never a pooled
// one: LISTEN belongs to the session, and a pooled connection is shared), reconnected
// with a backoff whenever it is lost. Not thread-safe: it lives on its executor's thread.
//
// Delivery guarantee: between on_state(true) and the next on_state(false), every
// notification committed on the channel is delivered, in commit order. Across a gap
// (false ... true) notifications may have been missed; the owner must treat a gap as
// "anything may have changed".
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/types.hpp"
#include "pg/pool.hpp"

namespace idem::pg {

namespace detail {
class Connection;
}

struct ListenerOptions {
  std::string conninfo;  // libpq URI or key=value conninfo
  // A plain lower-case identifier, e.g. "idemproxy_records": [a-z_][a-z0-9_]*, at most 63
  // characters (PostgreSQL's identifier limit), so it can be spliced into LISTEN.
  std::string channel;
  Millis connect_timeout{5000};
  Millis statement_timeout{2000};  // for LISTEN and the liveness ping
  // After this long without input, "SELECT 1" proves the session is alive.
  Millis ping_interval{1000};
  Millis reconnect_backoff{1000};  // wait between a failure and the next connect attempt
  std::string application_name = "idemproxy-listener";
  // Optional: run after LISTEN on every new session; listening only starts when it returns
  // true in its first row and column (e.g. "the schema that sends the notifications is
  // there"). Otherwise the session counts as failed and is retried after the backoff.
  std::string ready_check_sql;
  std::string ready_check_failure = "ready check failed";  // logged when it returns false
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  using OnNotification = std::function<void(std::string_view payload)>;
  // listening=true once LISTEN has succeeded on a fresh session (every notification sent
  // after that moment is delivered); listening=false as soon as the session is known to be
  // lost (error, EOF, ping failure or timeout) and at stop().
  using OnState = std::function<void(bool listening)>;

  // Starts listening in the background (nothing happens before the executor runs). The
  // running coroutine keeps the listener alive: dropping the last pointer does not stop
  // it, stop() (or destroying the io_context) does.
  // Throws std::invalid_argument for a channel that is not [a-z_][a-z0-9_]* (at most 63
  // characters), a conninfo libpq cannot parse, or a timeout that is not positive.
  static std::shared_ptr<Listener> start(asio::any_io_executor executor, ListenerOptions options,
                                         OnNotification on_notification, OnState on_state);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Idempotent; callable from the executor's thread, also from inside a callback. Closes
  // the session; the coroutine then ends at its next resumption. No callback runs after
  // stop() returns; stop() itself calls on_state(false) if the listener was listening.
  void stop();
  bool listening() const noexcept;

 private:
  Listener(asio::any_io_executor executor, ListenerOptions options,
           OnNotification on_notification, OnState on_state, std::string password);

  static asio::awaitable<void> run(std::shared_ptr<Listener> self);
  // One session, from connect until it is lost or stop() closes it.
  asio::awaitable<void> session();
  asio::awaitable<bool> start_listening(detail::Connection& conn);
  asio::awaitable<void> listen(detail::Connection& conn);
  void deliver(detail::Connection& conn);
  void set_listening(bool listening);
  void session_failed(std::string_view what, std::string message);
  void finished(std::exception_ptr e) noexcept;

  asio::any_io_executor executor_;
  ListenerOptions options_;
  PoolOptions connect_options_;
  std::string listen_sql_;
  std::string password_;  // only to mask it out of logged messages
  OnNotification on_notification_;
  OnState on_state_;
  // The running coroutine's timer and session, for stop(). The coroutine's frames own
  // them and clear these when they go: destroying the io_context (which destroys a
  // suspended coroutine) then takes every I/O object with it, even if the caller still
  // holds the listener.
  asio::steady_timer* timer_ = nullptr;
  std::shared_ptr<detail::Connection> conn_;
  bool listening_ = false;
  bool stopped_ = false;
  bool failure_logged_ = false;
};

}  // namespace idem::pg
