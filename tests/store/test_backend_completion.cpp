// The SQL side of `completion: backend` (migration 0004) against real PostgreSQL: a
// backend's transaction completes the record with idemproxy_complete() or asserts
// ownership with idemproxy_assert_owner(), and a stale attempt's whole transaction rolls
// back. The sidecar's C++ side (record_reference, answer_digest) must agree byte for byte.
#include <doctest/doctest.h>

#include <random>

#include "idempotency/backend_completion.hpp"
#include "store/harness.hpp"

using namespace idem;
using namespace std::chrono_literals;

namespace {

store::ClaimRequest claim_req(std::string key, std::string tenant = "tenant-a") {
  store::ClaimRequest r;
  r.id = {std::move(tenant), "POST /orders", std::move(key)};
  r.fingerprint = "fp";
  r.lease = 30s;
  r.retention = 1h;
  return r;
}

std::string ref(const store::ClaimRequest& req, std::int64_t fence) {
  return idempotency::record_reference(fence, req.retention, req.id.endpoint, req.id.key);
}

// The SQLSTATE of the last error (libpq's own text is not what callers decide on).
std::string sqlstate_of(test::Db& sql, const std::string& statement,
                        const test::SqlParams& params) {
  try {
    sql.exec(statement, params);
  } catch (const test::SqlError& e) {
    return e.sqlstate;
  }
  return "00000";
}

// A table standing in for a backend's own orders, in the same database.
void create_orders(test::Db& sql) {
  sql.exec("CREATE TABLE IF NOT EXISTS backend_orders (tenant text, key text, note text)");
  sql.exec("TRUNCATE backend_orders");
}

}  // namespace

TEST_CASE("backend completion: the reference and the digest are the same in C++ and SQL") {
  test::PgHarness h;
  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {
    std::string key = "k/" + std::to_string(i) + " \"q\" é";
    std::string body;
    for (int j = 0; j < i * 7; ++j) body.push_back(static_cast<char>(rng() & 0xff));
    const std::string resource = i % 3 == 0 ? "" : "/orders/" + std::to_string(i);
    const int status = 200 + i;
    const auto r = idempotency::record_reference(1000 + i, Millis{86'400'000}, "POST /o/{id}", key);
    const auto parsed = h.sql().query(
        "SELECT endpoint, idempotency_key, fencing_token::text, retention_ms::text"
        " FROM idemproxy_parse_record($1)",
        {r});
    REQUIRE(parsed.size() == 1);
    CHECK(parsed[0] == test::Row{"POST /o/{id}", key, std::to_string(1000 + i), "86400000"});
    std::string hex_body;
    static constexpr char kHex[] = "0123456789abcdef";
    for (const char c : body) {
      hex_body.push_back(kHex[static_cast<unsigned char>(c) >> 4]);
      hex_body.push_back(kHex[static_cast<unsigned char>(c) & 0x0f]);
    }
    const auto sql_digest = h.sql().scalar(
        "SELECT idemproxy_answer_digest($1::integer, NULLIF($2, ''), decode($3, 'hex'))",
        {std::to_string(status), resource, hex_body});
    CHECK(sql_digest == idempotency::answer_digest(status, resource, body));
  }
}

