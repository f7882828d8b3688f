// Contract migrations (`-- idemproxy:contract`, docs/operations.md "Upgrading"): what a
// release before their compatible-from still uses goes only when asked (`migrate
// --contract`), and then only while no replica of such a release is connected; a fresh
// database takes them at once. And the two step kinds the lean record brought: storage
// parameters (set on each leaf of a partitioned table) and a dropped index (a partitioned
// one in a moment of the lock). Real databases throughout.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "pg/pg_test_support.hpp"
#include "store/migration_script.hpp"
#include "store/migrations.hpp"

using namespace idem;
using namespace idem::store;

namespace {

constexpr Millis kConnect{5000};

// A session as a replica names itself (store::replica_application_name()).
test::Db session_named(const std::string& url, const std::string& application_name) {
  const char sep = url.find('?') == std::string::npos ? '?' : '&';
  std::string encoded;
  for (char c : application_name) encoded += c == ' ' ? std::string("%20") : c == '=' ? std::string("%3D") : std::string(1, c);
  return test::Db(url + sep + "application_name=" + encoded);
}

bool in_progress_index_exists(test::Db& db) {
  return db.scalar("SELECT to_regclass('idempotency_requests_in_progress_idx') IS NOT NULL") == "t";
}

const EmbeddedMigration& contract_migration() {
  for (const auto& m : embedded_migrations()) {
    if (parse_migration(m).contract) return m;
  }
  FAIL("no embedded contract migration");
  return embedded_migrations().back();
}

}  // namespace

TEST_CASE("contract migrations: held back by migrate, refused while an older replica is connected, then applied") {
  test::ScratchDatabase scratch("idem_contract");
  const auto& contract = contract_migration();
  const int compatible_from = parse_migration(contract).compatible_from;
  // The database as the previous release left it: every migration before the contract.
  std::vector<EmbeddedMigration> before;
  for (const auto& m : embedded_migrations()) {
    if (m.version < contract.version) before.push_back(m);
  }
  MigrateOptions options;
  options.connect_timeout = kConnect;
  options.migrations = &before;
  REQUIRE(apply_migrations(scratch.url(), options).applied.size() == before.size());
  test::Db db(scratch.url());
  REQUIRE(in_progress_index_exists(db));

  // `migrate` as a rollout runs it: the contract migration waits.
  std::vector<std::string> notes;
  MigrateOptions plain;
  plain.connect_timeout = kConnect;
  plain.on_event = [&](const MigrationEvent& e) { notes.push_back(e.detail); };
  auto report = apply_migrations(scratch.url(), plain);
  // The migrations after it that are not contracts (0010's fillfactor) go ahead.
  std::vector<int> later;
  for (const auto& m : embedded_migrations()) {
    if (m.version > contract.version && !parse_migration(m).contract) later.push_back(m.version);
  }
  CHECK(report.applied == later);
  CHECK(report.held_back == std::vector<int>{contract.version});
  CHECK(in_progress_index_exists(db));
  CHECK(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
    return n.find("migrate --contract") != std::string::npos;
  }));
  // This binary serves the database as it is, and says what is pending.
  const auto check = check_schema(scratch.url(), kConnect);
  CHECK(check.status == SchemaStatus::current);
  CHECK(check.contract_pending == std::vector<std::string>{migration_label(contract)});

  MigrateOptions with_contract;
  with_contract.connect_timeout = kConnect;
  with_contract.contract = true;
  // Replicas of releases that name no schema (before this one), a listener among them,
  // and replicas of a schema before the contract's compatible-from: each one refuses it.
  for (const std::string& name : {std::string("idemproxy"), std::string("idemproxy-listener"),
                                 "idemproxy schema=" + std::to_string(compatible_from - 1)}) {
    INFO(name);
    auto old_replica = session_named(scratch.url(), name);
    CHECK_THROWS_WITH_AS(apply_migrations(scratch.url(), with_contract),
                         doctest::Contains("refusing to apply contract migration"), std::runtime_error);
    CHECK(in_progress_index_exists(db));
  }
  // Sessions that are not replicas, or replicas new enough, do not hold it back.
  auto tool = session_named(scratch.url(), "idemproxy_reports");
  auto new_replica = session_named(scratch.url(), "idemproxy schema=" + std::to_string(compatible_from));
  auto new_listener =
      session_named(scratch.url(), "idemproxy-listener schema=" + std::to_string(contract.version));
  report = apply_migrations(scratch.url(), with_contract);
  CHECK(report.applied == std::vector<int>{contract.version});
  CHECK(report.held_back.empty());
  CHECK_FALSE(in_progress_index_exists(db));
  CHECK(check_schema(scratch.url(), kConnect).contract_pending.empty());
  // Run again: nothing to do.
  CHECK(apply_migrations(scratch.url(), with_contract).applied.empty());
}

