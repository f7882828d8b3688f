// Migration 0011: the record's five CHECK constraints (0001's four, 0006's trace_id regular
// expression) became one, cheaper for PostgreSQL to prepare per statement and to evaluate
// per row (docs/performance.md, "One CHECK per record"). What must not change is what the
// table accepts. So: the constraint as the migrated table holds it, evaluated beside the
// five as they were written, over every combination of the columns they read and a
// few thousand generated trace ids; the table refusing each kind of broken record
// (plain, and partitioned under ctest unit.store.partitioned); and a table partitioned
// at schema 10 taking the migration on every partition.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "store/harness.hpp"
#include "store/migration_script.hpp"
#include "store/migrations.hpp"

using namespace idem;
using idem::test::store_database;

namespace {

// The five as migrations 0001 and 0006 wrote them. A CHECK passes on NULL, so each is
// taken as coalesce(…, true) on its own.
constexpr const char* kFiveChecks =
    "coalesce(state IN ('in_progress', 'completed'), true)"
    " AND coalesce(attempt_token > 0, true)"
    " AND coalesce(state <> 'completed' OR (response_status IS NOT NULL AND completed_at IS NOT NULL), true)"
    " AND coalesce(state <> 'in_progress' OR lease_expires_at IS NOT NULL, true)"
    " AND coalesce(trace_id ~ '^[0-9a-f]{32}$', true)";

// The record table's CHECK constraints as PostgreSQL prints them ("CHECK (…)").
std::vector<std::string> checks_of(test::Db& db, const std::string& table) {
  std::vector<std::string> out;
  for (const auto& row : db.query("SELECT pg_get_constraintdef(oid) || CASE WHEN convalidated THEN ''"
                                  " ELSE ' (not validated)' END FROM pg_constraint"
                                  " WHERE contype = 'c' AND conrelid = $1::regclass ORDER BY conname",
                                  {table})) {
    out.push_back(row[0].value_or(""));
  }
  return out;
}

// The one constraint's expression, from the migrated table itself.
std::string the_check(test::Db& db) {
  const auto checks = checks_of(db, "idempotency_requests");
  REQUIRE(checks.size() == 1);
  const std::string& def = checks[0];
  REQUIRE(def.starts_with("CHECK ("));
  REQUIRE(def.ends_with(")"));
  return def.substr(6);
}

// Rows shaped like the record, with every column the constraints read.
constexpr const char* kColumns =
    "(state, attempt_token, response_status, completed_at, lease_expires_at, trace_id)";

void expect_same_verdicts(test::Db& db, const std::string& rows_sql, std::int64_t at_least) {
  const std::string one = the_check(db);
  const std::string sql = "SELECT count(*), count(*) FILTER (WHERE (" + std::string(kFiveChecks) +
                          ") IS DISTINCT FROM coalesce(" + one + ", true)), count(*) FILTER (WHERE " +
                          kFiveChecks + "), array_to_string((array_agg(format('%s', r)) FILTER (WHERE (" +
                          kFiveChecks + ") IS DISTINCT FROM coalesce(" + one + ", true)))[1:5], '; ')" +
                          " FROM (" + rows_sql + ") AS r " + kColumns;
  const auto row = db.query(sql);
  REQUIRE(row.size() == 1);
  INFO("rows judged differently (the first five): " << row[0][3].value_or("none"));
  CHECK(std::stoll(*row[0][0]) >= at_least);
  CHECK(*row[0][1] == "0");
  // Both verdicts occur: a set the five all pass (or all refuse) would prove nothing.
  CHECK(std::stoll(*row[0][2]) > 0);
  CHECK(std::stoll(*row[0][2]) < std::stoll(*row[0][0]));
}

// A record of this test's own tenant with the given attempt_token, lease_expires_at,
// response_status and completed_at (SQL, in that order); returns the SQLSTATE of the
// refusal, or "" when the row went in (it is deleted again).
std::string insert_state(test::Db& db, const std::string& key, const std::string& state,
                         const std::string& columns) {
  try {
    db.exec("INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint,"
            " state, attempt_token, lease_expires_at, response_status, completed_at, created_at,"
            " expires_at) VALUES ('record-check', 'POST /orders', $1, 'f', $2, " +
                columns + ", now(), now() + interval '1 day')",
            {key, state});
  } catch (const test::SqlError& e) {
    return e.sqlstate;
  }
  db.exec("DELETE FROM idempotency_requests WHERE tenant_id = 'record-check'");
  return "";
}

}  // namespace

