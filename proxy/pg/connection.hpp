#pragma once
// One non-blocking libpq connection driven by Asio (internal to pg/; the Pool is the public
// face). All waiting happens in async_wait on the libpq socket, so a slow server never
// blocks the io_context. Not thread-safe: it lives on its pool's thread.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/types.hpp"
#include "pg/host_list.hpp"
#include "pg/pool.hpp"
#include "pg/result.hpp"

struct pg_conn;  // libpq's PGconn

namespace idem::pg::detail {

// What to run: a prepared statement by name, or one SQL statement.
struct Command {
  enum class Kind { prepared, sql };
  Kind kind = Kind::sql;
  std::string_view text;              // statement name or SQL
  const std::vector<Param>* params = nullptr;
};

// A NOTIFY message libpq has received, copied out of its PGnotify.
struct Notification {
  std::string channel;
  std::string payload;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  explicit Connection(asio::any_io_executor executor);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Opens the connection and prepares the session (timeouts, application_name, prepared
  // statements) in one pipelined round trip. Each host of a multi-host list is tried in
  // libpq's order, each within options.connect_timeout (host_list.hpp).
  asio::awaitable<error_code> connect(const PoolOptions& options);

  // Runs one command within `deadline`. On a client-side deadline or a broken protocol
  // state the connection marks itself unusable; the pool then closes it.
  asio::awaitable<result<Result>> run(const Command& command, Millis deadline);

  // Runs prepared commands in pipeline mode with one sync point at the end: one round
  // trip, one implicit transaction. Returns every command's result, or the first error.
  asio::awaitable<result<std::vector<Result>>> run_pipeline(const std::vector<Command>& commands,
                                                            Millis deadline);

  // After a call: may this connection serve another one?
  bool reusable() const noexcept;
  // Before handing out an idle connection: did the server close it meanwhile? Cheap
  // (one non-blocking poll), never waits.
  bool idle_healthy() const noexcept;
  // Releases the socket from Asio and frees libpq's connection. Idempotent. A coroutine
  // suspended in a call or a connect wakes up with errc::cancelled.
  void close() noexcept;

  // For a LISTEN session, between calls. Completes when the socket has input (or
  // failed); it neither reads nor touches the call state, so cancelling it (a ping
  // interval elapsed first) leaves the connection usable.
  template <class CompletionToken>
  auto async_wait_input(CompletionToken&& token) {
    return socket_.async_wait(asio::posix::stream_descriptor::wait_read,
                              std::forward<CompletionToken>(token));
  }
  // Reads whatever input arrived, never blocking. connection_lost (message in
  // error_message()) when the server closed the session or the socket failed.
  error_code consume_input();
  // The notifications libpq has received so far, during calls or consume_input(), oldest
  // first.
  std::vector<Notification> take_notifications();

  const std::string& error_message() const noexcept { return error_message_; }
  int backend_pid() const noexcept;

 private:
  enum class Wait { read, write, read_or_write };

  // Keyword/value arrays for PQconnectStartParams, owning their strings.
  struct ConnectParams {
    std::vector<std::string> keys;
    std::vector<std::string> values;
    void add(std::string key, std::string value) {
      keys.push_back(std::move(key));
      values.push_back(std::move(value));
    }
  };

  // Name lookups of the targets that need one, in place.
  asio::awaitable<error_code> resolve_targets(HostPlan& plan);
  asio::awaitable<error_code> connect_any(const PoolOptions& options);
  // One target: libpq's connect, then the session setup.
  asio::awaitable<error_code> attempt(const HostPlan& plan, const HostTarget& target,
                                      const std::string& session_attrs,
                                      const PoolOptions& options);
  // Forgets a failed attempt (its socket and libpq connection) for the next one.
  void end_attempt() noexcept;
  static std::string describe(const HostTarget& t);
  asio::awaitable<error_code> poll_connect();
  asio::awaitable<error_code> setup_session(const PoolOptions& options);
  asio::awaitable<error_code> finish_flush(int first_flush);
  asio::awaitable<error_code> flush();
  // The next PGresult of the current command (nullptr = the command is finished).
  asio::awaitable<result<::pg_result*>> next_result();
  // Waits until the socket is readable and reads what arrived into libpq.
  asio::awaitable<error_code> receive();
  // Takes one command's results up to its terminating null; see connection.cpp.
  asio::awaitable<error_code> drain_command(Result& kept, error_code& first_error);
  asio::awaitable<result<Result>> collect_results();
  asio::awaitable<result<std::vector<Result>>> collect_pipeline(std::size_t commands);
  asio::awaitable<error_code> wait(Wait what);

  error_code attach_socket();
  void arm_deadline(Millis d);
  void disarm_deadline() noexcept;
  error_code error_from_result(const Result& r);
  error_code lost(std::string_view fallback_message);
  // Maps how a socket wait ended (deadline, cancellation, error) to the call's error;
  // empty when the socket is ready.
  error_code after_wait(const error_code& ec);

  ::pg_conn* conn_ = nullptr;
  asio::posix::stream_descriptor socket_;
  asio::ip::tcp::resolver resolver_;
  asio::steady_timer deadline_;
  // Identifies the armed deadline: a timer completion from an earlier call (already
  // queued when that call finished) must not cancel a later call's waits.
  std::uint64_t deadline_generation_ = 0;
  bool timed_out_ = false;
  // Set while a call is in flight; if a call ends any other way than by returning
  // (exception, destroyed coroutine) it stays set and the connection is not reused.
  bool in_call_ = false;
  bool broken_ = false;
  bool closed_ = false;  // close() was called: a connect under way tries no further host
  std::string error_message_;
};

}  // namespace idem::pg::detail
