#pragma once
// The two Store implementations behind one test interface, so the conformance suite
// (conformance.cpp) runs every case against both:
//   * MemoryHarness: MemoryStore with a fake clock that advance() moves;
//   * PgHarness: PgStore on a private, migrated database. advance(d) shifts every stored
//     timestamp d into the past, which to now() is exactly the clock moving forward by d;
//     no test waits for real time to pass.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

#include <boost/asio/io_context.hpp>

#include "pg/pg_test_support.hpp"
#include "pg/pool.hpp"
#include "store/memory_store.hpp"
#include "store/migrations.hpp"
#include "store/pg_store.hpp"

namespace idem::test {

// Every stored field of a record except lease_remaining (derived from now). Equal
// snapshots = an unchanged row.
inline std::string describe(const std::optional<store::Record>& rec) {
  if (!rec) return "<no row>";
  std::ostringstream os;
  os << "fp=" << rec->fingerprint << " principal=" << rec->principal
     << " state=" << (rec->state == store::State::completed ? "completed" : "in_progress")
     << " attempt=" << rec->attempt << " created=" << rec->created_at_us
     << " completed=" << rec->completed_at_us << " expires=" << rec->expires_at_us
     << " lease=" << rec->lease_expires_at_us;
  if (rec->response) {
    const auto& r = *rec->response;
    os << " status=" << r.status << " omitted=" << r.body_omitted << " resource=" << r.resource_id
       << " body=" << r.body.size() << ":" << r.body << " headers=";
    for (const auto& h : r.headers) os << "[" << h.name << "|" << h.value << "]";
  }
  return os.str();
}

class MemoryHarness {
 public:
  static constexpr const char* kName = "MemoryStore";

  MemoryHarness()
      : offset_(std::make_shared<std::atomic<std::int64_t>>(0)),
        store_([base = base_time(), offset = offset_] {
          return base + std::chrono::microseconds(offset->load());
        }) {}

  store::Store& store() { return store_; }
  store::MemoryStore& memory() { return store_; }
  asio::io_context& ctx() { return ctx_; }

  template <class T>
  T run(asio::awaitable<T> a) {
    return test::run(ctx_, std::move(a));
  }

  void advance(Millis d) { *offset_ += std::chrono::duration_cast<std::chrono::microseconds>(d).count(); }

  std::size_t row_count() { return store_.size(); }
  std::size_t note_count() { return store_.payload_notes(); }

  std::string snapshot(const store::RecordId& id) {
    auto r = run(store_.read(id));
    REQUIRE(r.has_value());
    return describe(*r);
  }

  static constexpr bool kConcurrent = false;

