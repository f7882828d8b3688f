// Retention cleanup run by two sidecar processes at once against one database: together
// they delete exactly the expired rows, in bounded batches, never one whose expires_at is
// in the future or whose lease is live, and the counters add up to what was deleted.
#include <cstdio>
#include <string_view>

#include "ops_common.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::ops;

namespace {

struct Category {
  std::string prefix;
  int rows;
  bool deleted;  // what cleanup must do with it
  std::string state;
  std::string lease_expires_at;  // SQL expression
  std::string expires_at;        // SQL expression
};

// Seeds directly with SQL (one statement per category), as a long-running deployment would
// have accumulated them. Rows differ by key prefix so they can be counted afterwards.
void seed(Db& db, const std::string& tenant, const Category& c) {
  const bool completed = c.state == "completed";
  // Only the expressions vary, and they are ours; the data travels as parameters.
  const std::string sql =
      "INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, "
      "request_fingerprint, state, attempt_token, lease_expires_at, response_status, "
      "response_body, created_at, completed_at, expires_at) "
      "SELECT $1, 'POST /orders', $2::text || g, 'fp', $3, 1, " + c.lease_expires_at + ", " +
      (completed ? "201, '\\x7b7d'::bytea, now() - interval '2 days', now() - interval '2 days', "
                 : "NULL, NULL, now() - interval '2 days', NULL, ") +
      c.expires_at + " FROM generate_series(1, $4::int) AS g";
  db.exec(sql, {tenant, c.prefix, c.state, c.rows});
}

std::int64_t count_prefix(Db& db, const std::string& tenant, const std::string& prefix) {
  return db.scalar_int(
      "SELECT count(*) FROM idempotency_requests WHERE tenant_id = $1 AND starts_with(idempotency_key, $2)",
      {tenant, prefix});
}

}  // namespace

TEST_CASE("ops: two replicas clean up concurrently, exactly the expired rows, in batches") {
  TestBackend backend;
  ScratchDatabase fresh;
  constexpr int kBatch = 50;

  auto options = [&] {
    auto o = options_for(backend);
    o.database_url = fresh.url();
    o.log_level = "info";
    o.cleanup_interval = "100ms";
    o.cleanup_batch = kBatch;
    o.admin_listen = AdminPort().listen();
    return o;
  };
  auto oa = options();
  auto ob = options();
  Sidecar a(oa);  // migrates the fresh database (migrate: auto)
  Sidecar b(ob);
  const auto admin_port = [](const SidecarOptions& o) {
    return static_cast<std::uint16_t>(std::stoi(o.admin_listen.substr(o.admin_listen.rfind(':') + 1)));
  };

  const std::string tenant = unique("tenant");
  const std::vector<Category> categories = {
      {"expired-completed-", 2000, true, "completed", "NULL", "now() - g * interval '1 second'"},
      {"expired-lapsed-", 200, true, "in_progress", "now() - interval '1 hour'",
       "now() - interval '1 minute'"},
      {"future-completed-", 500, false, "completed", "NULL", "now() + interval '1 hour'"},
      {"live-lease-", 300, false, "in_progress", "now() + interval '1 hour'",
       "now() + interval '1 hour'"},
      // Not produced by the protocol (a live lease keeps expires_at ahead), so only the
      // cleanup predicate's own lease check protects it.
      {"past-expiry-live-lease-", 100, false, "in_progress", "now() + interval '1 hour'",
       "now() - interval '1 hour'"},
      {"lapsed-future-", 100, false, "in_progress", "now() - interval '1 hour'",
       "now() + interval '1 hour'"},
  };
  int expected_deleted = 0;
  int expected_kept = 0;
  {
    // One transaction: both replicas find the whole backlog at once.
    Db db(fresh.url());
    db.exec("BEGIN");
    for (const auto& c : categories) {
      seed(db, tenant, c);
      (c.deleted ? expected_deleted : expected_kept) += c.rows;
    }
    db.exec("COMMIT");
  }

  Db db(fresh.url());
  auto kept_now = [&] {
    std::int64_t n = 0;
    for (const auto& c : categories) {
      if (!c.deleted) n += count_prefix(db, tenant, c.prefix);
    }
    return n;
  };
  wait_until([&] {
    // Checked on every poll, not only at the end: a row that must stay never disappears,
    // not even for a moment.
    const auto kept = kept_now();
    if (kept != expected_kept) {
      fail("cleanup deleted a row it must keep: " + std::to_string(kept) + " of " +
           std::to_string(expected_kept) + " left");
    }
    std::int64_t due = 0;
    for (const auto& c : categories) {
      if (c.deleted) due += count_prefix(db, tenant, c.prefix);
    }
    return due == 0;
  }, 30s, "both replicas to delete every expired row");
  for (const auto& c : categories) {
    INFO(c.prefix);
    CHECK(count_prefix(db, tenant, c.prefix) == (c.deleted ? 0 : c.rows));
  }
  CHECK(db.scalar_int("SELECT count(*) FROM idempotency_requests") == expected_kept);

  // The counters add up to exactly what was deleted: every row deleted once, by one replica.
  double deleted = 0;
  wait_until([&] {
    deleted = scrape(admin_port(oa)).value("idemproxy_expired_deleted_total") +
              scrape(admin_port(ob)).value("idemproxy_expired_deleted_total");
    return deleted >= expected_deleted;
  }, 10s, "the replicas' expired_deleted counters to add up");
  CHECK(deleted == expected_deleted);
  for (const auto& o : {oa, ob}) {
    const auto m = scrape(admin_port(o));
    CHECK(m.sum("idemproxy_store_errors_total") == 0);
    CHECK(m.value("idemproxy_store_duration_seconds_count", {{"op", "cleanup"}}) >= 1);
  }

  // In batches: each round's log line says how many rows in how many DELETEs; no DELETE
  // took more than `batch`, no round more than 10 of them.
  CHECK(a.stop().success());
  CHECK(b.stop().success());
  long total = 0;
  int rounds = 0;
  for (const auto* s : {&a, &b}) {
    const std::string log = s->log();
    constexpr std::string_view kRound = "cleanup: deleted ";
    for (auto at = log.find(kRound); at != std::string::npos; at = log.find(kRound, at + 1)) {
      // "cleanup: deleted N expired records in B batches of at most S"
      long rows = 0;
      long batches = 0;
      long size = 0;
      REQUIRE(std::sscanf(log.c_str() + at + kRound.size(),
                          "%ld expired records in %ld batches of at most %ld", &rows, &batches,
                          &size) == 3);
      CHECK(size == kBatch);
      CHECK(batches >= 1);
      CHECK(batches <= 10);
      CHECK(rows <= batches * kBatch);
      CHECK(rows >= (batches - 1) * kBatch);  // a short batch ends the round
      total += rows;
      ++rounds;
    }
  }
  CHECK(total == expected_deleted);
  CHECK(rounds >= expected_deleted / (10 * kBatch));
}
