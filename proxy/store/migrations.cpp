#include "store/migrations.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <libpq-fe.h>
#include <openssl/evp.h>

#include "common/text.hpp"
#include "store/blocking_pg.hpp"
#include "store/migration_script.hpp"

namespace idem::store {

const char* const kSchemaQuery =
    "SELECT version, checksum, to_jsonb(m)->>'compatible_from', name"
    " FROM idemproxy_schema_migrations m ORDER BY version";

std::vector<AppliedMigration> read_applied_migrations(PGconn* conn) {
  auto r = exec(conn, kSchemaQuery, {}, "cannot read idemproxy_schema_migrations");
  std::vector<AppliedMigration> applied;
  for (int i = 0; i < PQntuples(r.get()); ++i) {
    AppliedMigration a;
    a.version = std::stoi(PQgetvalue(r.get(), i, 0));
    a.checksum = PQgetvalue(r.get(), i, 1);
    if (!PQgetisnull(r.get(), i, 2)) a.compatible_from = std::stoi(PQgetvalue(r.get(), i, 2));
    a.name = PQgetvalue(r.get(), i, 3);
    applied.push_back(std::move(a));
  }
  return applied;
}

bool schema_table_exists(PGconn* conn) {
  auto r = exec(conn, "SELECT to_regclass('idemproxy_schema_migrations') IS NOT NULL", {},
                "cannot inspect the schema");
  return std::string_view(PQgetvalue(r.get(), 0, 0)) == "t";
}

namespace {

// The checksums under which each known migration counts as applied: its text's, and
// those of the earlier texts it supersedes (the same end state, reached another way).
struct Known {
  const EmbeddedMigration* migration;
  std::vector<std::string> checksums;
  bool contract = false;
};

std::map<int, Known> index_known(const std::vector<EmbeddedMigration>& list) {
  std::map<int, Known> known;
  for (const auto& m : list) {
    auto script = parse_migration(m);
    Known k{&m, {migration_checksum(m)}, script.contract};
    for (auto& c : script.supersedes) k.checksums.push_back(std::move(c));
    known.emplace(m.version, std::move(k));
  }
  return known;
}

std::string version_label(int version, std::string_view name) {
  std::string v = std::to_string(version);
  if (v.size() < 4) v.insert(0, 4 - v.size(), '0');
  return name.empty() ? v : v + "_" + std::string(name);
}

}  // namespace

std::string migration_label(const EmbeddedMigration& m) { return version_label(m.version, m.name); }

std::string migration_checksum(const EmbeddedMigration& m) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(m.sql.data(), m.sql.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("SHA-256 failed");
  }
  return text::to_hex(digest, length);
}

std::string_view to_string(SchemaStatus s) noexcept {
  switch (s) {
    case SchemaStatus::current: return "current";
    case SchemaStatus::behind: return "behind";
    case SchemaStatus::newer_compatible: return "newer_compatible";
    case SchemaStatus::incompatible: return "incompatible";
    case SchemaStatus::mismatch: return "mismatch";
  }
  return "?";
}

// Ordered checks, each with its reason: a database this binary cannot vouch for
// (mismatch) before one it could migrate (behind), before one it may serve as is.
namespace {

SchemaCheck compare_with(const std::vector<AppliedMigration>& applied,
                         const std::map<int, Known>& known) {
  SchemaCheck check;
  check.binary_version = known.empty() ? 0 : known.rbegin()->first;
  std::map<int, bool> seen;
  const AppliedMigration* newest_unknown = nullptr;
  for (const auto& a : applied) {
    check.database_version = std::max(check.database_version, a.version);
    if (a.version > check.binary_version) {
      // Rows from before the rule carry no compatible_from: only a binary that embeds
      // that migration may serve it.
      check.required_version = std::max(check.required_version, a.compatible_from.value_or(a.version));
      if (!newest_unknown || a.version > newest_unknown->version) newest_unknown = &a;
      continue;
    }
    auto it = known.find(a.version);
    if (it == known.end()) {
      check.status = SchemaStatus::mismatch;
      check.detail = "the database has migration " + version_label(a.version, a.name) +
                     ", which this binary does not have although it knows later ones";
      return check;
    }
    const auto& sums = it->second.checksums;
    if (std::find(sums.begin(), sums.end(), a.checksum) == sums.end()) {
      check.status = SchemaStatus::mismatch;
      check.detail = "migration " + migration_label(*it->second.migration) +
                     " was changed after it was applied (checksum differs)";
      return check;
    }
    seen[a.version] = true;
  }
  std::string pending;
  for (const auto& [version, k] : known) {
    if (seen.count(version)) continue;
    if (k.contract) {
      check.contract_pending.push_back(migration_label(*k.migration));
    } else {
      pending += (pending.empty() ? "" : ", ") + migration_label(*k.migration);
    }
  }
  if (!pending.empty()) {
    check.status = SchemaStatus::behind;
    check.detail = "pending migrations: " + pending;
    return check;
  }
  if (newest_unknown == nullptr) {
    check.status = SchemaStatus::current;
    return check;
  }
  const std::string newest = version_label(newest_unknown->version, newest_unknown->name);
  if (check.required_version <= check.binary_version) {
    check.status = SchemaStatus::newer_compatible;
    check.detail = "the database is at schema " + std::to_string(check.database_version) +
                   " (" + newest + "), newer than this binary's " +
                   std::to_string(check.binary_version) + "; its newer migrations allow binaries " +
                   "from schema " + std::to_string(check.required_version);
  } else {
    check.status = SchemaStatus::incompatible;
    check.detail = "the database has migration " + newest + ", which needs idemproxy with schema " +
                   std::to_string(check.required_version) + " or later; this binary has schema " +
                   std::to_string(check.binary_version) + ": deploy a newer release";
  }
  return check;
}

}  // namespace

SchemaCheck compare_schema(const std::vector<AppliedMigration>& applied,
                           const std::vector<EmbeddedMigration>& list) {
  return compare_with(applied, index_known(list));
}

SchemaCheck compare_schema(const std::vector<AppliedMigration>& applied) {
  // Every readiness probe asks: the embedded texts are parsed and hashed once.
  static const std::map<int, Known> embedded = index_known(embedded_migrations());
  return compare_with(applied, embedded);
}

SchemaCheck check_schema(const std::string& conninfo, Millis connect_timeout) {
  ConnPtr conn = connect_blocking(conninfo, connect_timeout);
  if (!schema_table_exists(conn.get())) return compare_schema({});
  return compare_schema(read_applied_migrations(conn.get()));
}

}  // namespace idem::store
