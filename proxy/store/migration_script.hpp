#pragma once
// A migration file as the migrator runs it, and what each of its statements locks.
//
// A file (migrations/NNNN_name.sql, docs/operations.md "Writing a migration") is
//
//   -- comments
//   -- idemproxy:compatible-from N        binaries of schema N and later may serve a
//                                         database with this migration (required)
//   -- idemproxy:supersedes <sha256>      an earlier text of this migration with the same
//                                         end state; databases that recorded it are current
//   -- idemproxy:contract                 removes what an older release still uses: applied
//                                         only by `migrate --contract`, once no replica of a
//                                         release before compatible-from is connected
//   SET lock_timeout = '100ms';           the preamble: SET statements only, run again
//   SET statement_timeout = '10min';      before every step
//   -- idemproxy:step transaction         BEGIN; ...; COMMIT;   run as one, retried whole
//   -- idemproxy:step backfill TABLE PAGES  one UPDATE over `ctid >= $1 AND ctid < $2`,
//                                         run PAGES pages at a time, each batch committed
//   -- idemproxy:step index NAME          one CREATE INDEX CONCURRENTLY IF NOT EXISTS NAME,
//                                         outside a transaction; an INVALID NAME left by
//                                         an interrupted run is dropped and built again
//   -- idemproxy:step drop-index NAME     one DROP INDEX CONCURRENTLY IF EXISTS NAME, outside
//                                         a transaction (a partitioned index, which cannot
//                                         be dropped concurrently, is dropped in a moment of
//                                         the lock under the preamble's lock_timeout)
//   -- idemproxy:step storage TABLE       one ALTER TABLE TABLE SET (storage parameters),
//                                         in a transaction; on a partitioned TABLE (which
//                                         has no storage) it is set on every leaf partition
//
// Parsing and classifying are pure, so every embedded migration is checked by unit tests
// (parse_migration throws on a file the migrator could not run as written).
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace idem::store {

struct EmbeddedMigration;

enum class StepKind { transaction, backfill, index, drop_index, storage };
std::string_view to_string(StepKind kind) noexcept;

struct MigrationStep {
  StepKind kind = StepKind::transaction;
  int line = 0;              // of the step's marker, for messages
  std::string table;         // backfill: the table whose pages are walked; storage: the table
  unsigned pages = 0;        // backfill: pages per batch
  std::string index;         // index, drop_index: the index's name
  std::string sql;           // the step's text (transaction: sent as one query string)
  std::vector<std::string> statements;  // split, comments kept; backfill/index: SETs, then one
};

struct MigrationScript {
  int compatible_from = 0;
  std::vector<std::string> supersedes;  // hex SHA-256 of earlier texts
  bool contract = false;                // applied only by `migrate --contract`
  std::vector<std::string> preamble;    // SET statements
  std::vector<MigrationStep> steps;
};

struct MigrationSyntaxError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws MigrationSyntaxError naming the file and line.
MigrationScript parse_migration(const EmbeddedMigration& m);

// The statements of `sql`, split at semicolons outside quotes, dollar quotes and
// comments; each trimmed, without its semicolon; empty ones (comments only) dropped.
std::vector<std::string> split_sql(std::string_view sql);

// `sql` with comments removed, quoted text and dollar-quoted bodies kept as placeholders,
// whitespace collapsed to single spaces and letters upper-cased: what the classifier reads.
std::string normalize_sql(std::string_view sql);
// The same with the letters as written: a statement as the plan shows it.
std::string compact_sql(std::string_view sql);

// What one statement does to the tables other sessions use.
struct StatementLock {
  std::string lock;       // e.g. "ACCESS EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "none"
  std::string table;      // what it locks ("" when nothing)
  bool blocks_claims = false;  // the lock conflicts with INSERT/UPDATE/DELETE
  bool online = false;    // false: a rewrite or scan under a lock that blocks claims, or unknown
  std::string what;       // one line for the plan
};

// `created` holds the tables created earlier in the same migration (upper-cased names):
// nobody else can be using those, so anything on them is online.
StatementLock classify_statement(std::string_view statement,
                                 const std::vector<std::string>& created);

// classify_statement over every statement of every step, in order.
struct ClassifiedStatement {
  std::size_t step = 0;
  StatementLock lock;
};
std::vector<ClassifiedStatement> classify_script(const MigrationScript& script);

}  // namespace idem::store
