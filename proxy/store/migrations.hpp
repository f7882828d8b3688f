#pragma once
// Schema migrations compiled into the binary (generated from migrations/*.sql) and the
// migrator. Migration runs before any event loop starts, so it uses blocking libpq.
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.hpp"

struct pg_conn;  // libpq's PGconn

namespace idem::store {

// What apply_migrations() and check_schema() throw when no host of the list accepted a
// connection (refused, timed out, starting up or shutting down, out of connection slots,
// a name that does not resolve, a refused login): the one failure that may end by
// itself, which `serve` waits out for database.start_wait. Every other failure is a
// plain std::runtime_error.
struct DatabaseUnreachable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct EmbeddedMigration {
  int version;
  std::string_view name;
  std::string_view sql;
};

// All migrations, ordered by version (generated source).
const std::vector<EmbeddedMigration>& embedded_migrations();

// Hex SHA-256 of the migration's SQL text.
std::string migration_checksum(const EmbeddedMigration& m);
// "0003_fencing_tokens"
std::string migration_label(const EmbeddedMigration& m);

struct MigrationReport {
  std::vector<int> applied;  // versions applied by this call
  std::vector<int> held_back;  // contract migrations left for `migrate --contract`
  int current_version = 0;   // after the call (the database's newest)
  int binary_version = 0;    // the newest this binary embeds
};

// What the migrator is doing, as it happens (`idemproxy migrate` prints each one with
// its time; scripts/upgrade-check attributes claim stalls to steps from them).
struct MigrationEvent {
  enum class Kind { migration_started, step_started, step_progress, step_retry, step_done,
                    migration_done, note };
  Kind kind = Kind::note;
  int version = 0;
  std::string name;       // "0003_fencing_tokens"
  std::size_t step = 0;   // 1-based; 0 for the migration as a whole
  std::size_t steps = 0;
  std::string detail;     // one line, never a secret
  double seconds = 0;     // step_done, migration_done: how long it took
};

struct MigrateOptions {
  Millis connect_timeout{5000};
  // How long one step may keep retrying a lock it was not granted within the file's
  // lock_timeout (a long transaction holds a conflicting one) before the run fails.
  Millis lock_wait{600000};
  // After each backfill batch the migrator rests for this share of the time the batch
  // took (1.0: as long again), so the batch's WAL and I/O leave room for the claims
  // committing meanwhile (a claim's commit waits for the WAL flush ahead of it).
  double backfill_rest = 1.0;
  std::string release;  // recorded beside each migration applied (idemproxy --version)
  std::function<void(const MigrationEvent&)> on_event;
  // The migrations to apply; null: the embedded ones (tests pass their own).
  const std::vector<EmbeddedMigration>* migrations = nullptr;
  // Also apply contract migrations (`-- idemproxy:contract`: they remove what an older
  // release still uses). Refused while a session of such a release is connected.
  bool contract = false;
};

// The sessions of replicas too old for a contract migration that allows binaries from
// schema `compatible_from`: "pid application_name" for each (application names carry the
// schema, pg_store_pool_options()). Blocking.
std::vector<std::string> older_replica_sessions(pg_conn* conn, int compatible_from);

// Applies pending migrations under a session advisory lock (concurrent migrators wait,
// then find nothing to do), step by step as each file says (migration_script.hpp), and
// records each in idemproxy_schema_migrations (version, name, checksum, applied_at,
// compatible_from, release) once all its steps are done. A step whose lock is not
// granted within the file's lock_timeout is rolled back and tried again with backoff, up
// to `lock_wait`, so a migration waits for a long transaction without claims waiting
// behind it. Steps are written to be run again, so an interrupted run is finished by the
// next one. Refuses (throws std::runtime_error) if an applied migration's checksum matches
// neither its text nor a text it supersedes, or the database has a newer migration that
// this binary may not serve. Blocking: call before the event loops run.
MigrationReport apply_migrations(const std::string& conninfo, const MigrateOptions& options);
MigrationReport apply_migrations(const std::string& conninfo, Millis connect_timeout);

// `idemproxy migrate --plan`: the pending migrations, each step's statements with the lock
// each takes and whether it is online, and the pages and rows a backfill will walk, read
// from the database without changing anything. Blocking.
std::string plan_migrations(const std::string& conninfo, Millis connect_timeout);

enum class SchemaStatus {
  current,           // exactly the embedded migrations
  behind,            // some embedded migration is not applied
  newer_compatible,  // newer migrations, each allowing this binary's schema: serve
  incompatible,      // a newer migration needs a newer binary
  mismatch,          // a checksum differs, or a migration this binary cannot place
};
std::string_view to_string(SchemaStatus s) noexcept;

struct SchemaCheck {
  SchemaStatus status = SchemaStatus::behind;
  int database_version = 0;
  int binary_version = 0;
  int required_version = 0;  // the oldest binary schema the database allows (newer only)
  std::string detail;
  // Contract migrations this binary embeds and the database lacks. They never make a
  // binary `behind`: it serves with or without them (docs/operations.md, "Upgrading").
  std::vector<std::string> contract_pending;
};

// Compares idemproxy_schema_migrations with the embedded list. Blocking. Throws
// std::runtime_error if the database cannot be reached.
SchemaCheck check_schema(const std::string& conninfo, Millis connect_timeout);

// One applied migration as the database records it. compatible_from is empty for rows
// written before the column existed: such a migration is served only by binaries that
// embed it.
struct AppliedMigration {
  int version = 0;
  std::string checksum;
  std::optional<int> compatible_from;
  std::string name;
};

// SQL that asks the same question, for the async readiness probe: one row per applied
// migration (version, checksum, compatible_from or NULL). It reads compatible_from through
// to_jsonb so that it also runs on a table from before that column. Compare with
// compare_schema(). Before the first migration the table does not exist and the query
// fails with SQLSTATE 42P01 (undefined_table): treat that as SchemaStatus::behind.
extern const char* const kSchemaQuery;
SchemaCheck compare_schema(const std::vector<AppliedMigration>& applied);
// The same against another list than the embedded one (tests; a build's extra migrations).
SchemaCheck compare_schema(const std::vector<AppliedMigration>& applied,
                           const std::vector<EmbeddedMigration>& known);

// Blocking reads of idemproxy_schema_migrations for the commands above.
bool schema_table_exists(pg_conn* conn);
std::vector<AppliedMigration> read_applied_migrations(pg_conn* conn);

}  // namespace idem::store