 private:
  // A fixed, microsecond-aligned start keeps timestamps comparable with PostgreSQL's
  // microsecond resolution.
  static store::MemoryStore::Clock::time_point base_time() {
    return store::MemoryStore::Clock::time_point(std::chrono::seconds(1'900'000'000));
  }

  asio::io_context ctx_;
  std::shared_ptr<std::atomic<std::int64_t>> offset_;
  store::MemoryStore store_;
};

// With IDEM_TEST_STORE_PARTITIONS=N (ctest unit.store.partitioned), the record table is
// converted by the opt-in script to N hash partitions by tenant after migrating, run
// with psql exactly as docs/scaling.md tells operators to; then migrating again must
// find nothing to do.
inline void partition_store(const std::string& url, const std::string& partitions) {
#ifndef IDEM_PARTITION_SCRIPT
  FAIL("IDEM_PARTITION_SCRIPT is not compiled in");
#else
  for (const char c : partitions) {
    const bool digit = c >= '0' && c <= '9';
    REQUIRE_MESSAGE(digit, "partitions: a number");
  }
  const std::string cmd = "PGOPTIONS='-c idemproxy.partitions=" + partitions + "' psql '" + url +
                          "' -X -q -v ON_ERROR_STOP=1 -f '" IDEM_PARTITION_SCRIPT "' >/dev/null";
  const int status = std::system(cmd.c_str());
  REQUIRE_MESSAGE(status == 0, "partition_by_tenant.sql failed: " << cmd);
  Db db(url);
  REQUIRE(db.scalar("SELECT relkind::text FROM pg_class WHERE oid = 'idempotency_requests'::regclass") ==
          "p");
  REQUIRE(db.scalar_int("SELECT count(*) FROM pg_inherits WHERE inhparent = "
                        "'idempotency_requests'::regclass") == std::stoll(partitions));
  // Operation ids (migration 0005) still go with their record.
  REQUIRE(db.scalar("SELECT confdeltype::text FROM pg_constraint WHERE contype = 'f' AND "
                    "conrelid = 'idempotency_operations'::regclass AND "
                    "confrelid = 'idempotency_requests'::regclass AND conparentid = 0") == "c");
  REQUIRE(store::apply_migrations(url, Millis{5000}).applied.empty());
#endif
}

// One migrated database per test binary run, created on first use and dropped at exit.
inline const ScratchDatabase& store_database() {
  static ScratchDatabase db("idem_store_test");
  static const bool migrated = [] {
    store::apply_migrations(db.url(), Millis{5000});
    if (auto partitions = env("IDEM_TEST_STORE_PARTITIONS"); partitions && !partitions->empty()) {
      partition_store(db.url(), *partitions);
    }
    return true;
  }();
  (void)migrated;
  return db;
}

inline pg::PoolOptions store_pool_options(std::size_t size = 4) {
  pg::PoolOptions o;
  o.conninfo = store_database().url();
  o.size = size;
  o.connect_timeout = Millis{5000};
  o.statement_timeout = Millis{5000};
  o.acquire_timeout = Millis{10000};
  o.application_name = "idem-store-test";
  o.statements = store::pg_store_statements();
  o.settings = store::pg_store_session_settings();
  return o;
}

class PgHarness {
 public:
  static constexpr const char* kName = "PgStore";

  PgHarness() : PgHarness(store::PgBatching{}) {}

 protected:
  explicit PgHarness(store::PgBatching batching)
      : sql_(store_database().url()),
        pool_(pg::Pool::create(ctx_.get_executor(), store_pool_options())),
        store_(pool_, store::PgStore::ClaimRead::adaptive, batching) {
    // Each case starts from an empty table: cleanup and count checks see only their rows.
    sql_.exec("TRUNCATE idempotency_requests CASCADE");
    sql_.exec("TRUNCATE idempotency_same_payload");
  }


 public:
  store::Store& store() { return store_; }
  store::PgStore& pg_store() { return store_; }
  asio::io_context& ctx() { return ctx_; }
  Db& sql() { return sql_; }
  const std::shared_ptr<pg::Pool>& pool() { return pool_; }

  template <class T>
  T run(asio::awaitable<T> a) {
    return test::run(ctx_, std::move(a));
  }

  void advance(Millis d) {
    const std::string ms = std::to_string(d.count());
    sql_.exec(
        "UPDATE idempotency_requests SET "
        " created_at = created_at - $1::bigint * interval '1 millisecond',"
        " completed_at = completed_at - $1::bigint * interval '1 millisecond',"
        " expires_at = expires_at - $1::bigint * interval '1 millisecond',"
        " lease_expires_at = lease_expires_at - $1::bigint * interval '1 millisecond'",
        {ms});
    sql_.exec(
        "UPDATE idempotency_same_payload SET "
        " seen_at = seen_at - $1::bigint * interval '1 millisecond',"
        " expires_at = expires_at - $1::bigint * interval '1 millisecond',"
        " previous_seen_at = previous_seen_at - $1::bigint * interval '1 millisecond'",
        {ms});
  }

  std::size_t row_count() {
    return std::stoul(sql_.scalar("SELECT count(*) FROM idempotency_requests").value());
  }
  std::size_t note_count() {
    return std::stoul(sql_.scalar("SELECT count(*) FROM idempotency_same_payload").value());
  }

  // The whole row as PostgreSQL prints it: every column, byte for byte.
  std::string snapshot(const store::RecordId& id) {
    const auto rows = sql_.query(
        "SELECT t::text FROM idempotency_requests t"
        " WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3",
        {id.tenant, id.endpoint, id.key});
    return rows.empty() ? "<no row>" : rows.front().front().value_or("<no row>");
  }

  static constexpr bool kConcurrent = true;

 private:
  Db sql_;
  asio::io_context ctx_;
  std::shared_ptr<pg::Pool> pool_;
  store::PgStore store_;
};

// PgStore with every call, even a lone one, sent through the batch statements
// (kClaimBatchSql, kReadBatchSql, kCompleteBatchSql): the conformance suite then proves
// those statements' answers identical to the single ones'.
class PgBatchedHarness : public PgHarness {
 public:
  static constexpr const char* kName = "PgStore (batch statements)";
  PgBatchedHarness() : PgHarness(batch_everything()) {}

 private:
  static store::PgBatching batch_everything() {
    store::PgBatching b;
    b.lone_calls_batched = true;
    return b;
  }
};

}  // namespace idem::test
