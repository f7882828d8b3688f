// The migrator: runs each pending migration step by step as its file says
// (migration_script.hpp), and `migrate --plan`. Blocking libpq: it runs before any event
// loop, in `idemproxy migrate` or at the start of `serve` with database.migrate: auto.
#include <algorithm>
#include <chrono>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "store/blocking_pg.hpp"
#include "store/migration_script.hpp"
#include "store/migrations.hpp"

namespace idem::store {
namespace {

using Clock = std::chrono::steady_clock;

// Session advisory lock key shared by every migrator: "idemprox" in ASCII.
constexpr const char* kLockKey = "7594306392365887352";
static_assert(0x6964656d70726f78LL == 7594306392365887352LL);

constexpr const char* kCreateTableSql = R"sql(
CREATE TABLE IF NOT EXISTS idemproxy_schema_migrations (
  version         integer     PRIMARY KEY,
  name            text        NOT NULL,
  checksum        text        NOT NULL,
  applied_at      timestamptz NOT NULL DEFAULT now(),
  compatible_from integer,
  release         text
))sql";

// A table made by a release before the compatibility rule lacks the last two columns.
// Adding them is a catalog change on a table of a few rows; the readiness query of those
// older releases names neither column.
constexpr const char* kAddColumnsSql =
    "SET lock_timeout = '100ms'; ALTER TABLE idemproxy_schema_migrations"
    " ADD COLUMN IF NOT EXISTS compatible_from integer,"
    " ADD COLUMN IF NOT EXISTS release text";

// lock_not_available (lock_timeout), deadlock_detected, serialization_failure: the step
// did nothing that lasts (its transaction rolled back) and may simply be tried again.
bool retryable(const std::string& sqlstate) {
  return sqlstate == "55P03" || sqlstate == "40P01" || sqlstate == "40001";
}

class Runner {
 public:
  Runner(PGconn* conn, const MigrateOptions& options) : conn_(conn), options_(options) {}

  void run(const EmbeddedMigration& m) {
    const auto script = parse_migration(m);
    const auto started = Clock::now();
    label_ = migration_label(m);
    version_ = m.version;
    steps_ = script.steps.size();
    emit(MigrationEvent::Kind::migration_started, 0,
         "compatible-from " + std::to_string(script.compatible_from));
    for (std::size_t i = 0; i < script.steps.size(); ++i) {
      const auto& step = script.steps[i];
      const auto step_started = Clock::now();
      emit(MigrationEvent::Kind::step_started, i + 1, describe(step));
      switch (step.kind) {
        case StepKind::transaction: run_transaction(script, step, i + 1); break;
        case StepKind::backfill: run_backfill(script, step, i + 1); break;
        case StepKind::index: run_index(script, step, i + 1); break;
        case StepKind::drop_index: run_drop_index(script, step, i + 1); break;
        case StepKind::storage: run_storage(script, step, i + 1); break;
      }
      emit(MigrationEvent::Kind::step_done, i + 1, describe(step), seconds_since(step_started));
    }
    exec(conn_,
         "INSERT INTO idemproxy_schema_migrations (version, name, checksum, compatible_from, release) "
         "VALUES ($1::integer, $2, $3, $4::integer, NULLIF($5, ''))",
         {std::to_string(m.version), std::string(m.name), migration_checksum(m),
          std::to_string(script.compatible_from), options_.release},
         "cannot record migration " + label_);
    emit(MigrationEvent::Kind::migration_done, 0, "recorded", seconds_since(started));
  }

 private:
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }

  static std::string describe(const MigrationStep& step) {
    switch (step.kind) {
      case StepKind::transaction: return "transaction";
      case StepKind::backfill:
        return "backfill " + step.table + ", " + std::to_string(step.pages) + " pages per batch";
      case StepKind::index: return "index " + step.index + " (concurrently)";
      case StepKind::drop_index: return "drop index " + step.index + " (concurrently)";
      case StepKind::storage: return "storage parameters of " + step.table;
    }
    return {};
  }

  void emit(MigrationEvent::Kind kind, std::size_t step, std::string detail, double seconds = 0) {
    if (!options_.on_event) return;
    MigrationEvent e;
    e.kind = kind;
    e.version = version_;
    e.name = label_;
    e.step = step;
    e.steps = steps_;
    e.detail = std::move(detail);
    e.seconds = seconds;
    options_.on_event(e);
  }

