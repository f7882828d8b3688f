#include "pg/result.hpp"

#include <charconv>
#include <ostream>
#include <utility>

#include <libpq-fe.h>

#include "common/text.hpp"

namespace idem::pg {
namespace {

class PgCategory final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "idemproxy.pg"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::connection_failed: return "could not connect to PostgreSQL";
      case errc::connection_lost: return "connection to PostgreSQL lost";
      case errc::timeout: return "PostgreSQL call passed its deadline";
      case errc::pool_exhausted: return "no pooled PostgreSQL connection became free in time";
      case errc::pool_closed: return "PostgreSQL pool is closed";
      case errc::cancelled: return "PostgreSQL call cancelled";
      case errc::invalid_parameter: return "text parameter contains a NUL byte";
      case errc::protocol: return "unexpected answer from PostgreSQL";
    }
    return "unknown pg error";
  }
};

constexpr int kBase = 36;

int digit_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'Z') return c - 'A' + 10;
  return -1;
}

char digit_char(int v) noexcept {
  return static_cast<char>(v < 10 ? '0' + v : 'A' + (v - 10));
}

std::string decode_sqlstate(int value) {
  if (value <= 0) return {};
  int packed = value - 1;
  std::string s(5, '0');
  for (int i = 4; i >= 0; --i) {
    s[static_cast<std::size_t>(i)] = digit_char(packed % kBase);
    packed /= kBase;
  }
  return s;
}

class SqlstateCategory final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "idemproxy.sqlstate"; }
  std::string message(int ev) const override {
    // Only the code: the server's message text goes to logs via Pool::last_error_message().
    return "PostgreSQL error SQLSTATE " + decode_sqlstate(ev);
  }
};

}  // namespace

const boost::system::error_category& pg_category() noexcept {
  static const PgCategory category;
  return category;
}

const boost::system::error_category& sqlstate_category() noexcept {
  static const SqlstateCategory category;
  return category;
}

error_code make_sqlstate_error(std::string_view state) noexcept {
  if (state.size() != 5) return make_error_code(errc::protocol);
  int packed = 0;
  for (char c : state) {
    const int d = digit_value(c);
    if (d < 0) return make_error_code(errc::protocol);
    packed = packed * kBase + d;
  }
  return {packed + 1, sqlstate_category()};
}

std::string sqlstate(const error_code& ec) {
  if (ec.category() != sqlstate_category()) return {};
  return decode_sqlstate(ec.value());
}

idem::errc to_store_errc(const error_code& ec) noexcept {
  if (ec.category() == idem_category()) return static_cast<idem::errc>(ec.value());
  if (ec.category() == pg_category()) {
    switch (static_cast<errc>(ec.value())) {
      case errc::connection_failed:
      case errc::connection_lost:
      case errc::pool_closed:
        return idem::errc::store_unavailable;
      case errc::timeout:
      case errc::cancelled:
        return idem::errc::store_timeout;
      case errc::pool_exhausted:
        return idem::errc::store_busy;
      case errc::invalid_parameter:
      case errc::protocol:
        return idem::errc::store_protocol;
    }
    return idem::errc::store_protocol;
  }
  if (ec.category() == sqlstate_category()) {
    const std::string s = decode_sqlstate(ec.value());
    const std::string_view cls = std::string_view(s).substr(0, 2);
    // Class 08 is the connection class; 57P01-03 are the server going away or not
    // accepting connections yet; class 53 (out of memory, disk full, too many
    // connections) is a server that cannot serve right now. All mean "try again later".
    //
    // 25006 read_only_sql_transaction: the session landed on, or stayed on, a server that
    // takes no writes (a standby reached without target_session_attrs=read-write; a
    // primary being demoted by a failover manager, which turns default_transaction_read_only
    // on for the sessions it still has). The primary is elsewhere or coming: the same
    // "try again later", and the connection is dropped so the next one looks for it.
    if (cls == "08" || cls == "53" || s == "57P01" || s == "57P02" || s == "57P03" ||
        s == "25006") {
      return idem::errc::store_unavailable;
    }
    // lock_timeout is set equal to statement_timeout, so a lock wait that hits it is the
    // same "too slow" situation as a cancelled statement.
    if (s == "57014" || s == "55P03") return idem::errc::store_timeout;
    return idem::errc::store_protocol;
  }
  // System errors from the socket layer can only mean the connection is unusable.
  return idem::errc::store_unavailable;
}

// --- Result ----------------------------------------------------------------------------

Result::Result(Result&& other) noexcept : native_(std::exchange(other.native_, nullptr)) {}

Result& Result::operator=(Result&& other) noexcept {
  if (this != &other) {
    if (native_) PQclear(native_);
    native_ = std::exchange(other.native_, nullptr);
  }
  return *this;
}

Result::~Result() {
  if (native_) PQclear(native_);
}

int Result::rows() const noexcept { return native_ ? PQntuples(native_) : 0; }

int Result::columns() const noexcept { return native_ ? PQnfields(native_) : 0; }

int Result::column(std::string_view name) const noexcept {
  // PQfnumber would case-fold and parse quotes; an exact comparison is what callers mean.
  for (int i = 0; i < columns(); ++i) {
    if (name == PQfname(native_, i)) return i;
  }
  return -1;
}

bool Result::is_null(int row, int col) const noexcept {
  return !native_ || PQgetisnull(native_, row, col) != 0;
}

std::string_view Result::value(int row, int col) const noexcept {
  if (is_null(row, col)) return {};
  return {PQgetvalue(native_, row, col),
          static_cast<std::size_t>(PQgetlength(native_, row, col))};
}

std::optional<std::int64_t> Result::int64(int row, int col) const noexcept {
  if (is_null(row, col)) return std::nullopt;
  return parse_int64(value(row, col));
}

std::optional<bool> Result::boolean(int row, int col) const noexcept {
  if (is_null(row, col)) return std::nullopt;
  return parse_bool(value(row, col));
}

std::optional<std::string> Result::bytea(int row, int col) const {
  if (is_null(row, col)) return std::nullopt;
  return decode_bytea_hex(value(row, col));
}

std::int64_t Result::affected_rows() const noexcept {
  if (!native_) return 0;
  return parse_int64(PQcmdTuples(native_)).value_or(0);
}

std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "Result(rows=" << r.rows() << ", columns=" << r.columns() << ")";
}

// --- decoders ----------------------------------------------------------------------------

std::optional<std::int64_t> parse_int64(std::string_view text) noexcept {
  std::int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc{} || ptr != end || text.empty()) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(std::string_view text) noexcept {
  if (text == "t" || text == "true") return true;
  if (text == "f" || text == "false") return false;
  return std::nullopt;
}

std::optional<std::string> decode_bytea_hex(std::string_view text) {
  // bytea_output = 'hex' has been the server default since 9.0; the legacy escape format
  // is not accepted, so a misconfigured server is noticed instead of silently misread.
  if (text.size() < 2 || text[0] != '\\' || text[1] != 'x' || text.size() % 2 != 0) {
    return std::nullopt;
  }
  return idem::text::from_hex(text.substr(2));
}

}  // namespace idem::pg
