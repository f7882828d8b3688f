#include "test_support/postgres.hpp"

#include <libpq-fe.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <random>

#include "common/text.hpp"

namespace idem::test {

namespace {

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using ResultPtr = std::unique_ptr<PGresult, ResultDeleter>;

std::string trimmed_error(const char* message) {
  return std::string(text::trim_end(message ? message : "", "\n "));
}

void discard_notice(void*, const char*) {}

}  // namespace

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) {
    return std::nullopt;
  }
  return std::string(value);
}

std::string database_url() {
  auto url = env("DATABASE_URL");
  if (!url || url->empty()) {
    throw Failure(
        "DATABASE_URL is not set. Run the tests through scripts/test (it starts a throwaway "
        "PostgreSQL), or export DATABASE_URL=postgresql://user@host:port/db pointing at a "
        "database the tests may write to (by hand: eval \"$(scripts/lib/pg-up /tmp/pg)\").");
  }
  return *url;
}

struct Db::Impl {
  std::string conninfo;
  PGconn* conn = nullptr;

  ~Impl() {
    if (conn) {
      PQfinish(conn);
    }
  }

  void connect() {
    if (conn) {
      PQfinish(conn);
      conn = nullptr;
    }
    // Our defaults come before dbname so that values in the caller's string override
    // them (libpq keeps the last value of a repeated keyword; dbname expands in place).
    const char* keys[] = {"connect_timeout", "options", "dbname", nullptr};
    const char* values[] = {"10", "-c statement_timeout=10000", conninfo.c_str(), nullptr};
    conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
    if (PQstatus(conn) != CONNECTION_OK) {
      const std::string why = trimmed_error(PQerrorMessage(conn));
      PQfinish(conn);
      conn = nullptr;
      throw Failure("cannot connect to PostgreSQL: " + why);
    }
    PQsetNoticeProcessor(conn, discard_notice, nullptr);
  }

  ResultPtr run(std::string_view sql, const SqlParams& params) {
    if (!conn || PQstatus(conn) != CONNECTION_OK) {
      connect();
    }
    std::vector<const char*> values;
    values.reserve(params.size());
    for (const auto& p : params) {
      values.push_back(p.value() ? p.value()->c_str() : nullptr);
    }
    const std::string statement(sql);
    ResultPtr result(PQexecParams(conn, statement.c_str(), static_cast<int>(values.size()),
                                  nullptr, values.data(), nullptr, nullptr, /*text*/ 0));
    const auto status = result ? PQresultStatus(result.get()) : PGRES_FATAL_ERROR;
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
      const char* sqlstate = result ? PQresultErrorField(result.get(), PG_DIAG_SQLSTATE) : nullptr;
      const std::string message = trimmed_error(result ? PQresultErrorMessage(result.get())
                                                       : PQerrorMessage(conn));
      throw SqlError("SQL failed [" + std::string(sqlstate ? sqlstate : "no SQLSTATE") +
                         "]: " + message + "\n  statement: " + statement,
                     sqlstate ? sqlstate : "");
    }
    return result;
  }
};

Db::Db(const std::string& conninfo) : impl_(std::make_unique<Impl>()) {
  impl_->conninfo = conninfo;
  impl_->connect();
}

Db::~Db() = default;
Db::Db(Db&&) noexcept = default;
Db& Db::operator=(Db&&) noexcept = default;

bool Db::connected() const {
  return impl_->conn && PQstatus(impl_->conn) == CONNECTION_OK;
}

void Db::ensure_connected() {
  // PQstatus only notices a dead server after a failed call, so probe with a statement.
  if (connected()) {
    ResultPtr probe(PQexec(impl_->conn, "SELECT 1"));
    if (probe && PQresultStatus(probe.get()) == PGRES_TUPLES_OK) {
      return;
    }
  }
  impl_->connect();
}

Rows Db::query(std::string_view sql, const SqlParams& params) {
  ResultPtr result = impl_->run(sql, params);
  Rows rows;
  const int n_rows = PQntuples(result.get());
  const int n_cols = PQnfields(result.get());
  rows.reserve(static_cast<std::size_t>(n_rows));
  for (int r = 0; r < n_rows; ++r) {
    Row row;
    row.reserve(static_cast<std::size_t>(n_cols));
    for (int c = 0; c < n_cols; ++c) {
      if (PQgetisnull(result.get(), r, c)) {
        row.emplace_back(std::nullopt);
      } else {
        row.emplace_back(std::string(PQgetvalue(result.get(), r, c),
                                     static_cast<std::size_t>(PQgetlength(result.get(), r, c))));
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::optional<std::string> Db::scalar(std::string_view sql, const SqlParams& params) {
  Rows rows = query(sql, params);
  if (rows.size() != 1 || rows[0].size() != 1) {
    throw Failure("expected one row with one column, got " + std::to_string(rows.size()) +
                  " rows from: " + std::string(sql));
  }
  return std::move(rows[0][0]);
}

std::int64_t Db::scalar_int(std::string_view sql, const SqlParams& params) {
  auto value = scalar(sql, params);
  if (!value) {
    throw Failure("expected an integer, got NULL from: " + std::string(sql));
  }
  std::int64_t n = 0;
  auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), n);
  if (ec != std::errc{} || end != value->data() + value->size()) {
    throw Failure("expected an integer, got \"" + *value + "\" from: " + std::string(sql));
  }
  return n;
}

std::int64_t Db::exec(std::string_view sql, const SqlParams& params) {
  ResultPtr result = impl_->run(sql, params);
  const char* affected = PQcmdTuples(result.get());
  if (!affected || *affected == '\0') {
    return 0;
  }
  std::int64_t n = 0;
  std::from_chars(affected, affected + std::char_traits<char>::length(affected), n);
  return n;
}

// ------------------------------------------------------------------ ScratchDatabase

ScratchDatabase::ScratchDatabase(std::string_view prefix) {
  static std::mt19937_64 rng{std::random_device{}()};
  name_ = std::string(prefix) + "_";
  text::append_hex_digits(name_, static_cast<unsigned>(rng()), 8);
  text::append_hex_digits(name_, static_cast<unsigned>(rng()), 4);
  Db server(database_url());
  // Identifiers cannot be bound as parameters; the name is ours (a prefix and hex).
  server.exec("CREATE DATABASE \"" + name_ + "\"");
}

ScratchDatabase::~ScratchDatabase() {
  try {
    Db server(database_url());
    server.exec("DROP DATABASE IF EXISTS \"" + name_ + "\" WITH (FORCE)");
  } catch (const std::exception&) {
    // The server may be down after a failed outage test, and it is throwaway: a leftover
    // database costs nothing, an exception from a destructor would abort the run.
  }
}

std::string ScratchDatabase::url() const {
  const std::string base = database_url();
  const auto scheme = base.find("://");
  if (scheme == std::string::npos) return base + " dbname=" + name_;  // conninfo
  const auto path = base.find('/', scheme + 3);
  const auto query = base.find('?', scheme + 3);
  const std::string authority = base.substr(0, std::min(path, query));
  const std::string rest = query == std::string::npos ? std::string() : base.substr(query);
  return authority + "/" + name_ + rest;
}

}  // namespace idem::test