  // The preamble's SETs, again before every step: a step's own SETs end with it.
  void preamble(const MigrationScript& script) {
    exec(conn_, "RESET ALL", {}, "cannot reset the session");
    for (const auto& s : script.preamble) exec(conn_, s.c_str(), {}, label_ + ": preamble");
  }

  // After a lock was not granted in time: who holds the oldest open transactions, so an
  // operator sees what the migration waits for (never their queries: they may hold data).
  std::string oldest_transactions() {
    auto r = exec_status(conn_,
        "SELECT pid, coalesce(nullif(application_name, ''), '?'),"
        " round(extract(epoch FROM now() - xact_start))::bigint"
        " FROM pg_stat_activity WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()"
        " AND now() - xact_start > interval '1 second' ORDER BY xact_start LIMIT 3");
    if (!r.ok || PQntuples(r.result.get()) == 0) return "no transaction older than 1 s";
    std::string out = "oldest open transactions:";
    for (int i = 0; i < PQntuples(r.result.get()); ++i) {
      out += std::string(i ? "," : "") + " pid " + PQgetvalue(r.result.get(), i, 0) + " (" +
             PQgetvalue(r.result.get(), i, 1) + ", open " + PQgetvalue(r.result.get(), i, 2) + " s)";
    }
    return out;
  }

  // Sleeps before the next try of a step whose lock was not granted, or throws once the
  // step has waited `lock_wait` in all. Backoff from 50 ms doubling to 2 s, jittered, so
  // two migrators or a migrator and autovacuum do not retry in step.
  void back_off(Clock::time_point first_try, int attempt, std::size_t step, const ExecResult& r) {
    const auto waited = Clock::now() - first_try;
    if (waited >= options_.lock_wait) {
      throw std::runtime_error("migration " + label_ + " step " + std::to_string(step) +
                               ": gave up after " +
                               std::to_string(std::chrono::duration_cast<std::chrono::seconds>(waited).count()) +
                               " s of lock waits (" + r.message + "); " + oldest_transactions() +
                               ". Nothing of this step was kept: run migrate again");
    }
    const auto base = std::min<long long>(2000, 50LL << std::min(attempt, 6));
    static thread_local std::minstd_rand rng{std::random_device{}()};
    const auto delay = Millis(base / 2 + static_cast<long long>(rng() % static_cast<unsigned>(base / 2 + 1)));
    emit(MigrationEvent::Kind::step_retry, step,
         "lock not granted (" + r.sqlstate + "); retrying in " + std::to_string(delay.count()) +
             " ms; " + oldest_transactions());
    std::this_thread::sleep_for(delay);
  }

  // Runs `sql` until it succeeds, rolling back and backing off while its lock is not
  // granted; any other error ends the run.
  ExecResult until_granted(const MigrationScript& script, std::size_t step, const char* sql,
                           const std::vector<std::string>& params = {},
                           const std::vector<std::string>& sets = {}) {
    const auto first = Clock::now();
    for (int attempt = 0;; ++attempt) {
      preamble(script);
      step_sets(sets, step);
      auto r = exec_status(conn_, sql, params);
      if (r.ok) return r;
      if (PQtransactionStatus(conn_) != PQTRANS_IDLE) exec_status(conn_, "ROLLBACK");
      if (!retryable(r.sqlstate)) {
        throw std::runtime_error("migration " + label_ + " step " + std::to_string(step) +
                                 " failed: " + r.message);
      }
      back_off(first, attempt, step, r);
    }
  }

  // A step's own SETs. `session_replication_role = replica` (a backfill that changes
  // nothing a replay shows, so migration 0002's announcement trigger need not fire for
  // each row) needs superuser rights: without them the step runs with its triggers
  // firing, slower, and says so once.
  void step_sets(const std::vector<std::string>& sets, std::size_t step) {
    for (const auto& s : sets) {
      auto r = exec_status(conn_, s.c_str());
      if (r.ok) continue;
      if (r.sqlstate == "42501" && normalize_sql(s).starts_with("SET SESSION_REPLICATION_ROLE")) {
        if (!warned_replication_role_) {
          emit(MigrationEvent::Kind::note, step,
               "not permitted to set session_replication_role (" + r.message +
                   "): row triggers fire for every backfilled row, which is slower");
          warned_replication_role_ = true;
        }
        continue;
      }
      throw std::runtime_error("migration " + label_ + " step " + std::to_string(step) + ": " + r.message);
    }
  }

  void run_transaction(const MigrationScript& script, const MigrationStep& step, std::size_t n) {
    until_granted(script, n, step.sql.c_str());
  }

