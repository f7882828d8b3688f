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
#include "pg/host_list.hpp"

namespace idem::store {

const char* const kSchemaQuery =
    "SELECT version, checksum FROM idemproxy_schema_migrations ORDER BY version";

namespace {

// Session advisory lock key shared by every migrator: "idemprox" in ASCII.
constexpr const char* kLockKey = "7594306392365887352";
static_assert(0x6964656d70726f78LL == 7594306392365887352LL);

constexpr const char* kCreateTableSql = R"sql(
CREATE TABLE IF NOT EXISTS idemproxy_schema_migrations (
  version    integer     PRIMARY KEY,
  name       text        NOT NULL,
  checksum   text        NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
))sql";

struct ConnCloser {
  void operator()(PGconn* c) const { PQfinish(c); }
};
struct ResultClearer {
  void operator()(PGresult* r) const { PQclear(r); }
};
using ConnPtr = std::unique_ptr<PGconn, ConnCloser>;
using ResultPtr = std::unique_ptr<PGresult, ResultClearer>;

void discard_notice(void*, const char*) {}

std::string trimmed_message(const char* msg) {
  return std::string(text::trim_end(msg ? msg : "", "\n "));
}

// The password values in `conninfo`, to scrub from libpq's messages. libpq's parser quotes
// the text it could not parse (a bad percent-escape, a keyword without '='), which in a
// malformed URL may be the password itself: such errors are reported without its text.
std::vector<std::string> conninfo_secrets(const std::string& conninfo) {
  char* parse_error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &parse_error);
  if (parsed == nullptr) {
    if (parse_error != nullptr) PQfreemem(parse_error);
    throw std::runtime_error(
        "database.url is neither a valid libpq URI nor valid conninfo (check its quoting and "
        "percent-encoding; libpq's own message is not shown because it may quote the password)");
  }
  std::vector<std::string> secrets;
  for (const PQconninfoOption* o = parsed; o->keyword != nullptr; ++o) {
    const std::string_view key = o->keyword;
    if ((key == "password" || key == "sslpassword") && o->val != nullptr && *o->val != '\0') {
      secrets.emplace_back(o->val);
    }
  }
  PQconninfoFree(parsed);
  return secrets;
}

std::string scrubbed(std::string message, const std::vector<std::string>& secrets) {
  for (const auto& secret : secrets) {
    for (auto at = message.find(secret); at != std::string::npos; at = message.find(secret, at)) {
      message.replace(at, secret.size(), "****");
      at += 4;
    }
  }
  return message;
}

// One host at a time, as the pool does (pg/host_list.hpp): libpq's blocking connect
// would stop at the first server that answers with an error (a standby out of connection
// slots, say), never trying the primary listed after it.
ConnPtr connect_blocking(const std::string& conninfo, Millis connect_timeout) {
  const auto secrets = conninfo_secrets(conninfo);
  // libpq's connect_timeout is whole seconds (and at least 2 in effect); round up so a
  // sub-second setting still bounds the wait. It bounds each host, as in libpq.
  const auto seconds = std::max<long long>(1, (connect_timeout.count() + 999) / 1000);
  const std::string timeout = std::to_string(seconds);
  std::string parse_error;
  const auto attempts = pg::connect_attempts(conninfo, parse_error);
  if (attempts.empty()) {
    throw std::runtime_error("cannot connect to PostgreSQL: the connection string does not parse");
  }
  std::string messages;
  for (const auto& attempt : attempts) {
    std::vector<const char*> keys, values;
    for (const auto& [k, v] : attempt) {
      if (k == "connect_timeout" || k == "fallback_application_name") continue;
      keys.push_back(k.c_str());
      values.push_back(v.c_str());
    }
    keys.push_back("connect_timeout");
    values.push_back(timeout.c_str());
    keys.push_back("fallback_application_name");
    values.push_back("idemproxy-migrate");
    keys.push_back(nullptr);
    values.push_back(nullptr);
    ConnPtr conn(PQconnectdbParams(keys.data(), values.data(), 0));
    if (!conn) throw std::runtime_error("cannot connect to PostgreSQL: out of memory");
    if (PQstatus(conn.get()) == CONNECTION_OK) {
      // CREATE TABLE IF NOT EXISTS and friends raise NOTICEs that would go to stderr.
      PQsetNoticeProcessor(conn.get(), &discard_notice, nullptr);
      return conn;
    }
    if (!messages.empty()) messages += "; ";
    messages += scrubbed(trimmed_message(PQerrorMessage(conn.get())), secrets);
  }
  throw std::runtime_error("cannot connect to PostgreSQL: " + messages);
}

ResultPtr exec(PGconn* conn, const char* sql, const std::vector<std::string>& params = {},
               const std::string& what = {}) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p.c_str());
  // Without parameters, PQexec's simple protocol allows a migration file to hold many
  // statements; with parameters it must be one statement anyway.
  ResultPtr r(params.empty() ? PQexec(conn, sql)
                             : PQexecParams(conn, sql, static_cast<int>(values.size()),
                                            nullptr, values.data(), nullptr, nullptr, 0));
  const ExecStatusType st = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    const std::string msg =
        trimmed_message(r ? PQresultErrorMessage(r.get()) : PQerrorMessage(conn));
    throw std::runtime_error((what.empty() ? std::string("schema query failed")
                                           : what) + ": " + msg);
  }
  return r;
}

