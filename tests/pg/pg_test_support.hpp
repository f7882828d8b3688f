#pragma once
// Test helpers shared by tests/pg and tests/store: the server from DATABASE_URL, a private
// database per test binary or test case, blocking SQL to inspect rows (tests only: the
// product never blocks on libpq inside an event loop), and running an awaitable to
// completion on an io_context.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <libpq-fe.h>

#include "common/types.hpp"

namespace idem::test {

// PostgreSQL suites fail (never skip) without a server: a skipped store test would let a
// broken store pass CI.
inline std::string database_url() {
  const char* url = std::getenv("DATABASE_URL");
  if (!url || !*url) {
    throw std::runtime_error(
        "DATABASE_URL is not set: the PostgreSQL tests need a server (scripts/test starts "
        "one; by hand: eval \"$(scripts/lib/pg-up /tmp/pg)\")");
  }
  return url;
}

// The control script of a throwaway server (pg-up), or "" when the server is not ours to
// stop.
inline std::string pgctl() {
  const char* p = std::getenv("IDEM_TEST_PGCTL");
  return p ? p : "";
}

inline void pgctl_run(const std::string& action) {
  const std::string cmd = "'" + pgctl() + "' " + action;
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("pgctl " + action + " failed");
}

// The same server with another database: conninfo (URI or key=value) rewritten as
// key=value with dbname replaced, everything else (host, port, user, sslmode...) kept.
inline std::string conninfo_with_dbname(const std::string& conninfo, const std::string& db) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  if (!opts) {
    std::string msg = err ? err : "invalid conninfo";
    PQfreemem(err);
    throw std::runtime_error(msg);
  }
  auto quote = [](const std::string& v) {
    std::string out = "'";
    for (char c : v) {
      if (c == '\'' || c == '\\') out.push_back('\\');
      out.push_back(c);
    }
    return out + "'";
  };
  std::string out;
  for (PQconninfoOption* o = opts; o->keyword; ++o) {
    if (!o->val || std::string(o->keyword) == "dbname") continue;
    out += std::string(o->keyword) + "=" + quote(o->val) + " ";
  }
  PQconninfoFree(opts);
  return out + "dbname=" + quote(db);
}

using Row = std::vector<std::optional<std::string>>;

// A failed statement, with its SQLSTATE for tests that check which error it was.
struct SqlError : std::runtime_error {
  SqlError(const std::string& message, std::string state)
      : std::runtime_error(message), sqlstate(std::move(state)) {}
  std::string sqlstate;
};

// A blocking connection for test set-up and inspection.
class Sql {
 public:
  explicit Sql(const std::string& conninfo) : conn_(PQconnectdb(conninfo.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) {
      std::string msg = PQerrorMessage(conn_);
      PQfinish(conn_);
      throw std::runtime_error("test connection failed: " + msg);
    }
    PQsetNoticeProcessor(conn_, [](void*, const char*) {}, nullptr);
  }
  ~Sql() { PQfinish(conn_); }
  Sql(const Sql&) = delete;
  Sql& operator=(const Sql&) = delete;

  std::vector<Row> rows(const std::string& sql, const std::vector<std::string>& params = {}) {
    std::vector<const char*> values;
    for (const auto& p : params) values.push_back(p.c_str());
    PGresult* r = PQexecParams(conn_, sql.c_str(), static_cast<int>(values.size()), nullptr,
                               values.data(), nullptr, nullptr, 0);
    const ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
      std::string msg = PQresultErrorMessage(r);
      const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
      std::string sqlstate = state != nullptr ? state : "";
      PQclear(r);
      throw SqlError("test SQL failed: " + sql + ": " + msg, std::move(sqlstate));
    }
    std::vector<Row> out;
    for (int i = 0; i < PQntuples(r); ++i) {
      Row row;
      for (int j = 0; j < PQnfields(r); ++j) {
        if (PQgetisnull(r, i, j)) {
          row.emplace_back(std::nullopt);
        } else {
          row.emplace_back(PQgetvalue(r, i, j));
        }
      }
      out.push_back(std::move(row));
    }
    PQclear(r);
    return out;
  }

  void exec(const std::string& sql, const std::vector<std::string>& params = {}) {
    rows(sql, params);
  }

  std::optional<std::string> scalar(const std::string& sql,
                                    const std::vector<std::string>& params = {}) {
    auto r = rows(sql, params);
    if (r.empty() || r[0].empty()) return std::nullopt;
    return r[0][0];
  }

 private:
  PGconn* conn_;
};

// A database of its own for a test binary run or a test case, dropped on destruction, so
// suites running at once against one server never see each other's rows.
class TempDatabase {
 public:
  explicit TempDatabase(const std::string& prefix = "idem_test") {
    std::random_device rd;
    name_ = prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(rd() % 1000000);
    Sql admin(database_url());
    admin.exec("CREATE DATABASE " + name_);
    conninfo_ = conninfo_with_dbname(database_url(), name_);
  }
  ~TempDatabase() {
    try {
      Sql admin(database_url());
      admin.exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
    } catch (...) {
      // The server may be down after a failed outage test; leave the database behind
      // rather than abort the run.
    }
  }
  TempDatabase(const TempDatabase&) = delete;
  TempDatabase& operator=(const TempDatabase&) = delete;

  const std::string& conninfo() const { return conninfo_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::string conninfo_;
};

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