  static std::vector<std::string> sets_of(const MigrationStep& step) {
    return {step.statements.begin(), step.statements.end() - 1};
  }

  // A backfill is a background job: between its batches the foreground gets the disk.
  void rest_after(Clock::duration batch) {
    const auto rest = std::chrono::duration_cast<Millis>(batch * options_.backfill_rest);
    std::this_thread::sleep_for(std::min(rest, Millis(1000)));
  }

  std::uint64_t relation_pages(const std::string& table) {
    auto r = exec(conn_,
                  "SELECT coalesce(pg_relation_size(to_regclass($1)), 0)"
                  " / current_setting('block_size')::bigint",
                  {table}, label_ + ": cannot size " + table);
    return std::stoull(PQgetvalue(r.get(), 0, 0));
  }

  // Sweeps the table's pages a batch at a time, each batch committed on its own, until a
  // sweep changes nothing: rows that a writer of the previous release updated behind the
  // sweep (a new row version, elsewhere, still unset) are caught by the next one.
  void run_backfill(const MigrationScript& script, const MigrationStep& step, std::size_t n) {
    const auto sets = sets_of(step);
    const auto& update = step.statements.back();
    constexpr int kMaxSweeps = 20;
    std::uint64_t total = 0;
    for (int sweep = 1;; ++sweep) {
      if (sweep > kMaxSweeps) {
        throw std::runtime_error("migration " + label_ + " step " + std::to_string(n) +
                                 ": rows still change behind the backfill after " +
                                 std::to_string(kMaxSweeps) + " sweeps");
      }
      const auto pages = relation_pages(step.table);
      std::uint64_t changed = 0;
      auto last_report = Clock::now();
      for (std::uint64_t page = 0; page < pages; page += step.pages) {
        const auto batch_started = Clock::now();
        auto r = until_granted(script, n, update.c_str(),
                               {"(" + std::to_string(page) + ",0)",
                                "(" + std::to_string(page + step.pages) + ",0)"},
                               sets);
        const char* tuples = PQcmdTuples(r.result.get());
        const auto batch_changed = tuples && *tuples ? std::stoull(tuples) : 0;
        changed += batch_changed;
        if (batch_changed > 0) rest_after(Clock::now() - batch_started);
        if (Clock::now() - last_report > std::chrono::seconds(5)) {
          last_report = Clock::now();
          emit(MigrationEvent::Kind::step_progress, n,
               "sweep " + std::to_string(sweep) + ": page " + std::to_string(page) + " of " +
                   std::to_string(pages) + ", " + std::to_string(changed) + " rows changed");
        }
      }
      total += changed;
      emit(MigrationEvent::Kind::step_progress, n,
           "sweep " + std::to_string(sweep) + " done: " + std::to_string(pages) + " pages, " +
               std::to_string(changed) + " rows changed (" + std::to_string(total) + " in all)");
      if (changed == 0) return;
    }
  }

  // NULL when there is no such index.
  std::optional<bool> index_valid(const std::string& name) {
    auto r = exec(conn_, "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
                  {name}, label_ + ": cannot inspect index " + name);
    if (PQntuples(r.get()) == 0) return std::nullopt;
    return std::string_view(PQgetvalue(r.get(), 0, 0)) == "t";
  }

  // An interrupted CREATE INDEX CONCURRENTLY leaves an INVALID index that IF NOT EXISTS
  // would then take for done: it is found here and dropped, concurrently, to be built again.
  void drop_if_invalid(const MigrationScript& script, const MigrationStep& step, std::size_t n) {
    if (index_valid(step.index) != std::optional<bool>(false)) return;
    emit(MigrationEvent::Kind::note, n,
         "index " + step.index + " is INVALID (an earlier run was interrupted): dropping it to build it again");
    // The name is checked by parse_migration (the index the step creates); quote_ident
    // keeps it an identifier anyway.
    auto q = exec(conn_, "SELECT 'DROP INDEX CONCURRENTLY IF EXISTS ' || quote_ident($1)",
                  {step.index}, label_ + ": cannot quote " + step.index);
    until_granted(script, n, PQgetvalue(q.get(), 0, 0));
  }

