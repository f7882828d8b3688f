// A client that makes a new idempotency key for every retry (same_payload_new_key,
// docs/configuration.md): counted, warned about or refused, proven by the orders the API
// wrote, the notes in PostgreSQL (idempotency_same_payload) and the sidecar's metric.
#include "common.hpp"
#include "e2e_stack.hpp"
#include "test_support/prometheus.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::e2e;

namespace {

struct Stack {
  explicit Stack(const std::string& action) : admin_port(free_port()) {
    StackOptions o;
    o.record_arrivals = true;
    o.route_yaml = "same_payload_new_key:\n  window: 10m\n  action: " + action + "\n";
    o.admin_listen = "127.0.0.1:" + std::to_string(admin_port);
    stack = std::make_unique<OrderStack>(o);
  }
  double detections() {
    HttpClient admin(admin_port);
    const auto scrape = admin.get("/metrics");
    REQUIRE(scrape.status == 200);
    return idem::test::parse_exposition(scrape.body)
        .find("idemproxy_same_payload_new_key_total", {{"route", "create-order"}})
        .value_or(0);
  }
  std::uint16_t admin_port;
  std::unique_ptr<OrderStack> stack;
};

std::int64_t arrivals(Db& db, const std::string& tenant) {
  return db.scalar_int("SELECT count(*) FROM demo_orders.arrivals WHERE tenant_id = $1", {tenant});
}

std::int64_t notes(Db& db, const std::string& tenant) {
  return db.scalar_int("SELECT count(*) FROM idempotency_same_payload WHERE tenant_id = $1", {tenant});
}

// No checkout id: the API's business key would refuse the second order itself, and the
// point here is a backend without one, where a new key means a second order.
const std::string kOrder = order_body("", 1000);
const std::string kOtherOrder = order_body("", 2500);

}  // namespace

TEST_CASE("e2e: same payload, new key — count: the retry with a new key is counted; two genuinely different orders are not") {
  Stack s("count");
  Db db(database_url());
  const auto tenant = unique("tenant");
  auto client = s.stack->client();

  REQUIRE(client.post("/orders", kOrder, order_headers(tenant, unique("key"))).status == 201);
  REQUIRE(client.post("/orders", kOtherOrder, order_headers(tenant, unique("key"))).status == 201);
  CHECK(s.detections() == 0);  // two orders, two payloads
  CHECK(notes(db, tenant) == 2);

  // The mobile client's bug: the first order's retry with a fresh key.
  const auto retry = client.post("/orders", kOrder, order_headers(tenant, unique("key")));
  CHECK(retry.status == 201);
  CHECK_FALSE(retry.has_header("Idempotency-Warning"));
  CHECK(s.detections() == 1);
  // Counted, not prevented: the API made a second order of the first payload.
  CHECK(orders_of(db, tenant).size() == 3);
  CHECK(arrivals(db, tenant) == 3);
  CHECK(notes(db, tenant) == 2);  // one per payload
  CHECK(s.stack->sidecar().log().find("same payload as a request with another key") != std::string::npos);
}

TEST_CASE("e2e: same payload, new key — reject: refused with 409 naming the earlier operation; nothing forwarded") {
  Stack s("reject");
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto first_key = unique("key");
  auto client = s.stack->client();

  const auto first = client.post("/orders", kOrder, order_headers(tenant, first_key));
  REQUIRE(first.status == 201);
  const auto other = client.post("/orders", kOtherOrder, order_headers(tenant, unique("key")));
  REQUIRE(other.status == 201);
  CHECK(s.detections() == 0);

  for (int i = 0; i < 2; ++i) {
    const auto key = unique("key");
    const auto refused = client.post("/orders", kOrder, order_headers(tenant, key));
    CHECK(refused.status == 409);
    CHECK(problem_code(refused) == "same_payload_new_key");
    CHECK(json_string(refused, "earlier_operation_id") ==
          db.scalar("SELECT idemproxy_operation_id($1, 'POST /orders', $2)", {tenant, first_key}).value_or("?"));
    CHECK_FALSE(read_row(db, tenant, key).has_value());  // the claim was released
  }
  CHECK(s.detections() == 2);
  // The earlier key still replays: the retry the client should have sent.
  const auto replay = client.post("/orders", kOrder, order_headers(tenant, first_key));
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == first.body);

  CHECK(orders_of(db, tenant).size() == 2);  // the two genuine orders, nothing else
  CHECK(arrivals(db, tenant) == 2);
  CHECK(count_rows(db, tenant) == 2);
}
