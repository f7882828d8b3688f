// Long operations and uncertain outcomes through the whole stack (docs/http.md, "Long
// operations"): 202 Accepted with the operation status resource, re-fetched replays and
// reconciliation after a sidecar died mid-call. Proven by the rows in PostgreSQL and the
// requests the order API recorded, not by statuses alone.
#include <future>

#include "common.hpp"
#include "e2e_stack.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::e2e;

namespace {

// An order of the reference API's long operation: a SLOW-… item (--slow-order-time).
std::string slow_order_body(const std::string& checkout) {
  return R"({"customer_id":"c-42","currency":"EUR","amount":1000,"items":[{"sku":"SLOW-1","qty":1}],"checkout_id":")" +
         checkout + "\"}";
}

// The record's expiry as clients are told it (IMF-fixdate, whole seconds, from PostgreSQL).
std::string record_expiry(Db& db, const std::string& tenant, const std::string& key) {
  return db.scalar(
               "SELECT to_char(expires_at AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS \"GMT\"') "
               "FROM idempotency_requests WHERE tenant_id = $1 AND idempotency_key = $2",
               {tenant, key})
      .value_or("");
}

std::int64_t arrivals(Db& db, const std::string& tenant) {
  return db.scalar_int("SELECT count(*) FROM demo_orders.arrivals WHERE tenant_id = $1", {tenant});
}

const std::string kAsyncRoute =
    "async:\n"
    "  after: 200ms\n"
    "  status_path: /operations/{operation_id}\n";

}  // namespace

TEST_CASE("e2e: a slow order gets 202, its status resource, then its result; one order") {
  StackOptions o;
  o.slow_order_time = "2s";
  o.lease = "1s";  // renewed while the order runs: the lease is not what makes it last
  o.route_yaml = kAsyncRoute;
  OrderStack stack(o);
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = slow_order_body(unique("checkout"));
  auto client = stack.client();

  const auto accepted = client.post("/orders", body, order_headers(tenant, key));
  REQUIRE(accepted.status == 202);
  const auto location = accepted.header("Location").value_or("");
  REQUIRE(location.starts_with("/operations/"));
  CHECK(accepted.header("Retry-After").has_value());
  CHECK(accepted.header("Idempotency-Key-Expires") == record_expiry(db, tenant, key));
  CHECK(counts(db, tenant).orders == 0);  // still running at the API

  const auto running = client.get(location, {{"X-Tenant-Id", tenant}});
  CHECK(running.status == 200);
  CHECK(json_string(running, "status") == "in_progress");
  CHECK(running.body.find("\"attempt\":1") != std::string::npos);

  // A duplicate meanwhile is pointed at the same status.
  const auto dup = client.post("/orders", body, order_headers(tenant, key));
  CHECK(dup.status == 202);
  CHECK(dup.header("Location") == location);

  // Another tenant's request for this id and a request for an unknown id are alike.
  const auto other = client.get(location, {{"X-Tenant-Id", unique("tenant")}});
  const auto unknown = client.get("/operations/" + std::string(64, '0'), {{"X-Tenant-Id", tenant}});
  CHECK(other.status == 404);
  CHECK(other.status == unknown.status);
  CHECK(other.body == unknown.body);
  CHECK(problem_code(other) == "operation_not_found");

  HttpResponse done;
  wait_until(
      [&] {
        done = client.get(location, {{"X-Tenant-Id", tenant}});
        return done.status != 200;
      },
      15s, "the slow order to finish");
  CHECK(done.status == 303);
  const auto orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  CHECK(done.header("Location") == "/orders/" + orders[0].order_id);
  CHECK(done.header("Idempotency-Key-Expires") == record_expiry(db, tenant, key));

  // The result itself: a retry replays the one answer, and the resource is there.
  const auto retry = client.post("/orders", body, order_headers(tenant, key));
  CHECK(retry.status == 201);
  CHECK(retry.header("Idempotent-Replayed") == "true");
  CHECK(json_string(retry, "order_id") == orders[0].order_id);
  CHECK(retry.header("Idempotency-Key-Expires") == record_expiry(db, tenant, key));
  const auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 1);
  const auto c = wait_for_delivery(db, tenant, 1);
  CHECK(footprint(c) == kOneOperation);
}

TEST_CASE("e2e: reconciliation finds the order a killed sidecar's call committed; no second create") {
  StackOptions o;
  o.record_arrivals = true;
  o.route_yaml =
      "on_unknown_outcome: reconcile\n"
      "reconcile:\n"
      "  method: GET\n"
      "  path: /orders/by-operation/{operation_id}\n";
  OrderStack stack(o);  // lease 1s
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  const std::uint16_t port = stack.sidecar().port();

  // The API commits, then holds its answer long enough for the sidecar to die.
  auto doomed = std::async(std::launch::async, [&] {
    HttpClient c(port);
    try {
      c.post("/orders", body, order_headers(tenant, key, {{"X-Fault", "delay-after-commit=3000"}}),
             20s);
      return false;
    } catch (const std::exception&) {
      return true;
    }
  });
  wait_until([&] { return counts(db, tenant).orders == 1; }, 10s, "the order to commit");
  stack.sidecar().kill9();
  CHECK(doomed.get());
  REQUIRE(arrivals(db, tenant) == 1);

  stack.sidecar().restart();
  const auto retry = retry_until_settled(stack, body, order_headers(tenant, key));
  CHECK(retry.status == 201);
  CHECK(retry.header("Idempotent-Replayed") != "true");  // the first answer this client sees
  const auto orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  CHECK(json_string(retry, "order_id") == orders[0].order_id);
  CHECK(retry.header("Location") == "/orders/" + orders[0].order_id);
  // The takeover asked; it did not create: the API saw one POST, from attempt 1.
  CHECK(arrivals(db, tenant) == 1);
  CHECK(orders[0].attempt == 2);  // the lookup made attempt 2 the order's
  const auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 2);
  CHECK(row->status == 201);
  const auto c = wait_for_delivery(db, tenant, 1);
  CHECK(footprint(c) == kOneOperation);
}