TEST_CASE("backend completion: the owner's transaction completes the record with its writes") {
  test::PgHarness h;
  create_orders(h.sql());
  const auto req = claim_req("owner");
  const auto won = h.run(h.store().claim(req)).value();
  REQUIRE(won.won);
  auto& sql = h.sql();
  sql.exec("BEGIN");
  sql.exec("SELECT idemproxy_assert_owner($1, $2)", {req.id.tenant, ref(req, won.owner.fence)});
  sql.exec("INSERT INTO backend_orders VALUES ($1, $2, 'created')", {req.id.tenant, req.id.key});
  const auto digest = sql.scalar(
      "SELECT idemproxy_complete($1, $2, 201, '[[\"Content-Type\", \"application/json\"],"
      " [\"Location\", \"/orders/9\"]]'::jsonb, convert_to('{\"id\":9}', 'UTF8'), '/orders/9')",
      {req.id.tenant, ref(req, won.owner.fence)});
  sql.exec("COMMIT");
  CHECK(digest == idempotency::answer_digest(201, "/orders/9", "{\"id\":9}"));

  // The record, as the sidecar reads it, holds that answer; the order and the record
  // committed in one transaction.
  const auto rec = h.run(h.store().read(req.id)).value();
  REQUIRE(rec.has_value());
  CHECK(rec->state == store::State::completed);
  CHECK(rec->fence == won.owner.fence);
  REQUIRE(rec->response.has_value());
  CHECK(rec->response->status == 201);
  CHECK(rec->response->body == "{\"id\":9}");
  CHECK(rec->response->resource_id == "/orders/9");
  REQUIRE(rec->response->headers.size() == 2);
  CHECK(rec->response->headers[1].value == "/orders/9");
  // Retention after the completion, kept from the claim (the lean record): at most one
  // lease more.
  CHECK(rec->expires_at_us - rec->completed_at_us >= 3'600'000'000LL);
  CHECK(rec->expires_at_us - rec->completed_at_us <= 3'600'000'000LL + 30'000'000LL);  // the 30 s lease
  CHECK(sql.scalar("SELECT (SELECT xmin FROM backend_orders WHERE key = 'owner')::text = "
                   "(SELECT xmin FROM idempotency_requests WHERE idempotency_key = 'owner')::text") ==
        "t");
}

TEST_CASE("backend completion: a stale attempt's transaction is refused, its writes roll back") {
  test::PgHarness h;
  create_orders(h.sql());
  const auto req = claim_req("stale");
  const auto first = h.run(h.store().claim(req)).value().owner;
  REQUIRE(h.run(h.store().expire_lease(req.id, first.fence)).value());
  const auto second = h.run(h.store().take_over(req.id, first.fence, 30s)).value();
  REQUIRE(second.has_value());
  auto& sql = h.sql();
  for (const char* fn : {"complete", "assert"}) {
    CAPTURE(fn);
    sql.exec("BEGIN");
    sql.exec("INSERT INTO backend_orders VALUES ($1, $2, 'stale')", {req.id.tenant, req.id.key});
    const std::string call =
        std::string(fn) == "complete"
            ? "SELECT idemproxy_complete($1, $2, 201, '[]'::jsonb, convert_to('x', 'UTF8'), '')"
            : "SELECT idemproxy_assert_owner($1, $2)";
    CHECK(sqlstate_of(sql, call, {req.id.tenant, ref(req, first.fence)}) == "IP001");
    sql.exec("ROLLBACK");
  }
  CHECK(sql.scalar("SELECT count(*) FROM backend_orders") == "0");
  const auto rec = h.run(h.store().read(req.id)).value();
  REQUIRE(rec.has_value());
  CHECK(rec->state == store::State::in_progress);
  CHECK(rec->fence == second->fence);
}

TEST_CASE("backend completion: a reference completes nothing outside its own tenant or claim") {
  test::PgHarness h;
  const auto mine = claim_req("shared", "tenant-a");
  const auto theirs = claim_req("shared", "tenant-b");
  const auto a = h.run(h.store().claim(mine)).value().owner;
  const auto b = h.run(h.store().claim(theirs)).value().owner;
  auto& sql = h.sql();
  const std::string complete =
      "SELECT idemproxy_complete($1, $2, 201, '[]'::jsonb, convert_to('x', 'UTF8'), '')";
  // tenant-a's backend with tenant-b's reference (same scope and key): refused.
  CHECK(sqlstate_of(sql, complete, {"tenant-a", ref(theirs, b.fence)}) == "IP001");
  // A reference whose fence was edited: refused.
  CHECK(sqlstate_of(sql, complete, {"tenant-a", ref(mine, a.fence + 1)}) == "IP001");
  // Malformed references: refused as such.
  for (const std::string bad : {"", "v1", "v2.1.1.aa.bb", "v1.0.1.aa.bb", "v1.1.1.a.bb",
                                "v1.1.1.aa.bb.cc", "v1.-1.1.aa.bb", "v1.1.x.aa.bb"}) {
    CAPTURE(bad);
    CHECK(sqlstate_of(sql, complete, {"tenant-a", bad}) == "IP002");
  }
  CHECK(sqlstate_of(sql, "SELECT idemproxy_complete($1, $2, 99, '[]'::jsonb, NULL, '')",
                    {"tenant-a", ref(mine, a.fence)}) == "22023");
  CHECK(sqlstate_of(sql, "SELECT idemproxy_complete($1, $2, 201, '{}'::jsonb, NULL, '')",
                    {"tenant-a", ref(mine, a.fence)}) == "22023");
  // Both records are untouched.
  CHECK(h.run(h.store().read(mine.id)).value()->state == store::State::in_progress);
  CHECK(h.run(h.store().read(theirs.id)).value()->state == store::State::in_progress);
}

TEST_CASE("backend completion: ownership asserted holds the row until the transaction ends") {
  test::PgHarness h;
  const auto req = claim_req("locked");
  const auto won = h.run(h.store().claim(req)).value().owner;
  REQUIRE(h.run(h.store().expire_lease(req.id, won.fence)).value());  // a takeover is due
  test::Db backend(test::store_database().url());
  backend.exec("BEGIN");
  backend.exec("SELECT idemproxy_assert_owner($1, $2)", {req.id.tenant, ref(req, won.fence)});

  // A takeover now waits for the backend's transaction: with a short statement timeout it
  // gives up as a store timeout instead of slipping in before the commit.
  asio::io_context ctx;
  auto opts = test::store_pool_options(1);
  opts.statement_timeout = 300ms;
  store::PgStore impatient(pg::Pool::create(ctx.get_executor(), opts));
  auto taken = test::run(ctx, impatient.take_over(req.id, won.fence, 30s));
  REQUIRE_FALSE(taken.has_value());
  CHECK(taken.error() == errc::store_timeout);

  backend.exec("SELECT idemproxy_complete($1, $2, 201, '[]'::jsonb, NULL, '')",
               {req.id.tenant, ref(req, won.fence)});
  backend.exec("COMMIT");
  // Completed: there is nothing left to take over.
  CHECK_FALSE(test::run(ctx, impatient.take_over(req.id, won.fence, 30s)).value().has_value());
  CHECK(h.run(h.store().read(req.id)).value()->state == store::State::completed);
}
