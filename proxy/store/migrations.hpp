#pragma once
// Schema migrations compiled into the binary (generated from migrations/*.sql) and the
// migrator. Migration runs before any event loop starts, so it uses blocking libpq.
#include <string>
#include <string_view>
#include <vector>

#include "common/types.hpp"

namespace idem::store {

struct EmbeddedMigration {
  int version;
  std::string_view name;
  std::string_view sql;
};

// All migrations, ordered by version (generated source).
const std::vector<EmbeddedMigration>& embedded_migrations();

// Hex SHA-256 of the migration's SQL text.
std::string migration_checksum(const EmbeddedMigration& m);

struct MigrationReport {
  std::vector<int> applied;  // versions applied by this call
  int current_version = 0;   // after the call
};

// Applies pending migrations under a session advisory lock (concurrent migrators wait,
// then find nothing to do), each in its own transaction recorded in
// idemproxy_schema_migrations (version, name, checksum, applied_at). Refuses (throws
// std::runtime_error) if an applied migration's checksum differs or the database has a
// version this binary does not know. Blocking: call before the event loops run.
MigrationReport apply_migrations(const std::string& conninfo, Millis connect_timeout);

enum class SchemaStatus { current, behind, mismatch };

struct SchemaCheck {
  SchemaStatus status = SchemaStatus::behind;
  int database_version = 0;
  std::string detail;
};

// Compares idemproxy_schema_migrations with the embedded list. Blocking. Throws
// std::runtime_error if the database cannot be reached.
SchemaCheck check_schema(const std::string& conninfo, Millis connect_timeout);

// SQL that asks the same question, for the async readiness probe: returns one row per
// applied migration (version, checksum). Compare with compare_schema(). Before the first
// migration the table does not exist and the query fails with SQLSTATE 42P01
// (undefined_table): treat that as SchemaStatus::behind.
extern const char* const kSchemaQuery;
SchemaCheck compare_schema(const std::vector<std::pair<int, std::string>>& applied);

}  // namespace idem::store
