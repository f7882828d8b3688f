// Completion in the backend's own transaction (routes with `completion: backend`,
// docs/backend.md), end to end against the reference order API: the order, its outbox
// event and the idempotency result commit together, a stale attempt cannot create an
// order, the backend's directives release and record as told, and verify-backend
// certifies the API.
#include <csignal>
#include <future>

#include "common.hpp"
#include "e2e_stack.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::e2e;

namespace {

StackOptions backend_mode() {
  StackOptions o;
  o.completion = "backend";
  o.record_arrivals = true;
  return o;
}

std::int64_t arrivals(Db& db, const std::string& tenant) {
  return db.scalar_int("SELECT count(*) FROM demo_orders.arrivals WHERE tenant_id = $1", {tenant});
}

// The order, its event and the idempotency record were written by one transaction. The
// relay updates the event when it delivers it (a new row version, a new xmin): hold it
// (SIGSTOP) until this has been checked.
bool one_transaction(Db& db, const std::string& tenant) {
  return db.scalar(
             "SELECT (SELECT xmin::text FROM demo_orders.orders WHERE tenant_id = $1) ="
             "       (SELECT xmin::text FROM demo_orders.outbox WHERE tenant_id = $1)"
             "   AND (SELECT xmin::text FROM demo_orders.orders WHERE tenant_id = $1) ="
             "       (SELECT xmin::text FROM idempotency_requests WHERE tenant_id = $1)",
             {tenant}) == "t";
}

void wait_for_lease_expiry(Db& db, const std::string& tenant, const std::string& key) {
  wait_until(
      [&] {
        auto row = read_row(db, tenant, key);
        return row && row->state == "in_progress" && row->lease_expired;
      },
      10s, "the idempotency record's lease to lapse");
}

}  // namespace

TEST_CASE("e2e backend completion: the order, its event and the idempotency result are one commit") {
  OrderStack stack(backend_mode());
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  auto client = stack.client();
  stack.relay().process().signal(SIGSTOP);

  const auto created = client.post("/orders", body, order_headers(tenant, key));
  REQUIRE(created.status == 201);
  CHECK_FALSE(created.has_header("X-Idempotency-Recorded"));  // the backend's word stays inside
  CHECK(one_transaction(db, tenant));
  stack.relay().process().signal(SIGCONT);
  const auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->body == created.body);
  CHECK(row->resource_id == created.header("Location"));
  CHECK(footprint(wait_for_delivery(db, tenant, 1)) == kOneOperation);

  const auto replay = client.post("/orders", body, order_headers(tenant, key));
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == created.body);
  CHECK(arrivals(db, tenant) == 1);
}

TEST_CASE("e2e backend completion: the sidecar killed after the backend's commit, the retry replays without a second call") {
  OrderStack stack(backend_mode());
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));

  stack.relay().process().signal(SIGSTOP);
  // The API commits, then holds its answer; the sidecar dies meanwhile.
  auto lost = std::async(std::launch::async, [&] {
    auto client = stack.client();
    try {
      client.post("/orders", body, order_headers(tenant, key, {{"X-Fault", "delay-after-commit=3000"}}),
                  30s);
    } catch (const std::exception&) {
    }
  });
  wait_until([&] { return db.scalar_int("SELECT count(*) FROM demo_orders.orders WHERE tenant_id = $1", {tenant}) == 1; },
             10s, "the order to commit");
  stack.sidecar().kill9();
  lost.get();
  // Committed with the order: the record holds the answer nobody received.
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(one_transaction(db, tenant));
  stack.relay().process().signal(SIGCONT);

  stack.sidecar().restart();
  auto client = stack.client();
  const auto retry = client.post("/orders", body, order_headers(tenant, key));
  CHECK(retry.status == 201);
  CHECK(retry.header("Idempotent-Replayed") == "true");
  CHECK(retry.body == row->body);
  CHECK(arrivals(db, tenant) == 1);  // the retry never reached the API
  CHECK(footprint(wait_for_delivery(db, tenant, 1)) == kOneOperation);
}

