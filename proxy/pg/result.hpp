#pragma once
// Results and errors of the async PostgreSQL layer.
//
// Errors come in two categories:
//   * pg::errc (pg_category): failures of the client side — could not connect, the
//     connection broke, the client deadline passed, the pool had no connection to give;
//   * sqlstate_category: the server answered with an error; the error_code's value
//     encodes the five-character SQLSTATE, so callers decide on codes, never on text.
// to_store_errc() folds both into the store-level idem::errc the request path uses.
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

#include "common/errors.hpp"
#include "common/types.hpp"

struct pg_result;  // libpq's PGresult; kept opaque so users need not include libpq-fe.h

namespace idem::pg {

enum class errc {
  // No connection could be opened: refused, unresolvable host, authentication failure,
  // or the per-session setup failed without an SQLSTATE. Also returned, without trying,
  // during the fail-fast window after a failed connect (PoolOptions::reconnect_backoff).
  connection_failed = 1,
  // The connection broke mid-call (reset, EOF, server shut down). The call's outcome on
  // the server is unknown.
  connection_lost,
  // The client-side deadline passed (connect_timeout, or statement_timeout plus the
  // margin). The connection was closed; the statement's outcome on the server is unknown.
  timeout,
  // Every connection stayed busy for acquire_timeout.
  pool_exhausted,
  // Pool::close() was called.
  pool_closed,
  // The calling coroutine was cancelled mid-call; the connection was closed.
  cancelled,
  // A text parameter contained a NUL byte, which the text protocol cannot carry.
  invalid_parameter,
  // The server's answer did not fit the call (no result, COPY, empty query...).
  protocol,
};

const boost::system::error_category& pg_category() noexcept;

inline error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), pg_category()};
}

// Server errors: value = the SQLSTATE packed in base 36 (plus one, so no SQLSTATE is 0).
const boost::system::error_category& sqlstate_category() noexcept;
// `state` must be five characters of [0-9A-Z]; anything else yields pg::errc::protocol.
error_code make_sqlstate_error(std::string_view state) noexcept;
// The SQLSTATE carried by `ec`, or "" when `ec` is not a server error.
std::string sqlstate(const error_code& ec);

// The store-level meaning of any error this layer returns:
//   connection class 08xxx, 57P01-57P03 (admin/crash shutdown, cannot connect now),
//   class 53 (insufficient resources), 25006 (read-only: not the primary),
//   connection_failed/lost, pool_closed
//                                                       -> store_unavailable
//   57014 query_canceled (statement_timeout), 55P03 lock_not_available (lock_timeout),
//   client deadline, cancellation                       -> store_timeout
//   pool_exhausted                                      -> store_busy
//   anything else (constraint violations, syntax, bad rows...) -> store_protocol
idem::errc to_store_errc(const error_code& ec) noexcept;

// Owns one PGresult (text format). Move-only. Row and column indexes are 0-based and
// must be in range; accessors on an empty Result behave as if it had no rows.
class Result {
 public:
  Result() noexcept = default;
  explicit Result(::pg_result* native) noexcept : native_(native) {}
  Result(Result&& other) noexcept;
  Result& operator=(Result&& other) noexcept;
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;
  ~Result();

  explicit operator bool() const noexcept { return native_ != nullptr; }

  int rows() const noexcept;
  int columns() const noexcept;
  // Index of the named column, or -1.
  int column(std::string_view name) const noexcept;

  bool is_null(int row, int col) const noexcept;
  // The value's text; empty for NULL. Valid while this Result lives.
  std::string_view value(int row, int col) const noexcept;

  // Typed reads: nullopt when the value is NULL or not of the expected text form.
  std::optional<std::int64_t> int64(int row, int col) const noexcept;
  std::optional<bool> boolean(int row, int col) const noexcept;
  std::optional<std::string> bytea(int row, int col) const;

  // Rows affected by INSERT/UPDATE/DELETE (PQcmdTuples); 0 for other commands.
  std::int64_t affected_rows() const noexcept;

  ::pg_result* native() const noexcept { return native_; }

 private:
  ::pg_result* native_ = nullptr;
};

// "Result(rows=N, columns=M)": lets result<Result> be printed by test frameworks and logs.
std::ostream& operator<<(std::ostream& os, const Result& r);

// Text-format decoders, exposed for callers that read values themselves.
std::optional<std::int64_t> parse_int64(std::string_view text) noexcept;
std::optional<bool> parse_bool(std::string_view text) noexcept;  // "t"/"f" (also "true"/"false")
// bytea in the server's hex output format: "\x" followed by hex digit pairs.
std::optional<std::string> decode_bytea_hex(std::string_view text);

}  // namespace idem::pg

template <>
struct boost::system::is_error_code_enum<idem::pg::errc> : std::true_type {};