TEST_CASE("e2e: a re-fetched replay shows the order as it is now, and only to whom the API allows") {
  StackOptions o;
  o.route_yaml = "replay:\n  mode: refetch\n";
  OrderStack stack(o);
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  auto client = stack.client();

  const auto first = client.post("/orders", body, order_headers(tenant, key));
  REQUIRE(first.status == 201);
  CHECK(json_string(first, "status") == "created");
  const auto order_id = json_string(first, "order_id");
  wait_for_delivery(db, tenant, 1);  // charged and reserved: the order is confirmed now

  const auto replay = client.post("/orders", body, order_headers(tenant, key));
  CHECK(replay.status == 201);  // the first status
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.header("Idempotent-Replay-Body") == "current");
  CHECK(json_string(replay, "order_id") == order_id);
  CHECK(json_string(replay, "status") == "confirmed");
  CHECK(replay.header("Location") == "/orders/" + order_id);
  CHECK(replay.header("Idempotency-Key-Expires") == record_expiry(db, tenant, key));

  // The same key from a client the API does not let read the order: its refusal, and
  // nothing of the order.
  const auto refused =
      client.post("/orders", body, order_headers(tenant, key, {{"X-Customer-Id", "c-99"}}));
  CHECK(refused.status == 403);
  CHECK(problem_code(refused) == "order_forbidden");
  CHECK(refused.body.find(order_id) == std::string::npos);
  const auto allowed =
      client.post("/orders", body, order_headers(tenant, key, {{"X-Customer-Id", "c-42"}}));
  CHECK(allowed.status == 201);
  CHECK(json_string(allowed, "order_id") == order_id);

  CHECK(orders_of(db, tenant).size() == 1);
  const auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->resource_id == "/orders/" + order_id);
}

// Encryption at rest on an async route: the answer recorded behind a 202 is sealed like any
// other (the detached job completes through the same encrypting store), and the status
// resource and the replay open it for the tenant that owns it, and for no one else.
TEST_CASE("e2e: an async route with encryption: a sealed row, the status resource and the replay in clear") {
  TempDir dir("keys");
  const auto key_file = dir.write_file("k.key", std::string(64, 'f') + "\n");
  StackOptions o;
  o.slow_order_time = "1s";
  o.route_yaml = kAsyncRoute;
  o.sidecar_yaml = "encryption:\n  keys:\n    - {id: async-k, file: \"" + key_file.string() +
                   "\"}\n  active: async-k\nreplay_cache:\n  enabled: false\n";
  OrderStack stack(o);
  Db db(database_url());
  const auto tenant = unique("tenant-PLAIN");
  const auto key = unique("key");
  const auto body = slow_order_body(unique("checkout"));
  auto client = stack.client();

  const auto accepted = client.post("/orders", body, order_headers(tenant, key));
  REQUIRE(accepted.status == 202);
  const auto location = accepted.header("Location").value_or("");
  REQUIRE(location.starts_with("/operations/"));
  HttpResponse done;
  wait_until(
      [&] {
        done = client.get(location, {{"X-Tenant-Id", tenant}});
        return done.status != 200;
      },
      15s, "the slow order to finish");
  const auto orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  const auto& order_id = orders[0].order_id;
  // The status resource opened the sealed record: it points at the order.
  CHECK(done.status == 303);
  CHECK(done.header("Location") == "/orders/" + order_id);

  // PostgreSQL holds no plaintext of the answer: not the order id (in the API's body and
  // in the Location it replays), not the tenant.
  const auto raw = db.query(
      "SELECT encode(response_body, 'hex'), response_headers::text, state, response_status::text "
      "FROM idempotency_requests WHERE tenant_id = $1 AND idempotency_key = $2",
      {tenant, key});
  REQUIRE(raw.size() == 1);
  const auto body_hex = raw[0][0].value_or("");
  const auto headers = raw[0][1].value_or("");
  CHECK(raw[0][2] == "completed");
  CHECK(raw[0][3] == "201");
  std::string magic, id_hex, tenant_hex;
  idem::text::append_hex(magic, std::string_view("\0IDEMENC", 8));
  idem::text::append_hex(id_hex, order_id);
  idem::text::append_hex(tenant_hex, tenant);
  CHECK(body_hex.rfind(magic, 0) == 0);
  CHECK(body_hex.find(id_hex) == std::string::npos);
  CHECK(body_hex.find(tenant_hex) == std::string::npos);
  CHECK(headers.find(":sealed") != std::string::npos);
  CHECK(headers.find(order_id) == std::string::npos);
  CHECK(headers.find("Location") == std::string::npos);

  // The replay is the plaintext answer, from PostgreSQL (no replay cache).
  const auto retry = client.post("/orders", body, order_headers(tenant, key));
  CHECK(retry.status == 201);
  CHECK(retry.header("Idempotent-Replayed") == "true");
  CHECK(json_string(retry, "order_id") == order_id);
  CHECK(retry.header("Location") == "/orders/" + order_id);
  // The status resource again, the same; another tenant learns nothing of it.
  CHECK(client.get(location, {{"X-Tenant-Id", tenant}}).header("Location") == "/orders/" + order_id);
  const auto other = client.get(location, {{"X-Tenant-Id", unique("tenant")}});
  CHECK(other.status == 404);
  CHECK(problem_code(other) == "operation_not_found");
  CHECK(other.body.find(order_id) == std::string::npos);
  CHECK(orders_of(db, tenant).size() == 1);
}
