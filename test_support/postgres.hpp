#pragma once
// The PostgreSQL under test, for unit and end-to-end tests alike: where it is
// (DATABASE_URL), synchronous access for assertions ("what row did the sidecar leave?")
// and setup (truncate, age a lease), and scratch databases of a test's own. Blocking
// libpq is right here: the test thread has nothing else to do (the product never blocks
// on libpq inside an event loop). Statements are parameterized only; values travel as
// text, results come back as text (NULL as nullopt), exactly as psql would show them.
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "test_support/wait.hpp"

namespace idem::test {

// The variable's value, or nullopt when unset (an empty value counts as set).
std::optional<std::string> env(const char* name);

// DATABASE_URL; throws Failure explaining how to provide it when unset or empty. Suites
// that need PostgreSQL fail (never skip) without one: a skipped store test would let a
// broken store pass CI.
std::string database_url();

// One statement parameter in PostgreSQL's text form; nullopt is SQL NULL.
class SqlParam {
 public:
  SqlParam(std::nullopt_t) {}
  SqlParam(const char* text) : value_(std::string(text)) {}
  SqlParam(std::string text) : value_(std::move(text)) {}
  SqlParam(std::string_view text) : value_(std::string(text)) {}
  SqlParam(bool b) : value_(b ? "true" : "false") {}
  template <std::integral T>
    requires(!std::same_as<T, bool> && !std::same_as<T, char>)
  SqlParam(T n) : value_(std::to_string(n)) {}
  SqlParam(std::optional<std::string> value) : value_(std::move(value)) {}

  const std::optional<std::string>& value() const { return value_; }

 private:
  std::optional<std::string> value_;
};

// What Db throws when a statement fails: a Failure that also names the SQLSTATE, for tests
// that check which error it was.
class SqlError : public Failure {
 public:
  SqlError(const std::string& message, std::string state)
      : Failure(message), sqlstate(std::move(state)) {}
  std::string sqlstate;
};

using SqlParams = std::vector<SqlParam>;
using Row = std::vector<std::optional<std::string>>;
using Rows = std::vector<Row>;

class Db {
 public:
  // A libpq URI or conninfo string (e.g. database_url()). Connects at once, with a 10 s
  // connect timeout unless the string sets one, and a 10 s statement_timeout; throws
  // Failure naming the server's message when it cannot connect. Notices are discarded.
  explicit Db(const std::string& conninfo);
  ~Db();
  Db(Db&&) noexcept;
  Db& operator=(Db&&) noexcept;

  // Rows as text. Throws SqlError (a Failure) with SQLSTATE and message on any error.
  Rows query(std::string_view sql, const SqlParams& params = {});
  // The single value of a one-row, one-column result (nullopt for NULL); throws otherwise.
  std::optional<std::string> scalar(std::string_view sql, const SqlParams& params = {});
  // scalar() as an integer; throws on NULL or non-integer text.
  std::int64_t scalar_int(std::string_view sql, const SqlParams& params = {});
  // Runs a statement and returns the affected row count (0 for utility statements).
  std::int64_t exec(std::string_view sql, const SqlParams& params = {});

  // True if the connection is usable (e.g. after a pgctl stop it is not).
  bool connected() const;
  // Reconnects if the connection broke (the server was restarted); throws if it cannot.
  // Statements also do this by themselves before running on a broken connection.
  void ensure_connected();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A database of a test's (or a test binary's) own on the same server, dropped on
// destruction. The shared test database collects rows from every suite; counters that
// sample the whole table, schema states (unmigrated, behind) and suites that run at once
// are only exact in a database nobody else touches.
class ScratchDatabase {
 public:
  // The name is `prefix`, '_' and random hex: unique, and a valid unquoted identifier.
  explicit ScratchDatabase(std::string_view prefix = "idem_scratch");
  ~ScratchDatabase();
  ScratchDatabase(const ScratchDatabase&) = delete;
  ScratchDatabase& operator=(const ScratchDatabase&) = delete;

  const std::string& name() const { return name_; }
  // DATABASE_URL pointed at this database (a URI stays a URI, conninfo stays conninfo).
  std::string url() const;

 private:
  std::string name_;
};

}  // namespace idem::test