TEST_CASE("the record's one CHECK refuses exactly what the five refused") {
  test::Db db(store_database().url());
  // Every state a writer might send, each column each state needs set or not, attempts
  // around zero, and trace ids at and around the format's edges (32 bytes that are not 32
  // characters, upper case, a trailing newline, which `$` does not match, …).
  expect_same_verdicts(
      db,
      "SELECT s, a, rs, ca, l, t FROM"
      " unnest(ARRAY['in_progress', 'completed', '', 'Completed', 'in_progress ', 'expired']) s,"
      " unnest(ARRAY[-1, 0, 1, 2]::bigint[]) a,"
      " unnest(ARRAY[NULL, 201]::int[]) rs,"
      " unnest(ARRAY[NULL, now()]::timestamptz[]) ca,"
      " unnest(ARRAY[NULL, now()]::timestamptz[]) l,"
      " unnest(ARRAY[NULL, '', repeat('0', 32), repeat('f', 32), '0123456789abcdef0123456789abcdef',"
      "   repeat('a', 31), repeat('a', 33), repeat('A', 32), repeat('a', 31) || 'g',"
      "   repeat('a', 31) || E'\\n', E'\\n' || repeat('a', 31), repeat('a', 32) || E'\\n',"
      "   repeat('a', 30) || 'é', repeat('é', 16), repeat('a', 16) || ' ' || repeat('a', 15),"
      "   repeat('a', 31) || '-']) t",
      6 * 4 * 2 * 2 * 2 * 16);
  // Generated trace ids, mostly near the format: 28 to 36 characters, nearly all hex
  // digits (a few dozen of the 32-character ones are valid), seeded so that a failure
  // repeats.
  db.exec("SELECT setseed(0.26)");
  expect_same_verdicts(
      db,
      "SELECT 'completed', 1::bigint, 201, now(), NULL::timestamptz,"
      " (SELECT string_agg(substr(alphabet, 1 + floor(random() * length(alphabet))::int, 1), '' ORDER BY i)"
      "  FROM generate_series(1, 28 + g % 9) i)"
      " FROM generate_series(1, 4000) g,"
      " (SELECT repeat('0123456789abcdef', 6) || 'gAF/:`é ' || E'\\n') AS a(alphabet)",
      4000);
}

TEST_CASE("the record table refuses each broken record, and takes a whole one") {
  test::Db db(store_database().url());
  db.exec("DELETE FROM idempotency_requests WHERE tenant_id = 'record-check'");
  CHECK(insert_state(db, "ok-1", "in_progress", "1, now(), NULL, NULL") == "");
  CHECK(insert_state(db, "ok-2", "completed", "1, NULL, 201, now()") == "");
  CHECK(insert_state(db, "state", "expired", "1, now(), 201, now()") == "23514");
  CHECK(insert_state(db, "attempt", "in_progress", "0, now(), NULL, NULL") == "23514");
  CHECK(insert_state(db, "lease", "in_progress", "1, NULL, NULL, NULL") == "23514");
  CHECK(insert_state(db, "status", "completed", "1, NULL, NULL, now()") == "23514");
  CHECK(insert_state(db, "completed-at", "completed", "1, NULL, 201, NULL") == "23514");
  // trace_id, on an otherwise whole record.
  const auto with_trace = [&](const std::string& trace) -> std::string {
    try {
      db.exec("INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key,"
              " request_fingerprint, state, attempt_token, response_status, completed_at, created_at,"
              " expires_at, trace_id) VALUES ('record-check', 'POST /orders', 'trace', 'f', 'completed',"
              " 1, 201, now(), now(), now() + interval '1 day', $1)",
              {trace});
    } catch (const test::SqlError& e) {
      return e.sqlstate;
    }
    db.exec("DELETE FROM idempotency_requests WHERE tenant_id = 'record-check'");
    return "";
  };
  CHECK(with_trace("4bf92f3577b34da6a3ce929d0e0e4736") == "");
  CHECK(with_trace("4BF92F3577B34DA6A3CE929D0E0E4736") == "23514");
  CHECK(with_trace("4bf92f3577b34da6a3ce929d0e0e473") == "23514");
  CHECK(with_trace("4bf92f3577b34da6a3ce929d0e0e4736\n") == "23514");
  CHECK(with_trace("4bf92f3577b34da6a3ce929d0e0e47é") == "23514");
  CHECK(db.scalar_int("SELECT count(*) FROM idempotency_requests WHERE tenant_id = 'record-check'") == 0);
}

#ifdef IDEM_PARTITION_SCRIPT
TEST_CASE("a table partitioned at schema 10 takes the one CHECK on every partition") {
  test::ScratchDatabase scratch("idem_record_check_parted");
  std::vector<store::EmbeddedMigration> up_to_10;
  for (const auto& m : store::embedded_migrations()) {
    if (m.version <= 10) up_to_10.push_back(m);
  }
  store::MigrateOptions options;
  options.connect_timeout = Millis{5000};
  options.migrations = &up_to_10;
  REQUIRE(store::apply_migrations(scratch.url(), options).applied.size() == up_to_10.size());
  const std::string cmd = "PGOPTIONS='-c idemproxy.partitions=3 -c client_min_messages=warning' psql '" + scratch.url() +
                          "' -X -q -v ON_ERROR_STOP=1 -f '" IDEM_PARTITION_SCRIPT "' >/dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  test::Db db(scratch.url());
  REQUIRE(checks_of(db, "idempotency_requests").size() == 5);

  store::MigrateOptions rest;
  rest.connect_timeout = Millis{5000};
  CHECK(store::apply_migrations(scratch.url(), rest).applied == std::vector<int>{11});
  int tables = 0;
  for (const auto& row : db.query("SELECT relid::regclass::text FROM pg_partition_tree('idempotency_requests')")) {
    const std::string table = row[0].value_or("");
    INFO(table);
    const auto checks = checks_of(db, table);
    REQUIRE(checks.size() == 1);
    CHECK(checks[0].find("(not validated)") == std::string::npos);
    CHECK(checks[0].find("octet_length(trace_id)") != std::string::npos);
    ++tables;
  }
  CHECK(tables == 4);
  CHECK(insert_state(db, "parted", "in_progress", "1, NULL, NULL, NULL") == "23514");
  CHECK(insert_state(db, "parted", "in_progress", "1, now(), NULL, NULL") == "");
}
#endif
