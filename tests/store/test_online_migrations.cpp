// The online migrator against real databases: the first texts of the rewritten migrations
// (tests/store/legacy_migrations/, exactly as releases before 0.2.0 recorded them) and the
// online ones build the same schema; a database at schema 2 with rows reaches the current
// schema while a writer of that release keeps writing, also past a long transaction that
// holds a conflicting lock; an interrupted concurrent index build is rebuilt.
#include <doctest/doctest.h>

#include <atomic>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "pg/pg_test_support.hpp"
#include "store/blocking_pg.hpp"
#include "store/migrations.hpp"

using namespace idem;
using namespace idem::store;

namespace {

constexpr Millis kConnect{5000};

std::string legacy_text(int version) {
  static const char* const names[] = {"",
                                      "0001_idempotency_requests.sql",
                                      "0002_record_change_notifications.sql",
                                      "0003_fencing_tokens.sql",
                                      "0004_backend_completion.sql",
                                      "0005_operation_status.sql",
                                      "0006_trace_id.sql"};
  std::ifstream in(std::string(IDEM_LEGACY_MIGRATIONS_DIR) + "/" + names[version], std::ios::binary);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What the migrator of a release before 0.2.0 did: each file in one transaction, recorded
// with its checksum in the table of that time (no compatible_from, no release).
// (A file holds several statements: the simple protocol, as that migrator sent them.)
void apply_legacy(const std::string& url, int up_to) {
  auto conn = connect_blocking(url, kConnect);
  PGconn* c = conn.get();
  exec(c, "CREATE TABLE idemproxy_schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
          " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())");
  for (int v = 1; v <= up_to; ++v) {
    const auto sql = legacy_text(v);
    const auto& m = embedded_migrations()[static_cast<std::size_t>(v - 1)];
    exec(c, "BEGIN");
    exec(c, sql.c_str());
    exec(c, "INSERT INTO idemproxy_schema_migrations (version, name, checksum) VALUES ($1::integer, $2, $3)",
         {std::to_string(v), std::string(m.name), migration_checksum({v, m.name, sql})});
    exec(c, "COMMIT");
  }
}

// The schema as a set of lines: columns, constraints, indexes, triggers, functions.
std::set<std::string> schema_of(test::Db& db) {
  std::set<std::string> out;
  const char* const queries[] = {
      "SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||"
      " CASE WHEN a.attnotnull THEN ' not null' ELSE '' END ||"
      " coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')"
      " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
      " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
      " WHERE c.relname IN ('idempotency_requests', 'idempotency_operations')"
      " AND a.attnum > 0 AND NOT a.attisdropped",
      "SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid) || ' ' ||"
      " convalidated FROM pg_constraint WHERE conrelid IN"
      " ('idempotency_requests'::regclass, 'idempotency_operations'::regclass)",
      "SELECT indexdef FROM pg_indexes WHERE tablename IN ('idempotency_requests', 'idempotency_operations')",
      "SELECT tgname || ' ' || pg_get_triggerdef(oid) FROM pg_trigger"
      " WHERE tgrelid = 'idempotency_requests'::regclass AND NOT tgisinternal",
      "SELECT proname || ' ' || md5(prosrc) || ' ' || pg_get_function_identity_arguments(oid)"
      " FROM pg_proc WHERE proname LIKE 'idemproxy_%'",
      "SELECT c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '') FROM pg_class c"
      " WHERE c.relname IN ('idempotency_requests', 'idempotency_fencing_tokens')",
  };
  for (const char* q : queries) {
    for (const auto& row : db.query(q)) out.insert(*row[0]);
  }
  return out;
}

// A writer of the schema-2 release: claims without naming fencing_token, completes
// rows, each statement bounded by 1 s as its statement_timeout would bound it.
struct OldWriter {
  explicit OldWriter(const std::string& url) : url_(url) {}

  void start() {
    thread_ = std::thread([this] {
      test::Db db(url_);
      db.exec("SET statement_timeout = '1s'");
      for (int i = 0; !stop_.load(); ++i) {
        try {
          db.exec("INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key,"
                  " request_fingerprint, state, attempt_token, lease_expires_at, created_at, expires_at)"
                  " VALUES ('t', 'POST /orders', $1, 'f', 'in_progress', 1, now() + interval '30s',"
                  " now(), now() + interval '1 day')",
                  {"writer-" + std::to_string(i)});
          // The completion of an old row: a new row version the backfill may have passed.
          db.exec("UPDATE idempotency_requests SET state = 'completed', response_status = 201,"
                  " completed_at = now(), lease_expires_at = NULL"
                  " WHERE tenant_id = 't' AND endpoint = 'POST /orders' AND idempotency_key = $1",
                  {"old-" + std::to_string(i % 5000)});
          ++ok_;
        } catch (const std::exception& e) {
          ++failed_;
          last_error_ = e.what();
        }
      }
    });
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  ~OldWriter() { stop(); }

  std::string url_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0};
  std::atomic<int> failed_{0};
  std::string last_error_;
};

void fill_at_schema_2(test::Db& db, int rows) {
  db.exec("INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key,"
          " request_fingerprint, state, attempt_token, lease_expires_at, created_at, expires_at)"
          " SELECT 't', 'POST /orders', 'old-' || g, md5(g::text), 'in_progress', 1,"
          " now() + interval '30s', now(), now() + interval '1 day' FROM generate_series(0, $1 - 1) g",
          {rows});
}

}  // namespace

TEST_CASE("online migrations: a database migrated by the first texts is current, with the same schema") {
  test::ScratchDatabase legacy("idem_online_legacy");
  apply_legacy(legacy.url(), 6);
  test::Db old_db(legacy.url());
  // Their checksums count as applied: only the migrations after 0006 are pending.
  auto check = check_schema(legacy.url(), kConnect);
  INFO(check.detail);
  CHECK(check.status == SchemaStatus::behind);
  CHECK(check.detail.find("0006") == std::string::npos);
  CHECK(check.detail.find("0001") == std::string::npos);
  // migrate applies only those, and gives the table of that time its new columns.
  MigrateOptions with_contract;
  with_contract.connect_timeout = kConnect;
  with_contract.contract = true;  // nothing of an older release is connected here
  const auto later = apply_migrations(legacy.url(), with_contract).applied;
  CHECK_FALSE(later.empty());
  CHECK(later.front() == 7);
  CHECK(old_db.scalar_int("SELECT count(*) FROM information_schema.columns WHERE"
                          " table_name = 'idemproxy_schema_migrations' AND column_name IN"
                          " ('compatible_from', 'release')") == 2);

  test::ScratchDatabase fresh("idem_online_fresh");
  apply_migrations(fresh.url(), kConnect);
  test::Db new_db(fresh.url());
  const auto a = schema_of(old_db);
  const auto b = schema_of(new_db);
  for (const auto& line : a) {
    INFO(line);
    CHECK(b.count(line) == 1);
  }
  for (const auto& line : b) {
    INFO(line);
    CHECK(a.count(line) == 1);
  }
  CHECK(a.size() > 30);
}

TEST_CASE("online migrations: from schema 2 with rows, past a long transaction, a schema-2 writer never waits") {
  test::ScratchDatabase scratch("idem_online_from2");
  apply_legacy(scratch.url(), 2);
  test::Db db(scratch.url());
  fill_at_schema_2(db, 20000);

  // A report that keeps a transaction open on the table: an ALTER TABLE queued behind it
  // without a lock_timeout would queue every claim behind itself.
  test::Db report(scratch.url());
  report.exec("BEGIN");
  report.exec("SELECT count(*) FROM idempotency_requests");

  OldWriter writer(scratch.url());
  writer.start();
  std::atomic<int> retries{0};
  std::atomic<int> writes_while_waiting{-1};
  // A migrator that waited without a lock_timeout would never see a retry: the report
  // ends after 10 s anyway, so such a migrator finishes (and the writer's timeouts fail
  // the test) instead of hanging it.
  std::mutex report_mutex;
  bool report_open = true;
  const auto end_report = [&] {
    std::lock_guard lock(report_mutex);
    if (report_open) report.exec("COMMIT");
    report_open = false;
  };
  std::promise<void> done;
  std::thread watchdog([&, f = done.get_future()] {
    if (f.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) end_report();
  });
  MigrateOptions options;
  options.connect_timeout = kConnect;
  options.on_event = [&](const MigrationEvent& e) {
    if (e.kind != MigrationEvent::Kind::step_retry) return;
    // After a few refused attempts, the writer has kept going: end the report.
    if (++retries == 5) {
      const int before = writer.ok_.load();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      writes_while_waiting = writer.ok_.load() - before;
      end_report();
    }
  };
  const auto result = apply_migrations(scratch.url(), options);
  done.set_value();
  watchdog.join();
  writer.stop();
  INFO(writer.last_error_);
  CHECK(writer.failed_.load() == 0);
  CHECK(writer.ok_.load() > 0);
  CHECK(retries.load() >= 5);
  CHECK(writes_while_waiting.load() > 0);
  CHECK(result.applied.front() == 3);
  CHECK(result.applied.size() == embedded_migrations().size() - 3 /* 0009 (contract) held back */);
  CHECK(check_schema(scratch.url(), kConnect).status == SchemaStatus::current);

  // Every row, the writer's included, has a token of its own, and the column is NOT NULL
  // with its default, as the first text made it.
  CHECK(db.scalar_int("SELECT count(*) FROM idempotency_requests WHERE fencing_token IS NULL") == 0);
  CHECK(db.scalar_int("SELECT count(*) - count(DISTINCT fencing_token) FROM idempotency_requests") == 0);
  CHECK(db.scalar_int("SELECT count(*) FROM idempotency_requests") >= 20000 + writer.ok_.load());
  CHECK(db.scalar("SELECT attnotnull FROM pg_attribute WHERE attrelid = 'idempotency_requests'::regclass"
                  " AND attname = 'fencing_token'") == "t");
  CHECK(db.scalar_int("SELECT count(*) FROM pg_constraint WHERE conname ="
                      " 'idempotency_requests_fencing_token_not_null'") == 0);
  // 0006's trace_id CHECK and 0001's four went into 0011's one, which 0012 dropped (the
  // store checks what it reads: tests/store/test_record_check.cpp).
  CHECK(db.scalar_int("SELECT count(*) FROM pg_constraint WHERE contype = 'c' AND"
                      " conrelid = 'idempotency_requests'::regclass") == 0);
}

TEST_CASE("online migrations: a step gives up after lock_wait and names the transaction it waited for") {
  test::ScratchDatabase scratch("idem_online_giveup");
  apply_legacy(scratch.url(), 2);
  test::Db db(scratch.url());
  test::Db report(scratch.url());
  report.exec("SET application_name = 'nightly-report'");
  report.exec("BEGIN");
  report.exec("SELECT count(*) FROM idempotency_requests");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // older than 1 s, as reported
  MigrateOptions options;
  options.connect_timeout = kConnect;
  options.lock_wait = Millis{800};
  CHECK_THROWS_WITH_AS(apply_migrations(scratch.url(), options),
                       doctest::Contains("nightly-report"), std::runtime_error);
  report.exec("ROLLBACK");
  // Nothing of the step was kept; the next run finishes the job.
  CHECK(db.scalar_int("SELECT count(*) FROM idemproxy_schema_migrations") == 2);
  CHECK(apply_migrations(scratch.url(), kConnect).applied.size() == embedded_migrations().size() - 3 /* 0009 (contract) held back */);
}

TEST_CASE("online migrations: an INVALID index left by an interrupted build is dropped and built again") {
  test::ScratchDatabase scratch("idem_online_index");
  apply_migrations(scratch.url(), kConnect);
  test::Db db(scratch.url());
  db.exec("INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint,"
          " state, attempt_token, lease_expires_at, created_at, expires_at, fencing_token)"
          " SELECT 't', 'e', 'k' || g, 'same', 'in_progress', 1, now(), now(), now(), g"
          " FROM generate_series(1, 3) g");
  static const std::string sql =
      "-- idemproxy:compatible-from 6\nSET lock_timeout = '100ms';\n"
      "-- idemproxy:step index idempotency_requests_fp_unique\n"
      "SET lock_timeout = '1min';\n"
      "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS idempotency_requests_fp_unique"
      " ON idempotency_requests (request_fingerprint);\n";
  auto list = embedded_migrations();
  list.push_back({list.back().version + 1, "unique_fingerprint", sql});
  MigrateOptions options;
  options.connect_timeout = kConnect;
  options.migrations = &list;
  std::vector<std::string> notes;
  options.on_event = [&](const MigrationEvent& e) {
    if (e.kind == MigrationEvent::Kind::note) notes.push_back(e.detail);
  };
  // Duplicates make the concurrent build fail half-way: an INVALID index stays behind.
  CHECK_THROWS_WITH_AS(apply_migrations(scratch.url(), options), doctest::Contains("INVALID"),
                       std::runtime_error);
  CHECK(db.scalar("SELECT indisvalid FROM pg_index WHERE indexrelid ="
                  " to_regclass('idempotency_requests_fp_unique')") == "f");
  db.exec("UPDATE idempotency_requests SET request_fingerprint = idempotency_key");
  const auto r = apply_migrations(scratch.url(), options);
  CHECK(r.applied == std::vector<int>{list.back().version});
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("INVALID") != std::string::npos);
  CHECK(db.scalar("SELECT indisvalid FROM pg_index WHERE indexrelid ="
                  " to_regclass('idempotency_requests_fp_unique')") == "t");
}