TEST_CASE("contract migrations: a database migrated from nothing takes them at once") {
  test::ScratchDatabase scratch("idem_contract_fresh");
  const auto report = apply_migrations(scratch.url(), kConnect);
  CHECK(report.applied.size() == embedded_migrations().size());
  CHECK(report.held_back.empty());
  test::Db db(scratch.url());
  CHECK_FALSE(in_progress_index_exists(db));
  // And the lean record's room for HOT completions.
  CHECK(db.scalar("SELECT array_to_string(reloptions, ',') FROM pg_class"
                  " WHERE oid = 'idempotency_requests'::regclass")
            ->find("fillfactor=40") != std::string::npos);
}

TEST_CASE("migration steps: storage parameters and a dropped index on a partitioned table") {
  test::ScratchDatabase scratch("idem_steps_partitioned");
  const std::vector<EmbeddedMigration> list = {
      {1, "parted",
       "-- idemproxy:compatible-from 1\nSET lock_timeout = '100ms';\n"
       "-- idemproxy:step transaction\nBEGIN;\n"
       "CREATE TABLE parted (k text NOT NULL, v text) PARTITION BY HASH (k);\n"
       "CREATE TABLE parted_0 PARTITION OF parted FOR VALUES WITH (MODULUS 2, REMAINDER 0);\n"
       "CREATE TABLE parted_1 PARTITION OF parted FOR VALUES WITH (MODULUS 2, REMAINDER 1);\n"
       "CREATE TABLE plain (k text);\n"
       "CREATE INDEX parted_v_idx ON parted (v);\n"
       "CREATE INDEX plain_k_idx ON plain (k);\n"
       "COMMIT;\n"},
      {2, "storage",
       "-- idemproxy:compatible-from 1\nSET lock_timeout = '100ms';\n"
       "-- idemproxy:step storage parted\nALTER TABLE parted SET (fillfactor = 70);\n"
       "-- idemproxy:step storage plain\nALTER TABLE plain SET (fillfactor = 80);\n"},
      {3, "drops",
       "-- idemproxy:compatible-from 2\n-- idemproxy:contract\nSET lock_timeout = '100ms';\n"
       "-- idemproxy:step drop-index parted_v_idx\nDROP INDEX CONCURRENTLY IF EXISTS parted_v_idx;\n"
       "-- idemproxy:step drop-index plain_k_idx\nDROP INDEX CONCURRENTLY IF EXISTS plain_k_idx;\n"},
  };
  MigrateOptions options;
  options.connect_timeout = kConnect;
  options.migrations = &list;
  std::vector<std::string> notes;
  options.on_event = [&](const MigrationEvent& e) {
    if (e.kind == MigrationEvent::Kind::note) notes.push_back(e.detail);
  };
  // Up to 2 first, so that the contract is not taken as part of a fresh database's run.
  const std::vector<EmbeddedMigration> first(list.begin(), list.begin() + 2);
  options.migrations = &first;
  REQUIRE(apply_migrations(scratch.url(), options).applied == std::vector<int>{1, 2});
  test::Db db(scratch.url());
  auto options_of = [&](const char* table) {
    return db.scalar("SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class WHERE relname = $1",
                     {table})
        .value_or("?");
  };
  CHECK(options_of("parted_0") == "fillfactor=70");
  CHECK(options_of("parted_1") == "fillfactor=70");
  CHECK(options_of("parted") == "");
  CHECK(options_of("plain") == "fillfactor=80");
  CHECK(std::any_of(notes.begin(), notes.end(),
                    [](const std::string& n) { return n.find("each leaf partition") != std::string::npos; }));

  options.migrations = &list;
  options.contract = true;
  REQUIRE(apply_migrations(scratch.url(), options).applied == std::vector<int>{3});
  CHECK(db.scalar("SELECT count(*) FROM pg_class WHERE relname IN ('parted_v_idx', 'plain_k_idx')"
                  " OR relname LIKE 'parted\\__\\_v\\_idx'") == "0");
  CHECK(db.scalar_int("SELECT count(*) FROM pg_indexes WHERE tablename LIKE 'parted%' OR tablename = 'plain'") == 0);
}
