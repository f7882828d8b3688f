#pragma once
// Async PostgreSQL on Asio: a pool of non-blocking libpq connections living on one
// io_context (one pool per worker thread; not thread-safe). Every call has a deadline;
// a connection whose call timed out or failed mid-protocol is closed, never reused.
//
// Threading: a Pool and all its calls must stay on one thread (the io_context's, or one
// strand); it has no locks. Destroy the pool before its io_context.
//
// Deadlines of one execute()/query():
//   waiting for a connection  <= acquire_timeout (a new connection: <= connect_timeout
//                                 per host tried, as libpq's connect_timeout)
//   the statement itself      <= statement_timeout (server side, then SQLSTATE 57014)
//                                 + deadline_margin (client side, then errc::timeout and
//                                   the connection is closed)
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "common/types.hpp"
#include "pg/result.hpp"

namespace idem::pg {

struct PreparedStatement {
  std::string name;
  std::string sql;
};

// A setting made for the session on every new connection (set_config(name, value, false)),
// after the pool's own (timeouts, application_name).
struct SessionSetting {
  std::string name;
  std::string value;
};

// A statement parameter: text format by default; binary for bytea payloads. It views the
// caller's bytes, which must stay alive until the call completes.
struct Param {
  std::string_view value;
  bool null = false;
  bool binary = false;
  static Param text(std::string_view v) { return {v, false, false}; }
  static Param bytes(std::string_view v) { return {v, false, true}; }
  static Param null_value() { return {{}, true, false}; }
};

struct PoolOptions {
  std::string conninfo;              // libpq URI or key=value conninfo; multi-host lists
                                     // are tried in order, each host within connect_timeout
  std::size_t size = 4;              // max open connections
  Millis connect_timeout{5000};
  Millis statement_timeout{2000};    // SET per session; the client deadline adds a margin
  Millis acquire_timeout{2000};      // waiting for a free connection
  Millis reconnect_backoff{250};     // after a failed connect, fail fast for this long
  // Added to statement_timeout for the client-side deadline: the server's own timeout
  // normally fires first and keeps the connection usable; the client deadline catches a
  // server or network that stopped answering altogether.
  Millis deadline_margin{500};
  std::string application_name = "idemproxy";
  std::vector<PreparedStatement> statements;  // prepared on every new connection
  std::vector<SessionSetting> settings;       // set on every new connection
};

class Pool : public std::enable_shared_from_this<Pool> {
 public:
  // Opens nothing yet: connections are opened on demand. Throws std::invalid_argument if
  // size is 0 or a timeout is not positive.
  static std::shared_ptr<Pool> create(asio::any_io_executor executor, PoolOptions options);
  ~Pool();

  // Runs a prepared statement on a pooled connection. Errors use pg::errc (see result.hpp):
  // connection problems, timeouts, pool exhaustion, SQL errors with their SQLSTATE.
  asio::awaitable<result<Result>> execute(std::string_view statement,
                                          std::vector<Param> params);

  // Runs several prepared statements in one round trip (libpq pipeline mode) on one
  // connection, followed by one sync point: they form one implicit transaction, which
  // commits at the sync, and every statement still takes its own snapshot (READ
  // COMMITTED). All or nothing: the results, in order, only when every statement and the
  // commit succeeded; otherwise the first error (later statements are skipped by the
  // server once one fails).
  struct Batched {
    std::string_view statement;
    std::vector<Param> params;
  };
  asio::awaitable<result<std::vector<Result>>> execute_pipeline(std::vector<Batched> statements);

  // Runs an unprepared, parameterless statement (health probes, setup). Same errors.
  // One statement only (extended protocol): "SELECT 1; SELECT 2" is refused by the server.
  asio::awaitable<result<Result>> query(std::string_view sql);
  // Same, with parameters ($1...).
  asio::awaitable<result<Result>> query(std::string_view sql, std::vector<Param> params);

  // Closes every idle connection and refuses new calls; in-flight calls finish.
  void close();

  std::size_t open_connections() const noexcept;
  std::size_t idle_connections() const noexcept;
  const PoolOptions& options() const noexcept;
  // The event loop the pool belongs to (every call must come from it).
  const asio::any_io_executor& executor() const noexcept;

  // The server's or libpq's message of the last failed call, for logs only: decisions use
  // the returned error_code (its SQLSTATE), never this text.
  const std::string& last_error_message() const noexcept;

 private:
  Pool(asio::any_io_executor executor, PoolOptions options);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::pg