// Attempt 1 reaches the API, which is slow to start; its sidecar pauses past the lease and
// a takeover forwards attempt 2, slower still. Attempt 1's transaction runs first, while
// attempt 2 owns the record: idemproxy_complete() refuses it, and its order rolls back.
TEST_CASE("e2e backend completion: a stale attempt cannot create an order; the database refuses its transaction") {
  OrderStack stack(backend_mode());
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  Sidecar fresh(stack.sidecar_options());
  stack.relay().process().signal(SIGSTOP);

  auto stale_answer = std::async(std::launch::async, [&] {
    auto client = stack.client();
    return client.post("/orders", body, order_headers(tenant, key, {{"X-Demo-Delay-Ms", "2500"}}), 30s);
  });
  wait_until([&] { return arrivals(db, tenant) == 1; }, 10s, "attempt 1 to reach the API");
  stack.sidecar().signal(SIGSTOP);
  wait_for_lease_expiry(db, tenant, key);

  auto fresh_answer = std::async(std::launch::async, [&] {
    HttpClient client(fresh.port());
    return client.post("/orders", body, order_headers(tenant, key, {{"X-Demo-Delay-Ms", "4000"}}), 30s);
  });
  wait_until([&] { return arrivals(db, tenant) == 2; }, 10s, "attempt 2 to reach the API");
  // Attempt 1's statement runs (2.5 s after it arrived) and is refused: still no order.
  wait_until([&] { return stack.api().log_tail(200).find("no longer owns its record") != std::string::npos; },
             10s, "the API to refuse the stale attempt");
  CHECK(db.scalar_int("SELECT count(*) FROM demo_orders.orders WHERE tenant_id = $1", {tenant}) == 0);
  CHECK(db.scalar_int("SELECT count(*) FROM demo_orders.outbox WHERE tenant_id = $1", {tenant}) == 0);

  const auto created = fresh_answer.get();
  CHECK(created.status == 201);
  stack.sidecar().signal(SIGCONT);
  const auto stale = stale_answer.get();
  // The stale owner answers from the record, never with the API's refusal of its attempt.
  CHECK((stale.status == 201 || problem_code(stale) == "idempotency_in_progress"));
  if (stale.status == 201) CHECK(stale.body == created.body);

  CHECK(db.scalar_int("SELECT attempt FROM demo_orders.orders WHERE tenant_id = $1", {tenant}) == 2);
  CHECK(one_transaction(db, tenant));
  stack.relay().process().signal(SIGCONT);
  const auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 2);
  CHECK(row->body == created.body);
  CHECK(footprint(wait_for_delivery(db, tenant, 1)) == kOneOperation);
}

TEST_CASE("e2e backend completion: the API's directive releases a malformed request and records a rejection") {
  SUBCASE("release: the corrected request with the same key runs") {
    OrderStack stack(backend_mode());
    Db db(database_url());
    const auto tenant = unique("tenant");
    const auto key = unique("key");
    auto client = stack.client();
    // Valid JSON the API refuses: no customer_id.
    const auto refused = client.post("/orders", R"({"currency":"EUR","amount":1000,"items":[{"sku":"A","qty":1}]})",
                                     order_headers(tenant, key));
    CHECK(refused.status == 400);
    CHECK_FALSE(refused.has_header("X-Idempotency-Directive"));
    CHECK(count_rows(db, tenant) == 0);  // released, not remembered
    const auto fixed = client.post("/orders", order_body(unique("checkout")), order_headers(tenant, key));
    CHECK(fixed.status == 201);
    CHECK_FALSE(fixed.has_header("Idempotent-Replayed"));
    CHECK(read_row(db, tenant, key)->state == "completed");
  }
  SUBCASE("record: a business rejection is remembered although the route stores only 2xx") {
    StackOptions o = backend_mode();
    o.store_statuses = {"2xx"};
    OrderStack stack(o);
    Db db(database_url());
    const auto tenant = unique("tenant");
    const auto key = unique("key");
    auto client = stack.client();
    const auto body = order_body(unique("checkout"), 1000, "SPRING2020");
    const auto expired = client.post("/orders", body, order_headers(tenant, key));
    CHECK(expired.status == 422);
    CHECK(problem_code(expired) == "coupon_expired");
    const auto row = read_row(db, tenant, key);
    REQUIRE(row);
    CHECK(row->state == "completed");
    CHECK(row->status == 422);
    const auto again = client.post("/orders", body, order_headers(tenant, key));
    CHECK(again.header("Idempotent-Replayed") == "true");
    CHECK(again.body == expired.body);
    CHECK(arrivals(db, tenant) == 1);
  }
}

