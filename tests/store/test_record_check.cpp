// Migration 0012: the record table has no CHECK constraint. PostgreSQL 15 prepared 0011's
// one anew for every statement that wrote the table, a fifth of a small write cycle's
// instructions (docs/performance.md, "No CHECK on the record"). What it refused, the store
// now refuses when it reads it. So: the migrated table has no CHECK; each kind of broken
// record the constraint refused, written by hand, is answered as a store error by read()
// and by a claim of its key, and left as it was; whole records, with and without a trace
// id, read back; and a table partitioned at schema 11 takes 0012 on every partition.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "store/harness.hpp"
#include "store/migration_script.hpp"
#include "store/migrations.hpp"

using namespace idem;
using idem::test::store_database;

namespace {

std::int64_t checks_of(test::Db& db, const std::string& table) {
  return db.scalar_int("SELECT count(*) FROM pg_constraint WHERE contype = 'c' AND conrelid = $1::regclass",
                       {table});
}

store::RecordId id_of(const std::string& key) { return {"record-check", "POST /orders", key}; }

// A record of this test's tenant written by hand: state, then attempt_token,
// lease_expires_at, response_status, completed_at and trace_id as SQL, in that order.
void write_by_hand(test::Db& db, const std::string& key, const std::string& state,
                   const std::string& columns) {
  db.exec("INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint,"
          " state, attempt_token, lease_expires_at, response_status, completed_at, trace_id, created_at,"
          " expires_at) VALUES ('record-check', 'POST /orders', $1, 'f', $2, " +
              columns + ", now(), now() + interval '1 day')",
          {key, state});
}

}  // namespace

TEST_CASE("the record table has no CHECK, and the store refuses each broken record it reads") {
  test::PgHarness h;
  test::Db& db = h.sql();
  CHECK(checks_of(db, "idempotency_requests") == 0);

  // Whole records: what the store's writers write.
  write_by_hand(db, "whole-claim", "in_progress", "1, now() + interval '30 s', NULL, NULL, NULL");
  write_by_hand(db, "whole-done", "completed", "2, NULL, 201, now(), '4bf92f3577b34da6a3ce929d0e0e4736'");
  write_by_hand(db, "whole-untraced", "completed", "1, NULL, 201, now(), NULL");
  const auto claim = h.run(h.store().read(id_of("whole-claim")));
  REQUIRE(claim.has_value());
  REQUIRE(claim->has_value());
  CHECK((*claim)->state == store::State::in_progress);
  const auto done = h.run(h.store().read(id_of("whole-done")));
  REQUIRE(done.has_value());
  REQUIRE(done->has_value());
  REQUIRE((*done)->response.has_value());
  CHECK((*done)->response->trace_id == "4bf92f3577b34da6a3ce929d0e0e4736");
  const auto untraced = h.run(h.store().read(id_of("whole-untraced")));
  REQUIRE(untraced.has_value());
  REQUIRE(untraced->has_value());
  CHECK((*untraced)->response->trace_id.empty());

  // Each kind of record 0011's constraint refused, now written and refused on reading.
  const std::vector<std::pair<std::string, std::pair<std::string, std::string>>> broken = {
      {"state", {"expired", "1, now() + interval '30 s', 201, now(), NULL"}},
      {"state-case", {"Completed", "1, NULL, 201, now(), NULL"}},
      {"attempt-zero", {"in_progress", "0, now() + interval '30 s', NULL, NULL, NULL"}},
      {"attempt-negative", {"completed", "-1, NULL, 201, now(), NULL"}},
      {"no-lease", {"in_progress", "1, NULL, NULL, NULL, NULL"}},
      {"no-status", {"completed", "1, NULL, NULL, now(), NULL"}},
      {"no-completed-at", {"completed", "1, NULL, 201, NULL, NULL"}},
      {"trace-upper", {"completed", "1, NULL, 201, now(), '4BF92F3577B34DA6A3CE929D0E0E4736'"}},
      {"trace-short", {"completed", "1, NULL, 201, now(), '4bf92f3577b34da6a3ce929d0e0e473'"}},
      {"trace-newline", {"completed", "1, NULL, 201, now(), E'4bf92f3577b34da6a3ce929d0e0e473\\n'"}},
      {"trace-header", {"completed", "1, NULL, 201, now(), E'4bf92f3577b34da6\\r\\nSet-Cookie: a=b'"}},
      {"trace-multibyte", {"completed", "1, NULL, 201, now(), '4bf92f3577b34da6a3ce929d0e0e47é'"}},
      {"trace-empty", {"completed", "1, NULL, 201, now(), ''"}},
  };
  for (const auto& [key, shape] : broken) {
    INFO(key);
    write_by_hand(db, key, shape.first, shape.second);
    const std::string before = h.snapshot(id_of(key));
    const auto read = h.run(h.store().read(id_of(key)));
    REQUIRE_FALSE(read.has_value());
    CHECK(read.error() == errc::store_protocol);
    store::ClaimRequest req;
    req.id = id_of(key);
    req.fingerprint = "f";
    // A claim never wins the key: it fails on the row it read with it, or leaves the
    // reading to read() (above).
    const auto claimed = h.run(h.store().claim(req));
    if (claimed.has_value()) {
      CHECK_FALSE(claimed->won);
      CHECK_FALSE(claimed->row_read);
    } else {
      CHECK(claimed.error() == errc::store_protocol);
    }
    CHECK(h.snapshot(id_of(key)) == before);
  }
  CHECK(db.scalar_int("SELECT count(*) FROM idempotency_requests WHERE tenant_id = 'record-check'") ==
        static_cast<std::int64_t>(3 + broken.size()));
}

#ifdef IDEM_PARTITION_SCRIPT
TEST_CASE("a table partitioned at schema 11 takes 0012 on every partition") {
  test::ScratchDatabase scratch("idem_record_check_parted");
  std::vector<store::EmbeddedMigration> up_to_11;
  for (const auto& m : store::embedded_migrations()) {
    if (m.version <= 11) up_to_11.push_back(m);
  }
  store::MigrateOptions options;
  options.connect_timeout = Millis{5000};
  options.migrations = &up_to_11;
  REQUIRE(store::apply_migrations(scratch.url(), options).applied.size() == up_to_11.size());
  const std::string cmd = "PGOPTIONS='-c idemproxy.partitions=3 -c client_min_messages=warning' psql '" + scratch.url() +
                          "' -X -q -v ON_ERROR_STOP=1 -f '" IDEM_PARTITION_SCRIPT "' >/dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  test::Db db(scratch.url());
  int tables = 0;
  for (const auto& row : db.query("SELECT relid::regclass::text FROM pg_partition_tree('idempotency_requests')")) {
    CHECK(checks_of(db, row[0].value_or("")) == 1);
    ++tables;
  }
  REQUIRE(tables == 4);

  store::MigrateOptions rest;
  rest.connect_timeout = Millis{5000};
  CHECK(store::apply_migrations(scratch.url(), rest).applied == std::vector<int>{12});
  for (const auto& row : db.query("SELECT relid::regclass::text FROM pg_partition_tree('idempotency_requests')")) {
    INFO(row[0].value_or(""));
    CHECK(checks_of(db, row[0].value_or("")) == 0);
  }
  // What the constraint refused goes in now (the store refuses it when it reads it).
  write_by_hand(db, "parted", "in_progress", "1, NULL, NULL, NULL, NULL");
  CHECK(db.scalar_int("SELECT count(*) FROM idempotency_requests WHERE tenant_id = 'record-check'") == 1);
}
#endif