TEST_CASE("online migrations: the fencing-token backfill announces no record change") {
  test::ScratchDatabase scratch("idem_online_quiet");
  apply_legacy(scratch.url(), 2);
  test::Db db(scratch.url());
  // Completed, unexpired records: migration 0002's trigger announces any change to them.
  db.exec("INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint,"
          " state, attempt_token, response_status, response_headers, response_body, created_at,"
          " completed_at, expires_at) SELECT 't', 'e', 'k' || g, 'f', 'completed', 1, 201, '[]', '\\x',"
          " now(), now(), now() + interval '1 day' FROM generate_series(1, 2000) g");
  auto listener = connect_blocking(scratch.url(), kConnect);
  exec(listener.get(), "LISTEN idemproxy_records");
  REQUIRE(apply_migrations(scratch.url(), kConnect).applied.size() == embedded_migrations().size() - 3 /* 0009 (contract) held back */);
  CHECK(db.scalar_int("SELECT count(*) FROM idempotency_requests WHERE fencing_token IS NULL") == 0);
  // A change that matters is still announced (the trigger is there, and fires).
  db.exec("DELETE FROM idempotency_requests WHERE idempotency_key = 'k1'");
  int announced = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool saw_delete = false;
  while (!saw_delete && std::chrono::steady_clock::now() < until) {
    exec(listener.get(), "SELECT 1");  // reads what the server sent meanwhile
    while (PGnotify* n = PQnotifies(listener.get())) {
      ++announced;
      saw_delete = saw_delete || std::string(n->extra) == db.scalar("SELECT idemproxy_operation_id('t', 'e', 'k1')");
      PQfreemem(n);
    }
  }
  CHECK(saw_delete);
  CHECK(announced == 1);
}