TEST_CASE("e2e: verify-backend passes against the reference API, in both modes") {
  for (const char* mode : {"backend", "sidecar"}) {
    CAPTURE(mode);
    StackOptions o;
    o.completion = mode;
    OrderStack stack(o);
    TempDir dir("verify");
    const auto order = dir.write_file("order.json", order_body());
    const auto bad = dir.write_file("bad.json", R"({"currency":"EUR","amount":1000,"items":[]})");
    const auto config = dir.write_file(
        "sidecar.yaml", "listen: \"127.0.0.1:0\"\n"
                        "upstream:\n  url: \"" + stack.api().url() + "\"\n"
                        "database:\n  url: \"" + database_url() + "\"\n"
                        "routes:\n  - name: create-order\n    method: POST\n    path: /orders\n"
                        "    completion: " + std::string(mode) + "\n");
    const auto r = run_idemproxy({"verify-backend", "--config", config.string(), "--route",
                                  "create-order", "--body", order.string(), "--release-body",
                                  bad.string(), "--tenant", unique("verify")});
    INFO(r.output);
    CHECK(r.status.code() == 0);
    CHECK(r.output.find("[ok]   operation-id deduplication") != std::string::npos);
    CHECK(r.output.find("[ok]   release directive") != std::string::npos);
    if (std::string(mode) == "backend") {
      CHECK(r.output.find("[ok]   stale attempt fenced by the database") != std::string::npos);
      CHECK(r.output.find("[ok]   completion in the backend's transaction") != std::string::npos);
    }
    CHECK(r.output.find("[FAIL]") == std::string::npos);
  }
}

// The API used to need --operation-retention equal to the route's retention; the record's
// lifetime headers make it irrelevant for the sidecar's requests. With a window of 1 ms,
// a later attempt of the same operation (a takeover after a lost answer) would have made a
// second order; the record's own expiry keeps it one operation.
TEST_CASE("e2e: the record's lifetime, not the API's window, tells a retry from a new generation") {
  StackOptions o;
  o.api_retention = "1ms";
  OrderStack stack(o);
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  auto client = stack.client();
  const auto created = client.post("/orders", body, order_headers(tenant, key));
  REQUIRE(created.status == 201);
  const auto operation_id = db.scalar(
      "SELECT operation_id FROM demo_orders.orders WHERE tenant_id = $1", {tenant});
  REQUIRE(operation_id);
  // The order keeps the record's expiry (retention and one lease from the claim, which a
  // completion within the lease keeps: docs/architecture.md "The record"), not now() + 1 ms.
  CHECK(db.scalar("SELECT (o.operation_expires_at = r.expires_at AND"
                  "        r.expires_at = r.created_at + interval '24 hours' + $2::interval)::text"
                  " FROM demo_orders.orders o, idempotency_requests r"
                  " WHERE o.tenant_id = $1 AND r.tenant_id = $1",
                  {tenant, o.lease}).value_or("") == "true");
  const auto lifetime = db.query(
      "SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
      "       to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
      " FROM idempotency_requests WHERE tenant_id = $1",
      {tenant});
  REQUIRE(lifetime.size() == 1);

  // Attempt 2 of the same generation, well after the API's own 1 ms window: the order.
  auto api = stack.api_client();
  const auto retry = api.post("/orders", body,
                              {{"Content-Type", "application/json"},
                               {"X-Tenant-Id", tenant},
                               {"X-Idempotency-Operation-Id", *operation_id},
                               {"X-Idempotency-Attempt", "2"},
                               {"X-Idempotency-Record-Created", *lifetime[0][0]},
                               {"X-Idempotency-Record-Expires", *lifetime[0][1]}});
  CHECK(retry.status == 201);
  CHECK(retry.body == created.body);
  CHECK(db.scalar_int("SELECT count(*) FROM demo_orders.orders WHERE tenant_id = $1", {tenant}) == 1);

  // A record created after that expiry is a new generation: the id is retired, and the
  // checkout rule answers (same checkout, a new operation).
  const auto next = api.post("/orders", body,
                             {{"Content-Type", "application/json"},
                              {"X-Tenant-Id", tenant},
                              {"X-Idempotency-Operation-Id", *operation_id},
                              {"X-Idempotency-Attempt", "1"},
                              {"X-Idempotency-Record-Created", *lifetime[0][1]},
                              {"X-Idempotency-Record-Expires", "2999-01-01T00:00:00.000000Z"}});
  CHECK(next.status == 409);
  CHECK(problem_code(next) == "checkout_already_ordered");
  CHECK(db.scalar("SELECT retired_operation_id FROM demo_orders.orders WHERE tenant_id = $1",
                  {tenant}) == operation_id);
}

