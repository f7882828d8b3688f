// The migrator against fresh databases: idempotent, serialized between concurrent
// migrators, and refusing a database that does not match this binary.
#include <doctest/doctest.h>

#include <future>
#include <thread>

#include "pg/pg_test_support.hpp"
#include "store/migrations.hpp"

using namespace idem;
using namespace idem::store;

namespace {

constexpr Millis kConnect{5000};

int latest_version() { return embedded_migrations().back().version; }

std::vector<int> all_versions() {
  std::vector<int> v;
  for (const auto& m : embedded_migrations()) v.push_back(m.version);
  return v;
}

}  // namespace

TEST_CASE("embedded migrations are ordered and checksummed with SHA-256") {
  const auto& all = embedded_migrations();
  REQUIRE_FALSE(all.empty());
  CHECK(all.front().version == 1);
  CHECK(all.front().name == "idempotency_requests");
  CHECK(all.front().sql.find("CREATE TABLE IF NOT EXISTS idempotency_requests") != std::string_view::npos);
  for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i - 1].version < all[i].version);

  // The SHA-256 test vector for "abc".
  CHECK(migration_checksum({1, "x", "abc"}) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(migration_checksum(all.front()).size() == 64);
}

TEST_CASE("compare_schema: current, behind and mismatch") {
  std::vector<AppliedMigration> applied;
  auto none = compare_schema(applied);
  CHECK(none.status == SchemaStatus::behind);
  CHECK(none.database_version == 0);
  CHECK(none.detail.find("0001_idempotency_requests") != std::string::npos);

  for (const auto& m : embedded_migrations()) {
    applied.push_back({m.version, migration_checksum(m), m.version, std::string(m.name)});
  }
  auto current = compare_schema(applied);
  CHECK(current.status == SchemaStatus::current);
  CHECK(current.database_version == latest_version());

  auto changed = applied;
  changed.front().checksum = "0000";
  CHECK(compare_schema(changed).status == SchemaStatus::mismatch);

  // A newer migration recorded without compatible_from (a release before the rule):
  // only a binary that embeds it may serve.
  auto newer = applied;
  newer.push_back({latest_version() + 1, "feed", std::nullopt, "from_the_future"});
  auto n = compare_schema(newer);
  CHECK(n.status == SchemaStatus::incompatible);
  CHECK(n.database_version == latest_version() + 1);
}

TEST_CASE("apply_migrations: applies once, then finds nothing to do") {
  test::ScratchDatabase db("idem_migrate_test");
  CHECK(check_schema(db.url(), kConnect).status == SchemaStatus::behind);

  auto first = apply_migrations(db.url(), kConnect);
  CHECK(first.applied == all_versions());
  CHECK(first.current_version == latest_version());
  auto check = check_schema(db.url(), kConnect);
  CHECK(check.status == SchemaStatus::current);
  CHECK(check.database_version == latest_version());

  auto second = apply_migrations(db.url(), kConnect);
  CHECK(second.applied.empty());
  CHECK(second.current_version == latest_version());

  test::Db sql(db.url());
  auto rows = sql.query("SELECT version, name, checksum, applied_at IS NOT NULL"
                       " FROM idemproxy_schema_migrations ORDER BY version");
  REQUIRE(rows.size() == embedded_migrations().size());
  CHECK(rows[0][0] == "1");
  CHECK(rows[0][1] == "idempotency_requests");
  CHECK(rows[0][2] == migration_checksum(embedded_migrations().front()));
  CHECK(rows[0][3] == "t");
  // The schema itself is there, with its two indexes: the primary key and expires_at for
  // retention. A database migrated from nothing takes the contract migration 0009 too: no
  // partial in-progress index, whose predicate would keep every completion from being HOT.
  CHECK(sql.scalar("SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes"
                   " WHERE tablename = 'idempotency_requests'") ==
        "idempotency_requests_expires_at_idx,idempotency_requests_pkey");
}

TEST_CASE("apply_migrations: concurrent migrators serialize; each migration runs once") {
  test::ScratchDatabase db("idem_migrate_test");
  std::promise<void> go;
  auto start = go.get_future().share();
  auto migrate = [&] {
    start.wait();
    return apply_migrations(db.url(), kConnect);
  };
  auto a = std::async(std::launch::async, migrate);
  auto b = std::async(std::launch::async, migrate);
  go.set_value();
  const auto ra = a.get();
  const auto rb = b.get();
  // One of them did the work, the other waited on the lock and found it done.
  CHECK(ra.applied.size() + rb.applied.size() == embedded_migrations().size());
  CHECK((ra.applied.empty() || rb.applied.empty()));
  CHECK(ra.current_version == latest_version());
  CHECK(rb.current_version == latest_version());
  test::Db sql(db.url());
  CHECK(sql.scalar("SELECT count(*) FROM idemproxy_schema_migrations") ==
        std::to_string(embedded_migrations().size()));
}