std::vector<std::pair<int, std::string>> read_applied(PGconn* conn) {
  auto r = exec(conn, kSchemaQuery, {}, "cannot read idemproxy_schema_migrations");
  std::vector<std::pair<int, std::string>> applied;
  for (int i = 0; i < PQntuples(r.get()); ++i) {
    applied.emplace_back(std::stoi(PQgetvalue(r.get(), i, 0)), PQgetvalue(r.get(), i, 1));
  }
  return applied;
}

std::string label(const EmbeddedMigration& m) {
  std::string v = std::to_string(m.version);
  if (v.size() < 4) v.insert(0, 4 - v.size(), '0');
  return v + "_" + std::string(m.name);
}

}  // namespace

std::string migration_checksum(const EmbeddedMigration& m) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(m.sql.data(), m.sql.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("SHA-256 failed");
  }
  return text::to_hex(digest, length);
}

SchemaCheck compare_schema(const std::vector<std::pair<int, std::string>>& applied) {
  std::map<int, const EmbeddedMigration*> known;
  for (const auto& m : embedded_migrations()) known.emplace(m.version, &m);

  SchemaCheck check;
  std::map<int, bool> seen;
  for (const auto& [version, checksum] : applied) {
    check.database_version = std::max(check.database_version, version);
    auto it = known.find(version);
    if (it == known.end()) {
      check.status = SchemaStatus::mismatch;
      check.detail = "the database has migration " + std::to_string(version) +
                     ", which this binary does not know (is a newer idemproxy deployed?)";
      return check;
    }
    if (migration_checksum(*it->second) != checksum) {
      check.status = SchemaStatus::mismatch;
      check.detail = "migration " + label(*it->second) +
                     " was changed after it was applied (checksum differs)";
      return check;
    }
    seen[version] = true;
  }
  std::string pending;
  for (const auto& [version, m] : known) {
    if (!seen.count(version)) pending += (pending.empty() ? "" : ", ") + label(*m);
  }
  if (pending.empty()) {
    check.status = SchemaStatus::current;
  } else {
    check.status = SchemaStatus::behind;
    check.detail = "pending migrations: " + pending;
  }
  return check;
}

MigrationReport apply_migrations(const std::string& conninfo, Millis connect_timeout) {
  ConnPtr conn = connect_blocking(conninfo, connect_timeout);
  PGconn* c = conn.get();

  // Held for the whole run, so a second migrator waits here and then finds nothing to
  // do. It is a session lock: if anything below throws, closing the connection frees it.
  // Taken before CREATE TABLE IF NOT EXISTS, which is not safe to race by itself (two
  // sessions can both decide to create and one fails on the catalog's unique index).
  exec(c, "SELECT pg_advisory_lock($1::bigint)", {kLockKey}, "cannot take the migration lock");
  exec(c, kCreateTableSql, {}, "cannot create idemproxy_schema_migrations");

  const auto applied = read_applied(c);
  const SchemaCheck before = compare_schema(applied);
  if (before.status == SchemaStatus::mismatch) {
    throw std::runtime_error("refusing to migrate: " + before.detail);
  }

  MigrationReport report;
  report.current_version = before.database_version;
  for (const auto& m : embedded_migrations()) {
    const bool done = std::any_of(applied.begin(), applied.end(),
                                  [&](const auto& a) { return a.first == m.version; });
    if (done) continue;
    // One transaction per migration: a failure leaves the schema at the previous
    // version, never half-applied, and the record commits with the change it describes.
    const std::string what = "migration " + label(m) + " failed";
    exec(c, "BEGIN", {}, what);
    try {
      exec(c, std::string(m.sql).c_str(), {}, what);
      exec(c,
           "INSERT INTO idemproxy_schema_migrations (version, name, checksum) "
           "VALUES ($1::integer, $2, $3)",
           {std::to_string(m.version), std::string(m.name), migration_checksum(m)}, what);
      exec(c, "COMMIT", {}, what);
    } catch (...) {
      PQclear(PQexec(c, "ROLLBACK"));
      throw;
    }
    report.applied.push_back(m.version);
    report.current_version = std::max(report.current_version, m.version);
  }
  exec(c, "SELECT pg_advisory_unlock($1::bigint)", {kLockKey}, "cannot release the migration lock");
  return report;
}

SchemaCheck check_schema(const std::string& conninfo, Millis connect_timeout) {
  ConnPtr conn = connect_blocking(conninfo, connect_timeout);
  auto exists = exec(conn.get(), "SELECT to_regclass('idemproxy_schema_migrations') IS NOT NULL",
                     {}, "cannot inspect the schema");
  if (std::string_view(PQgetvalue(exists.get(), 0, 0)) != "t") return compare_schema({});
  return compare_schema(read_applied(conn.get()));
}

}  // namespace idem::store
