// `idemproxy migrate --plan`: what the migrator would do, read-only. The locks come from
// the classifier (migration_script.hpp), the sizes from the database's own catalog.
#include <algorithm>
#include <sstream>
#include <string>

#include "store/blocking_pg.hpp"
#include "store/migration_script.hpp"
#include "store/migrations.hpp"

namespace idem::store {
namespace {

// The first line of a statement, cut to fit a terminal line.
std::string headline(const std::string& statement) {
  std::string s = compact_sql(statement);
  if (s.size() > 72) s = s.substr(0, 69) + "...";
  return s;
}

struct TableSize {
  bool exists = false;
  long long pages = 0;
  double rows = 0;  // the planner's estimate (pg_class.reltuples; -1 before any ANALYZE)
};

TableSize table_size(PGconn* c, const std::string& table) {
  auto r = exec(c,
                "SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint, c.reltuples"
                " FROM pg_class c WHERE c.oid = to_regclass($1)",
                {table}, "cannot size " + table);
  TableSize t;
  if (PQntuples(r.get()) == 0) return t;
  t.exists = true;
  t.pages = std::stoll(PQgetvalue(r.get(), 0, 0));
  t.rows = std::stod(PQgetvalue(r.get(), 0, 1));
  return t;
}

void plan_step(std::ostringstream& out, PGconn* c, const MigrationStep& step,
               const std::vector<ClassifiedStatement>& locks, std::size_t index, bool& online) {
  out << "  step " << index + 1 << ": " << to_string(step.kind);
  if (step.kind == StepKind::backfill) {
    const auto size = table_size(c, step.table);
    out << " of " << step.table << ", " << step.pages << " pages per committed batch";
    if (!size.exists) {
      out << "; the table is created by an earlier pending migration: nothing to walk";
    } else {
      const auto batches = (size.pages + step.pages - 1) / step.pages;
      out << "; walks " << size.pages << " pages in " << batches << " batches, "
          << (size.rows < 0 ? std::string("rows not yet estimated (never analyzed)")
                            : "about " + std::to_string(static_cast<long long>(size.rows)) + " rows")
          << ", changing those its WHERE selects";
    }
  } else if (step.kind == StepKind::index) {
    out << " " << step.index << ", built concurrently outside a transaction";
    auto r = exec(c, "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
                  {step.index}, "cannot inspect index " + step.index);
    if (PQntuples(r.get()) == 1 && std::string_view(PQgetvalue(r.get(), 0, 0)) == "f") {
      out << "; an INVALID index of that name exists (an interrupted run): dropped and built again";
    }
  } else if (step.kind == StepKind::drop_index) {
    out << " " << step.index << ", dropped concurrently outside a transaction (a partitioned "
        << "index: in a moment of the table's lock)";
  } else if (step.kind == StepKind::storage) {
    out << " of " << step.table << ", in a transaction (a partitioned table: on each leaf "
        << "partition); applies to pages written from now on, rewrites nothing";
  }
  out << "\n";
  for (const auto& l : locks) {
    if (l.step != index || l.lock.lock == "none") continue;
    const bool skip = l.lock.what == "session or transaction control";
    if (skip) continue;
    out << "    " << (l.lock.online ? "online " : "BLOCKS ") << l.lock.lock;
    if (!l.lock.table.empty()) out << " on " << l.lock.table;
    out << ": " << l.lock.what << "\n";
    if (!l.lock.online) online = false;
  }
  for (const auto& st : step.statements) {
    if (normalize_sql(st) == "BEGIN" || normalize_sql(st) == "COMMIT") continue;
    out << "      " << headline(st) << "\n";
  }
}

}  // namespace

std::string plan_migrations(const std::string& conninfo, Millis connect_timeout) {
  ConnPtr conn = connect_blocking(conninfo, connect_timeout);
  PGconn* c = conn.get();
  const auto applied = schema_table_exists(c) ? read_applied_migrations(c)
                                              : std::vector<AppliedMigration>{};
  const auto check = compare_schema(applied);
  std::ostringstream out;
  out << "database: schema " << check.database_version << " (" << to_string(check.status)
      << "); this binary: schema " << check.binary_version << "\n";
  if (!check.detail.empty()) out << check.detail << "\n";
  if (check.status != SchemaStatus::behind && check.contract_pending.empty()) {
    out << "nothing to apply\n";
    return out.str();
  }
  bool online = true;
  std::size_t pending = 0;
  for (const auto& m : embedded_migrations()) {
    const bool done = std::any_of(applied.begin(), applied.end(),
                                  [&](const auto& a) { return a.version == m.version; });
    if (done) continue;
    ++pending;
    const auto script = parse_migration(m);
    out << "\n" << migration_label(m) << ": " << script.steps.size() << " steps; replicas of schema "
        << script.compatible_from << " and later keep serving once it is applied\n";
    if (script.contract) {
      out << "  a contract migration: held back unless `migrate --contract`, which refuses while "
          << "replicas before schema " << script.compatible_from << " are connected";
      const auto older = older_replica_sessions(c, script.compatible_from);
      out << " (now: " << older.size() << ")\n";
    }
    const auto locks = classify_script(script);
    for (std::size_t i = 0; i < script.steps.size(); ++i) plan_step(out, c, script.steps[i], locks, i, online);
  }
  out << "\n" << pending << " pending migration" << (pending == 1 ? "" : "s") << "; "
      << (online ? "every step is online (no rewrite or scan under a lock that blocks claims; "
                   "each lock bounded by lock_timeout and retried)"
                 : "NOT ONLINE: a step marked BLOCKS holds a lock that blocks claims while it "
                   "scans or rewrites")
      << "\n";
  return out.str();
}

}  // namespace idem::store