TEST_CASE("apply_migrations: a changed checksum is refused") {
  test::ScratchDatabase db("idem_migrate_test");
  apply_migrations(db.url(), kConnect);
  test::Db sql(db.url());
  sql.exec("UPDATE idemproxy_schema_migrations SET checksum = 'tampered' WHERE version = 1");
  CHECK_THROWS_WITH_AS(apply_migrations(db.url(), kConnect),
                       doctest::Contains("checksum"), std::runtime_error);
  auto check = check_schema(db.url(), kConnect);
  CHECK(check.status == SchemaStatus::mismatch);
  CHECK(check.detail.find("0001_idempotency_requests") != std::string::npos);
}

TEST_CASE("apply_migrations: a newer version is served when it allows this binary, refused otherwise") {
  test::ScratchDatabase db("idem_migrate_test");
  apply_migrations(db.url(), kConnect);
  test::Db sql(db.url());
  sql.exec("INSERT INTO idemproxy_schema_migrations (version, name, checksum, compatible_from)"
           " VALUES (9998, 'add_a_column', 'x', $1)", {latest_version()});
  auto compatible = apply_migrations(db.url(), kConnect);
  CHECK(compatible.applied.empty());
  CHECK(compatible.current_version == 9998);
  auto check = check_schema(db.url(), kConnect);
  CHECK(check.status == SchemaStatus::newer_compatible);
  CHECK(check.required_version == latest_version());

  sql.exec("INSERT INTO idemproxy_schema_migrations (version, name, checksum, compatible_from)"
           " VALUES (9999, 'drop_a_column', 'x', 9999)");
  CHECK_THROWS_WITH_AS(apply_migrations(db.url(), kConnect), doctest::Contains("9999_drop_a_column"),
                       std::runtime_error);
  check = check_schema(db.url(), kConnect);
  CHECK(check.status == SchemaStatus::incompatible);
  CHECK(check.database_version == 9999);
  CHECK(check.required_version == 9999);
}

TEST_CASE("kSchemaQuery reads what compare_schema needs") {
  test::ScratchDatabase db("idem_migrate_test");
  apply_migrations(db.url(), kConnect);
  test::Db sql(db.url());
  std::vector<AppliedMigration> applied;
  for (const auto& row : sql.query(kSchemaQuery)) {
    applied.push_back({std::stoi(*row[0]), *row[1], std::stoi(*row[2]), *row[3]});
  }
  CHECK(compare_schema(applied).status == SchemaStatus::current);
  // The same query runs on the table of a release before the rule (no compatible_from).
  test::ScratchDatabase legacy("idem_migrate_test");
  test::Db old(legacy.url());
  old.exec("CREATE TABLE idemproxy_schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
           " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())");
  old.exec("INSERT INTO idemproxy_schema_migrations (version, name, checksum) VALUES (1, 'a', 'b')");
  const auto rows = old.query(kSchemaQuery);
  REQUIRE(rows.size() == 1);
  CHECK_FALSE(rows[0][2].has_value());
}

TEST_CASE("apply_migrations: a multi-host list gets past a server that refuses the startup") {
  // A standby first in the list that refuses sessions (out of connection slots);
  // libpq's own list handling would stop there.
  test::FatalServer starting;
  test::ScratchDatabase db("idem_migrate_multi");
  const std::string url = db.url();
  const auto authority = url.find("@") + 1;
  const std::string multi = url.substr(0, authority) + "127.0.0.1:" +
                            std::to_string(starting.port()) + "," + url.substr(authority) +
                            (url.find('?') == std::string::npos ? "?" : "&") +
                            "sslmode=disable&gssencmode=disable&target_session_attrs=read-write";
  const auto report = apply_migrations(multi, kConnect);
  CHECK(report.current_version == latest_version());
  CHECK(starting.answered() == 1);
  CHECK(check_schema(multi, kConnect).status == SchemaStatus::current);
}

TEST_CASE("an unreachable database throws") {
  CHECK_THROWS_AS(check_schema("host=127.0.0.1 port=1 user=postgres dbname=x", Millis{1000}),
                  std::runtime_error);
  CHECK_THROWS_AS(apply_migrations("host=127.0.0.1 port=1 user=postgres dbname=x", Millis{1000}),
                  std::runtime_error);
}

TEST_CASE("connection errors never quote the password") {
  auto message_of = [](const std::string& url) {
    try {
      check_schema(url, Millis{1000});
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    FAIL("check_schema did not throw");
    return std::string();
  };
  // libpq's own parser would quote the malformed escape, password and all.
  const auto bad_uri = message_of("postgresql://u:pa%zzS3CRET@127.0.0.1:1/db");
  CHECK(bad_uri.find("S3CRET") == std::string::npos);
  CHECK(bad_uri.find("database.url") != std::string::npos);
  const auto bad_conninfo = message_of("host=127.0.0.1 port=1 password=S3CRET dbname");
  CHECK(bad_conninfo.find("S3CRET") == std::string::npos);
  const auto refused = message_of("host=127.0.0.1 port=1 user=postgres password=S3CRET dbname=x");
  CHECK(refused.find("S3CRET") == std::string::npos);
  CHECK(refused.find("cannot connect to PostgreSQL") != std::string::npos);
}