  void run_index(const MigrationScript& script, const MigrationStep& step, std::size_t n) {
    const auto sets = sets_of(step);
    const auto first = Clock::now();
    for (int attempt = 0;; ++attempt) {
      drop_if_invalid(script, step, n);
      preamble(script);
      step_sets(sets, n);
      auto r = exec_status(conn_, step.statements.back().c_str());
      if (r.ok) break;
      if (!retryable(r.sqlstate)) {
        throw std::runtime_error("migration " + label_ + " step " + std::to_string(n) +
                                 " failed: " + r.message + " (the INVALID index it may have left is "
                                 "dropped and built again by the next run)");
      }
      back_off(first, attempt, n, r);
    }
    if (index_valid(step.index) != std::optional<bool>(true)) {
      throw std::runtime_error("migration " + label_ + ": index " + step.index +
                               " is not valid after it was built");
    }
  }

  // DROP INDEX CONCURRENTLY waits for the transactions using the index and blocks no
  // claim meanwhile; retried like a lock not granted. A partitioned index cannot be
  // dropped concurrently (PostgreSQL 15): it goes in a moment of ACCESS EXCLUSIVE on the
  // table, bounded by the preamble's lock_timeout and retried, as catalog steps are.
  void run_drop_index(const MigrationScript& script, const MigrationStep& step, std::size_t n) {
    auto kind = exec(conn_, "SELECT c.relkind::text FROM pg_class c WHERE c.oid = to_regclass($1)",
                     {step.index}, label_ + ": cannot inspect index " + step.index);
    if (PQntuples(kind.get()) == 0) return;  // dropped already (a run again)
    if (std::string_view(PQgetvalue(kind.get(), 0, 0)) == "I") {
      emit(MigrationEvent::Kind::note, n,
           "index " + step.index + " is partitioned: dropped in a moment of the table's lock");
      auto q = exec(conn_, "SELECT 'BEGIN; DROP INDEX IF EXISTS ' || quote_ident($1) || '; COMMIT;'",
                    {step.index}, label_ + ": cannot quote " + step.index);
      until_granted(script, n, PQgetvalue(q.get(), 0, 0));
      return;
    }
    until_granted(script, n, step.statements.back().c_str(), {}, sets_of(step));
  }

  // Storage parameters take SHARE UPDATE EXCLUSIVE, which no claim, read or completion
  // waits for. A partitioned table has no storage of its own (PostgreSQL refuses the
  // statement on it): the same clause goes to every leaf partition, in one transaction.
  void run_storage(const MigrationScript& script, const MigrationStep& step, std::size_t n) {
    const auto& alter = step.statements.back();
    auto leaves = exec(conn_,
                       "SELECT 'BEGIN; ' || string_agg(regexp_replace($2, '^\\s*alter\\s+table\\s+\\S+',"
                       "         'ALTER TABLE ' || relid::regclass::text, 'i'), '; ') || '; COMMIT;'"
                       " FROM pg_partition_tree($1::regclass) WHERE isleaf"
                       "   AND (SELECT relkind FROM pg_class WHERE oid = $1::regclass) = 'p'",
                       {step.table, alter}, label_ + ": cannot list the partitions of " + step.table);
    if (PQgetisnull(leaves.get(), 0, 0)) {
      until_granted(script, n, alter.c_str(), {}, sets_of(step));
      return;
    }
    emit(MigrationEvent::Kind::note, n,
         step.table + " is partitioned: its storage parameters are set on each leaf partition");
    until_granted(script, n, PQgetvalue(leaves.get(), 0, 0), {}, sets_of(step));
  }

  PGconn* conn_;
  const MigrateOptions& options_;
  std::string label_;
  int version_ = 0;
  std::size_t steps_ = 0;
  bool warned_replication_role_ = false;
};

void ensure_schema_table(PGconn* c) {
  exec(c, kCreateTableSql, {}, "cannot create idemproxy_schema_migrations");
  auto r = exec(c,
                "SELECT count(*) FROM pg_attribute WHERE attrelid = 'idemproxy_schema_migrations'::regclass"
                " AND attname IN ('compatible_from', 'release') AND NOT attisdropped",
                {}, "cannot inspect idemproxy_schema_migrations");
  if (std::string_view(PQgetvalue(r.get(), 0, 0)) == "2") return;
  // Tiny table, but readiness probes of every replica read it: bounded, retried.
  for (int attempt = 0;; ++attempt) {
    auto a = exec_status(c, kAddColumnsSql);
    if (a.ok) break;
    if (!retryable(a.sqlstate) || attempt >= 200) {
      throw std::runtime_error("cannot extend idemproxy_schema_migrations: " + a.message);
    }
    std::this_thread::sleep_for(Millis(50));
  }
  exec(c, "RESET lock_timeout");
}

