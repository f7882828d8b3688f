// The replay cache with real PostgreSQL and two replicas on one database: a retried record
// is answered from memory with the stored answer, and every way a record can go away
// early (an admin purge on either replica, a DELETE in SQL, retention, the listener's
// session dying) is honoured. Each case proves it by rows and backend calls; the metrics
// only tell the test when a replica has heard of a change.
#include "ops_common.hpp"

using namespace idem::it;
using namespace idem::it::ops;
using namespace idem::it::suite;
using namespace std::chrono_literals;

namespace {

const std::string kOrder = R"({"customer_id":"c-1","amount":1000})";

struct Replica {
  explicit Replica(const TestBackend& backend, const std::string& token, RouteOptions route = {}) {
    auto o = options_for(backend);
    o.admin_listen = admin.listen();
    o.admin_token = token;
    o.routes = {route};
    sidecar = std::make_unique<Sidecar>(o);
    client = std::make_unique<HttpClient>(sidecar->port());
    // The cache serves once the replica listens for changes.
    wait_until([&] { return scrape(admin.port).value("idemproxy_replay_cache_active") == 1; }, 10s,
               "the replay cache to become active");
  }
  double hits() const {
    return scrape(admin.port).value("idemproxy_replay_cache_lookups_total", {{"result", "hit"}});
  }
  double notifications() const {
    return scrape(admin.port).value("idemproxy_replay_cache_notifications_total");
  }
  AdminPort admin;
  std::unique_ptr<Sidecar> sidecar;
  std::unique_ptr<HttpClient> client;
};

HttpResponse order(Replica& r, const std::string& tenant, const std::string& key,
                   const std::string& body = kOrder) {
  return r.client->post("/orders", body, order_headers(tenant, key));
}

// A retry that reaches `r` is answered from its memory: the hit counter moves and the
// answer is the stored one.
void expect_replay_from_memory(Replica& r, const std::string& tenant, const std::string& key,
                               const HttpResponse& original) {
  const double before = r.hits();
  auto res = order(r, tenant, key);
  CHECK(res.status == original.status);
  CHECK(res.body == original.body);
  CHECK(res.header("Location") == original.header("Location"));
  CHECK(res.header("Idempotent-Replayed") == "true");
  CHECK(r.hits() == before + 1);
}

}  // namespace

TEST_CASE("replay cache: retries are answered from memory with the stored answer; a purge on either replica is honoured") {
  TestBackend backend;
  Db db(database_url());
  const std::string token = unique("token");
  Replica a(backend, token);
  Replica b(backend, token);
  const auto tenant = unique("tenant");
  const auto key = unique("key");

  auto created = order(a, tenant, key);
  REQUIRE(created.status == 201);
  // The first retry on each replica reads PostgreSQL, the next ones are from memory.
  for (Replica* r : {&a, &b}) {
    auto first_retry = order(*r, tenant, key);
    CHECK(first_retry.header("Idempotent-Replayed") == "true");
    CHECK(first_retry.body == created.body);
    expect_replay_from_memory(*r, tenant, key, created);
  }
  // Refused from memory as from the store: a different request under the same key.
  auto reused = order(b, tenant, key, R"({"customer_id":"c-1","amount":99})");
  CHECK(reused.status == 409);
  CHECK(problem_code(reused) == "idempotency_key_reused");
  CHECK(calls_for(backend, tenant).size() == 1);
  CHECK(count_rows(db, tenant) == 1);

  SUBCASE("purged through the replica that answers next") {
    const double heard_a = a.notifications();
    HttpClient admin_b(b.admin.port);
    REQUIRE(admin_b.request("DELETE", record_path(tenant, "POST /orders", key), bearer(token)).status == 204);
    // No waiting: the purging replica forgot the record before it answered.
    auto fresh = order(b, tenant, key);
    CHECK(fresh.status == 201);
    CHECK_FALSE(fresh.has_header("Idempotent-Replayed"));
    // The other replica forgets it when the notification arrives (architecture.md): the
    // checks below ask it for the new record, so they wait for that first.
    wait_until([&] { return a.notifications() > heard_a; }, 10s, "replica a to hear of the purge");
  }
  SUBCASE("purged through the other replica") {
    const double heard = b.notifications();
    HttpClient admin_a(a.admin.port);
    REQUIRE(admin_a.request("DELETE", record_path(tenant, "POST /orders", key), bearer(token)).status == 204);
    wait_until([&] { return b.notifications() > heard; }, 10s, "replica b to hear of the purge");
    auto fresh = order(b, tenant, key);
    CHECK(fresh.status == 201);
    CHECK_FALSE(fresh.has_header("Idempotent-Replayed"));
  }
  SUBCASE("deleted in SQL by an operator") {
    const double heard_a = a.notifications();
    const double heard_b = b.notifications();
    CHECK(db.exec("DELETE FROM idempotency_requests WHERE tenant_id = $1", {tenant}) == 1);
    wait_until([&] { return a.notifications() > heard_a && b.notifications() > heard_b; }, 10s,
               "both replicas to hear of the DELETE");
    auto fresh = order(a, tenant, key);
    CHECK(fresh.status == 201);
    CHECK_FALSE(fresh.has_header("Idempotent-Replayed"));
  }

  // Whichever way it went: a new operation, recorded once, and its answer is what both
  // replicas replay from then on.
  auto calls = calls_for(backend, tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].header("X-Idempotency-Attempt") == "1");
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 1);
  for (Replica* r : {&a, &b}) {
    auto again = order(*r, tenant, key);
    CHECK(again.header("Idempotent-Replayed") == "true");
    CHECK(again.body == row->body);
  }
  CHECK(calls_for(backend, tenant).size() == 2);
}

