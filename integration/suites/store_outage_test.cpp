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