// With `encryption`, a backend-completed route stores clear records (the backend has no
// key): refused unless encryption.allow_clear_backend_records says so; with it, the clear
// record replays exactly, beside sealed ones.
TEST_CASE("e2e backend completion with encryption: refused without the opt-in; with it, clear records replay") {
  TempDir dir("keys");
  const auto key_file = dir.write_file("k.key", std::string(64, 'e') + "\n");
  const std::string encryption =
      "encryption:\n  keys:\n    - {id: k1, file: \"" + key_file.string() + "\"}\n  active: k1\n";

  // Without the opt-in: check-config and serve both refuse, naming the route and why.
  const auto config = dir.write_file(
      "sidecar.yaml", "listen: \"127.0.0.1:0\"\n"
                      "upstream:\n  url: \"http://127.0.0.1:9\"\n"
                      "database:\n  url: \"" + database_url() + "\"\n" + encryption +
                      "routes:\n  - name: create-order\n    method: POST\n    path: /orders\n"
                      "    completion: backend\n");
  for (const char* command : {"check-config", "serve"}) {
    CAPTURE(command);
    const auto r = run_idemproxy({command, "--config", config.string()});
    INFO(r.output);
    CHECK(r.status.code() == 2);
    CHECK(r.output.find("routes[0].completion") != std::string::npos);
    CHECK(r.output.find("in clear") != std::string::npos);
    CHECK(r.output.find("encryption.allow_clear_backend_records: true") != std::string::npos);
  }

  StackOptions o;
  o.completion = "backend";
  o.sidecar_yaml = encryption + "  allow_clear_backend_records: true\nreplay_cache:\n  enabled: false\n";
  OrderStack stack(o);
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  auto client = stack.client();
  const auto created = client.post("/orders", body, order_headers(tenant, key));
  REQUIRE(created.status == 201);
  // The backend wrote the record, in clear, as documented.
  const auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->body == created.body);
  CHECK(row->body.find(json_string(created, "order_id")) != std::string::npos);
  // Read from PostgreSQL (no replay cache) through the encrypting store: replayed as is.
  for (int i = 0; i < 2; ++i) {
    const auto replay = client.post("/orders", body, order_headers(tenant, key));
    CHECK(replay.status == 201);
    CHECK(replay.header("Idempotent-Replayed") == "true");
    CHECK(replay.body == created.body);
    CHECK(replay.header("Location") == created.header("Location"));
  }
  CHECK(orders_of(db, tenant).size() == 1);
}
