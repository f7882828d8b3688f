// Every request-path statement reaches one tenant's rows only (docs/scaling.md): each of
// the store's statements, and the backend-completion functions of migration 0004, run in
// a transaction that is rolled back, and the transaction's own table statistics
// (pg_stat_xact_user_tables) say which tables it scanned or wrote. On the table
// hash-partitioned by tenant (ctest unit.store.partitioned) that is exactly one partition,
// the tenant's: what a distributed table needs to route a statement to one shard. Retention
// cleanup is the one statement allowed to read every partition; it runs off the request
// path. A statement added to the store is checked
// without being named here.
#include <doctest/doctest.h>

#include <regex>
#include <set>

#include "idempotency/backend_completion.hpp"
#include "store/harness.hpp"

using namespace idem;
using idem::test::PgHarness;
using idem::test::store_database;
using namespace std::chrono_literals;

namespace {

// The statements that may touch every partition, and why they may: neither runs for a
// request.
const std::set<std::string> kBackground = {
    "idem_delete_expired",      // retention cleanup, every cleanup.interval
};


// The highest $n a statement uses.
int parameter_count(const std::string& sql) {
  static const std::regex param(R"(\$([0-9]+))");
  int n = 0;
  for (auto it = std::sregex_iterator(sql.begin(), sql.end(), param); it != std::sregex_iterator();
       ++it) {
    n = std::max(n, std::stoi((*it)[1].str()));
  }
  return n;
}

// The tables the current transaction has read or written so far, as "name" strings.
std::set<std::string> touched_tables(test::Db& sql) {
  std::set<std::string> names;
  for (const auto& row : sql.query(
           "SELECT relname FROM pg_stat_xact_user_tables "
           "WHERE relname LIKE 'idempotency\\_requests%' "
           "  AND seq_scan + coalesce(idx_scan, 0) + n_tup_ins + n_tup_upd + n_tup_del > 0")) {
    names.insert(row.at(0).value_or(""));
  }
  return names;
}

bool partitioned(test::Db& sql) {
  return sql.scalar("SELECT relkind::text FROM pg_class WHERE oid = 'idempotency_requests'::regclass") ==
         "p";
}

// Runs `run` in a transaction that is rolled back and returns the tables it touched.
template <class F>
std::set<std::string> tables_touched_by(test::Db& sql, F&& run) {
  // Since PostgreSQL 15 a session flushes its table counters at most once a second, and
  // the pg_stat_xact_* views show what is not flushed yet, earlier transactions included:
  // flush them as the session goes idle, before the transaction starts.
  sql.exec("SELECT pg_stat_force_next_flush()");
  sql.exec("BEGIN");
  run();
  auto touched = touched_tables(sql);
  sql.exec("ROLLBACK");
  return touched;
}

// The tables one execution of a prepared `statement` touches, its planning left out: the
// sidecar plans each statement once per session (a generic plan is kept; a custom plan is
// pruned to the tenant's partition at plan time), and planning a generic plan may probe the
// index of any partition (the estimate of `expires_at <= now()` reads the actual end of
// each partition's expires_at index once its statistics exist): a cost of the first
// execution, not of a request. So the statement is prepared and executed once (rolled
// back), and the second execution is measured.
// Prepares `statement` as "routed" and returns the EXECUTE that runs it with `params`.
std::string prepare_routed(test::Db& sql, const std::string& statement,
                           const std::vector<std::string>& params) {
  sql.exec("PREPARE routed AS " + statement);
  std::string execute = "EXECUTE routed(";
  for (std::size_t i = 0; i < params.size(); ++i) {
    // The values are the test's own: '1', '{1}', a tid and route names, no quote among them.
    execute += (i ? ", '" : "'") + params[i] + "'";
  }
  return execute + ")";
}

std::set<std::string> touched_by_execution(test::Db& sql, const std::string& statement,
                                           const std::vector<std::string>& params) {
  const std::string execute = prepare_routed(sql, statement, params);
  sql.exec("BEGIN");
  sql.exec(execute);
  sql.exec("ROLLBACK");
  auto touched = tables_touched_by(sql, [&] { sql.exec(execute); });
  sql.exec("DEALLOCATE routed");
  return touched;
}

// The record-table relations whose scans actually ran in one execution, from EXPLAIN
// ANALYZE (rolled back): it sees what the statistics above do not, a TID scan
// (kCompleteByRowBatchSql), and a partition pruned at run time shows "(never executed)".
std::set<std::string> scanned_by_execution(test::Db& sql, const std::string& statement,
                                           const std::vector<std::string>& params) {
  const std::string execute = prepare_routed(sql, statement, params);
  // The sixth execution, as above: the plan cache has made its choice by then.
  for (int i = 0; i < 5; ++i) {
    sql.exec("BEGIN");
    sql.exec(execute);
    sql.exec("ROLLBACK");
  }
  sql.exec("BEGIN");
  static const std::regex scan(R"(Scan(?: using \S+)? on (idempotency_requests\w*).*\(actual)");
  std::set<std::string> ran;
  for (const auto& row : sql.query("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + execute)) {
    std::smatch m;
    const std::string line = row.at(0).value_or("");
    if (std::regex_search(line, m, scan)) ran.insert(m[1].str());
  }
  sql.exec("ROLLBACK");
  sql.exec("DEALLOCATE routed");
  return ran;
}

std::string names(const std::set<std::string>& tables) {
  std::string out;
  for (const auto& t : tables) out += (out.empty() ? "" : " ") + t;
  return out.empty() ? "(none)" : out;
}

// The one table of the record table that holds `tenant`'s rows: a partition on a
// partitioned table, the table itself otherwise.
std::string home_of(test::Db& sql, const std::string& tenant) {
  const auto touched = tables_touched_by(sql, [&] {
    sql.exec("SELECT 1 FROM idempotency_requests WHERE tenant_id = $1 AND endpoint = 'e' "
             "AND idempotency_key = 'k'",
             {tenant});
  });
  REQUIRE(touched.size() == 1);
  return *touched.begin();
}

// A row for each of many tenants, so that a statement that is not routed has rows in
// every partition to scan or change.
void seed_tenants(test::Db& sql) {
  sql.exec(R"sql(
INSERT INTO idempotency_requests
  (tenant_id, endpoint, idempotency_key, request_fingerprint, state, attempt_token,
   lease_expires_at, created_at, expires_at)
SELECT 'route-' || g, '1', '1', '1', 'in_progress', 1, now() - interval '1 s', now(),
       now() - interval '1 s'
FROM generate_series(0, 63) g)sql");
}

}  // namespace

TEST_CASE("routing: every request-path statement touches its tenant's partition only") {
  test::Db sql(store_database().url());
  // The statements as the store runs them: with its sessions' planner settings.
  for (const auto& setting : store::pg_store_session_settings()) {
    sql.exec("SELECT set_config($1, $2, false)", {setting.name, setting.value});
  }
  sql.exec("TRUNCATE idempotency_requests CASCADE");
  seed_tenants(sql);
  const bool parts = partitioned(sql);
  MESSAGE(std::string(parts ? "record table partitioned by tenant" : "record table not partitioned"));
  // Plan-time pruning (a custom plan, as for the first executions of a prepared statement)
  // and run-time pruning (the generic plan the sidecar's prepared statements switch to).
  for (const char* mode : {"force_custom_plan", "force_generic_plan"}) {
    sql.exec("SELECT set_config('plan_cache_mode', $1, false)", {std::string(mode)});
    std::size_t checked = 0;
    for (const auto& statement : store::pg_store_statements()) {
      if (kBackground.count(statement.name)) continue;
      for (const std::string tenant : {"route-7", "route-42"}) {
        // Every parameter '1' but the tenant: valid text, bigint, integer, boolean, jsonb
        // and bytea alike, and the seeded rows' scope and key.
        // The batched statements (database.batching) take arrays: a batch of one, the
        // tenant's. A batch carries whichever tenants' requests were concurrent, and
        // touches each member's partition, as that member's own statement would.
        const bool batch = statement.sql.find("unnest(") != std::string::npos;
        std::vector<std::string> params(static_cast<std::size_t>(parameter_count(statement.sql)),
                                        batch ? "{1}" : "1");
        REQUIRE(!params.empty());
        params[0] = batch ? "{" + tenant + "}" : tenant;
        // A row address (kCompleteByRowSql, kCompleteByRowBatchSql): '1' is no tid.
        static const std::regex tid_param(R"(\$([0-9]+)::tid(\[\])?)");
        for (auto it = std::sregex_iterator(statement.sql.begin(), statement.sql.end(), tid_param);
             it != std::sregex_iterator(); ++it) {
          params.at(static_cast<std::size_t>(std::stoi((*it)[1].str())) - 1) =
              (*it)[2].matched ? "{\"(0,1)\"}" : "(0,1)";
        }
        const auto touched = touched_by_execution(sql, statement.sql, params);
        INFO(statement.name << " (" << std::string(mode) << ") for " << tenant << ": "
                            << names(touched));
        CHECK(touched.size() <= 1);
        if (touched.size() == 1) CHECK(*touched.begin() == home_of(sql, tenant));
        const auto scanned = scanned_by_execution(sql, statement.sql, params);
        INFO("scans that ran: " << names(scanned));
        CHECK(scanned.size() <= 1);
        if (scanned.size() == 1) CHECK(*scanned.begin() == home_of(sql, tenant));
        ++checked;
      }
    }
    CHECK(checked == 2 * (store::pg_store_statements().size() - kBackground.size()));
  }
  sql.exec("SELECT set_config('plan_cache_mode', 'auto', false)");
  sql.exec("TRUNCATE idempotency_requests CASCADE");
}

TEST_CASE("routing: the backend-completion functions touch their tenant's partition only") {
  PgHarness h;
  auto& s = h.store();
  seed_tenants(h.sql());
  store::ClaimRequest req;
  req.id = {"route-7", "POST /orders", "order-1"};
  req.fingerprint = "fp";
  req.lease = 30s;
  req.retention = 1h;
  const auto claim = h.run(s.claim(req));
  REQUIRE(claim.has_value());
  REQUIRE(claim->won);
  const std::string reference = idempotency::record_reference(
      claim->owner.fence, req.retention, req.id.endpoint, req.id.key);
  auto& sql = h.sql();
  const std::string home = home_of(sql, "route-7");
  const auto assert_owner = tables_touched_by(sql, [&] {
    sql.exec("SELECT idemproxy_assert_owner($1, $2)", {"route-7", reference});
  });
  CHECK(assert_owner == std::set<std::string>{home});
  const auto complete = tables_touched_by(sql, [&] {
    sql.exec("SELECT idemproxy_complete($1, $2, 201, '[]'::jsonb, '\\x7b7d'::bytea, '/orders/1')",
             {"route-7", reference});
  });
  CHECK(complete == std::set<std::string>{home});
  // Still the claim's: both ran in transactions that were rolled back.
  CHECK(h.run(s.read(req.id)).value()->state == store::State::in_progress);
}