// A contract migration (`-- idemproxy:contract`) removes what replicas of a release
// before its compatible-from still use: it is applied only when asked (`migrate
// --contract`), and then only while no session of such a replica is connected. False:
// held back. A database migrated from nothing in this run takes them at once: no
// replica can have served it before (each would have been `schema_behind`).
bool admit(PGconn* c, const EmbeddedMigration& m, const MigrateOptions& options, bool fresh) {
  const auto script = parse_migration(m);
  if (!script.contract || fresh) return true;
  const std::string label = migration_label(m);
  if (!options.contract) {
    if (options.on_event) {
      MigrationEvent e;
      e.version = m.version;
      e.name = label;
      e.detail = "held back: a contract migration (it removes what releases before schema " +
                 std::to_string(script.compatible_from) + " use); run `idemproxy migrate --contract` " +
                 "once every replica runs schema " + std::to_string(script.compatible_from) + " or later";
      options.on_event(e);
    }
    return false;
  }
  const auto older = older_replica_sessions(c, script.compatible_from);
  if (!older.empty()) {
    std::string list;
    for (const auto& o : older) list += (list.empty() ? "" : "; ") + o;
    throw std::runtime_error("refusing to apply contract migration " + label + ": " +
                             std::to_string(older.size()) + " session(s) of replicas before schema " +
                             std::to_string(script.compatible_from) + " are connected (" + list +
                             "); finish rolling them out first");
  }
  return true;
}

}  // namespace

// Replicas name their schema in application_name ("idemproxy schema=8", the listener
// "idemproxy-listener schema=8", pg_store_pool_options()); releases before that named
// none ("idemproxy", "idemproxy-listener"), and count as older than any contract.
std::vector<std::string> older_replica_sessions(PGconn* c, int compatible_from) {
  auto r = exec(c,
                "SELECT pid::text || ' ' || application_name FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                "   AND application_name ~ '^idemproxy(-listener)?( |$)'"
                "   AND coalesce(substring(application_name from ' schema=([0-9]{1,6})$')::integer, 0)"
                "       < $1::integer"
                " ORDER BY pid",
                {std::to_string(compatible_from)}, "cannot list the sessions of replicas");
  std::vector<std::string> out;
  for (int i = 0; i < PQntuples(r.get()); ++i) out.emplace_back(PQgetvalue(r.get(), i, 0));
  return out;
}

MigrationReport apply_migrations(const std::string& conninfo, const MigrateOptions& options) {
  ConnPtr conn = connect_blocking(conninfo, options.connect_timeout);
  PGconn* c = conn.get();

  // Held for the whole run, so a second migrator waits here and then finds nothing to
  // do. It is a session lock: if anything below throws, closing the connection frees it.
  // Taken before CREATE TABLE IF NOT EXISTS, which is not safe to race by itself (two
  // sessions can both decide to create and one fails on the catalog's unique index).
  exec(c, "SELECT pg_advisory_lock($1::bigint)", {kLockKey}, "cannot take the migration lock");
  ensure_schema_table(c);

  const auto& list = options.migrations ? *options.migrations : embedded_migrations();
  const auto applied = read_applied_migrations(c);
  const SchemaCheck before = compare_schema(applied, list);
  if (before.status == SchemaStatus::mismatch || before.status == SchemaStatus::incompatible) {
    throw std::runtime_error("refusing to migrate: " + before.detail);
  }

  MigrationReport report;
  report.current_version = before.database_version;
  report.binary_version = before.binary_version;
  if (before.status == SchemaStatus::newer_compatible && options.on_event) {
    MigrationEvent e;
    e.detail = before.detail + ": nothing to apply";
    options.on_event(e);
  }
  Runner runner(c, options);
  for (const auto& m : list) {
    const bool done = std::any_of(applied.begin(), applied.end(),
                                  [&](const auto& a) { return a.version == m.version; });
    if (done) continue;
    if (!admit(c, m, options, applied.empty())) {
      report.held_back.push_back(m.version);
      continue;
    }
    runner.run(m);
    report.applied.push_back(m.version);
    report.current_version = std::max(report.current_version, m.version);
  }
  exec(c, "SELECT pg_advisory_unlock($1::bigint)", {kLockKey}, "cannot release the migration lock");
  return report;
}

MigrationReport apply_migrations(const std::string& conninfo, Millis connect_timeout) {
  MigrateOptions options;
  options.connect_timeout = connect_timeout;
  return apply_migrations(conninfo, options);
}

}  // namespace idem::store