TEST_CASE("replay cache: a record is never answered from memory past its retention") {
  TestBackend backend;
  Db db(database_url());
  RouteOptions route;
  route.retention = "1500ms";
  route.lease = "1s";
  Replica a(backend, unique("token"), route);
  const auto tenant = unique("tenant");
  const auto key = unique("key");

  auto created = order(a, tenant, key);
  REQUIRE(created.status == 201);
  CHECK(order(a, tenant, key).header("Idempotent-Replayed") == "true");  // from PostgreSQL, kept
  expect_replay_from_memory(a, tenant, key, created);

  // Retention passes by the database's clock (the row is not touched, so nothing is
  // announced): the very next request must be a new operation.
  wait_until([&] {
    return db.scalar_int("SELECT count(*) FROM idempotency_requests WHERE tenant_id = $1 "
                         "AND expires_at <= now()", {tenant}) == 1;
  }, 10s, "the record's retention to pass");
  auto fresh = order(a, tenant, key);
  CHECK(fresh.status == 201);
  CHECK_FALSE(fresh.has_header("Idempotent-Replayed"));
  auto calls = calls_for(backend, tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].header("X-Idempotency-Attempt") == "2");  // the expired row was replaced
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->body == fresh.body);
}

TEST_CASE("replay cache: without its listening session it empties and every retry reads PostgreSQL") {
  TestBackend backend;
  Db db(database_url());
  Replica a(backend, unique("token"));
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  auto created = order(a, tenant, key);
  REQUIRE(created.status == 201);
  order(a, tenant, key);
  expect_replay_from_memory(a, tenant, key, created);
  CHECK(scrape(a.admin.port).value("idemproxy_replay_cache_entries") >= 1);

  // End the listener's session (as a failover or an idle-session killer would).
  // Other suites' replicas may lose theirs too: that only costs them a reconnect.
  CHECK(db.scalar_int("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                      "WHERE application_name LIKE 'idemproxy-listener%'") >= 1);
  // Either it already listens again or it is off; both are correct, and both emptied it.
  wait_until([&] { return scrape(a.admin.port).value("idemproxy_replay_cache_entries") == 0; }, 10s,
             "the cache to empty when its session ended");
  // While (or after) that, a DELETE the dead session could not hear of is not missed.
  CHECK(db.exec("DELETE FROM idempotency_requests WHERE tenant_id = $1", {tenant}) == 1);
  auto fresh = order(a, tenant, key);
  CHECK(fresh.status == 201);
  CHECK_FALSE(fresh.has_header("Idempotent-Replayed"));
  CHECK(calls_for(backend, tenant).size() == 2);

  // It comes back by itself and serves again.
  wait_until([&] { return scrape(a.admin.port).value("idemproxy_replay_cache_active") == 1; }, 10s,
             "the listener to reconnect");
  auto fresh_created = read_row(db, tenant, key);
  REQUIRE(fresh_created);
  order(a, tenant, key);
  const double before = a.hits();
  auto again = order(a, tenant, key);
  CHECK(again.body == fresh_created->body);
  CHECK(a.hits() == before + 1);
}

TEST_CASE("replay cache: without the change trigger it never serves, and starts once the trigger is back") {
  TestBackend backend;
  ScratchDatabase fresh;
  Db db(fresh.url());
  // The schema first, then the trigger switched off, as a schema behind migration 0002 or
  // an operator's ALTER TABLE would leave it: deletions would go unannounced.
  TempDir dir("replay-cache");
  const auto cfg = dir.write_file(
      "migrate.yaml", "listen: \"127.0.0.1:0\"\nupstream:\n  url: \"http://127.0.0.1:9\"\n"
                      "database:\n  url: \"" + fresh.url() + "\"\n  migrate: check\n");
  REQUIRE(run_idemproxy({"migrate", "--config", cfg.string()}).status.code() == 0);
  db.exec("ALTER TABLE idempotency_requests DISABLE TRIGGER idempotency_requests_announce_change");

  AdminPort admin;
  auto o = options_for(backend);
  o.database_url = fresh.url();
  o.database_migrate = "check";
  o.admin_listen = admin.listen();
  Sidecar sidecar(o);
  HttpClient client(sidecar.port());
  // Until the listener has decided, the cache is off anyway: wait for its decision, which
  // must be the refusal (logged), never an active cache.
  wait_until([&] {
    return sidecar.log().find("no enabled change trigger") != std::string::npos ||
           scrape(admin.port).value("idemproxy_replay_cache_active") == 1;
  }, 10s, "the listener to check for the change trigger");
  CHECK(scrape(admin.port).value("idemproxy_replay_cache_active") == 0);

  const auto tenant = unique("tenant");
  const auto key = unique("key");
  REQUIRE(client.post("/orders", kOrder, order_headers(tenant, key)).status == 201);
  for (int i = 0; i < 3; ++i) {
    CHECK(client.post("/orders", kOrder, order_headers(tenant, key)).header("Idempotent-Replayed") == "true");
  }
  auto m = scrape(admin.port);
  CHECK(m.value("idemproxy_replay_cache_active") == 0);
  CHECK(m.value("idemproxy_replay_cache_lookups_total", {{"result", "hit"}}) == 0);
  CHECK(m.value("idemproxy_replay_cache_entries") == 0);
  // Every replay went to PostgreSQL: one claim per request.
  CHECK(m.value("idemproxy_store_duration_seconds_count", {{"op", "claim"}}) == 4);

  // An unannounced DELETE is therefore never missed.
  CHECK(db.exec("DELETE FROM idempotency_requests WHERE tenant_id = $1", {tenant}) == 1);
  auto fresh_answer = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(fresh_answer.status == 201);
  CHECK_FALSE(fresh_answer.has_header("Idempotent-Replayed"));
  CHECK(calls_for(backend, tenant).size() == 2);

  // With the trigger back, the listener's next attempt passes its check.
  db.exec("ALTER TABLE idempotency_requests ENABLE TRIGGER idempotency_requests_announce_change");
  wait_until([&] { return scrape(admin.port).value("idemproxy_replay_cache_active") == 1; }, 15s,
             "the replay cache to start once the trigger is enabled");
  client.post("/orders", kOrder, order_headers(tenant, key));  // read from PostgreSQL, kept
  auto cached = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(cached.header("Idempotent-Replayed") == "true");
  CHECK(scrape(admin.port).value("idemproxy_replay_cache_lookups_total", {{"result", "hit"}}) == 1);
}
