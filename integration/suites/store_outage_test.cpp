// PostgreSQL going away: protected routes fail closed (503, nothing forwarded) and recover
// by themselves when it returns, without restarting the sidecar.
#include "common.hpp"

using namespace idem::it;
using namespace idem::it::suite;

TEST_CASE("PostgreSQL stopped: 503 with Retry-After, nothing forwarded; recovery after restart") {
  TestBackend backend;
  auto o = options_for(backend);
  o.database_connect_timeout = "1s";
  o.database_statement_timeout = "1s";
  Sidecar sidecar(o);
  const auto tenant = unique("tenant");
  const std::string order = R"({"customer_id":"c-1","amount":10})";
  HttpClient client(sidecar.port());

  // Warm the pool first, so the outage hits established connections too.
  REQUIRE(client.post("/orders", order, order_headers(tenant, unique("warm"))).status == 201);
  const auto calls_before = calls_for(backend, tenant).size();

  {
    PostgresOutage outage;
    for (int i = 0; i < 3; ++i) {
      auto res = client.post("/orders", order, order_headers(tenant, unique("key")), 20s);
      CHECK(res.status == 503);
      CHECK(problem_code(res) == "idempotency_store_unavailable");
      CHECK(res.header("Retry-After") == "1");
    }
    // Unprotected traffic is not the store's business and still flows.
    CHECK(client.get("/health", {{"X-Tenant-Id", tenant}}).status == 200);
    CHECK(calls_for(backend, tenant).size() == calls_before + 1);  // only the GET
    outage.end();
  }

  const auto key = unique("key");
  HttpResponse recovered;
  wait_until([&] {
    recovered = client.post("/orders", order, order_headers(tenant, key), 20s);
    return recovered.status != 503;
  }, 30s, "protected requests to succeed again after PostgreSQL restarted");
  CHECK(recovered.status == 201);
  Db db(database_url());
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(sidecar.running());
}

// A replica that starts while PostgreSQL is down (a deploy meeting a restart or a
// failover) waits for it, up to database.start_wait, and then serves; nothing listens
// meanwhile, so nothing is routed to it. scripts/chaos found the need: a replica restarted
// during a PostgreSQL restart exited, and stayed down for the rest of the run.
TEST_CASE("a replica started while PostgreSQL is down waits for it, then serves") {
  TestBackend backend;
  auto o = options_for(backend);
  o.database_connect_timeout = "1s";
  o.database_start_wait = "60s";
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const std::string order = R"({"customer_id":"c-1","amount":10})";
  PostgresOutage outage;
  SidecarLaunch launch;
  launch.wait_until_listening = false;
  Sidecar sidecar(o, launch);
  // At least two failed attempts: it is waiting, not on its first try.
  sidecar.wait_for_log("the database cannot be reached", 2, 30s);
  REQUIRE(sidecar.running());
  outage.end();
  sidecar.wait_until_listening(60s);
  HttpClient client(sidecar.port());
  const auto res = client.post("/orders", order, order_headers(tenant, key), 20s);
  CHECK(res.status == 201);
  Db db(database_url());
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(calls_for(backend, tenant).size() == 1);
}

TEST_CASE("a replica gives up on an unreachable PostgreSQL after database.start_wait, exit 1") {
  TestBackend backend;
  auto o = options_for(backend);
  o.database_connect_timeout = "1s";
  o.database_start_wait = "1s";
  PostgresOutage outage;
  SidecarLaunch launch;
  launch.wait_until_listening = false;
  Sidecar sidecar(o, launch);
  const auto status = sidecar.process().wait_exit(30s);
  REQUIRE(status);
  CHECK(status->exited());
  CHECK(status->code() == 1);
  CHECK(sidecar.log().find("no answer within database.start_wait, 1s") != std::string::npos);
  CHECK(sidecar.log().find("the database cannot be reached") != std::string::npos);
}
