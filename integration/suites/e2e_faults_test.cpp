// The stack under faults: a client that goes away, a backend that crashes after commit or
// rolls back, a sidecar killed mid-request, an outbox relay that delivers everything twice,
// a payment service that fails after charging. After each, the rows in PostgreSQL must
// show every effect exactly once.
#include <csignal>
#include <future>
#include <set>

#include "common.hpp"
#include "e2e_stack.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::e2e;

namespace {

void wait_for_lease_expiry(Db& db, const std::string& tenant, const std::string& key) {
  // Leases follow the database clock: poll the row, not our own clock.
  wait_until(
      [&] {
        auto row = read_row(db, tenant, key);
        return row && row->state == "in_progress" && row->lease_expired;
      },
      10s, "the idempotency record's lease to lapse");
}


}  // namespace

TEST_CASE("e2e: a client that disconnects after sending gets the same order on its retry") {
  OrderStack stack;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));

  {
    RawConnection conn(stack.sidecar().port());
    std::string request =
        "POST /orders HTTP/1.1\r\nHost: sidecar\r\n"
        "Content-Type: application/json\r\nX-Tenant-Id: " +
        tenant + "\r\nIdempotency-Key: " + key +
        "\r\nX-Demo-Delay-Ms: 300\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
        body;
    conn.send(request);
    conn.close();  // gone before the backend even started: nobody reads the answer
  }
  // The order commits anyway, and the sidecar records the answer nobody read.
  wait_until([&] { return counts(db, tenant).idempotency_completed == 1; }, 10s,
             "the abandoned request to complete");
  CHECK(counts(db, tenant).orders == 1);

  auto client = stack.client();
  const auto retry = client.post("/orders", body, order_headers(tenant, key));
  CHECK(retry.status == 201);
  CHECK(retry.header("Idempotent-Replayed") == "true");
  const auto orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  CHECK(json_string(retry, "order_id") == orders[0].order_id);

  const auto c = wait_for_delivery(db, tenant, 1);
  CHECK(footprint(c) == kOneOperation);
}

TEST_CASE("e2e: the backend crashes after commit; the retry gets the original order") {
  OrderStack stack;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  auto client = stack.client();

  // The API commits the order and its event, then dies before answering.
  const auto lost =
      client.post("/orders", body, order_headers(tenant, key, {{"X-Fault", "crash-after-commit"}}));
  // The connection closed without an answer: the outcome is unknown to the sidecar.
  CHECK(lost.status == 504);
  CHECK(problem_code(lost) == "upstream_timeout");
  const auto exit = stack.api().process().wait_exit(5s);
  REQUIRE(exit);
  CHECK(exit->code() == 99);
  auto c = counts(db, tenant);
  CHECK(c.orders == 1);
  CHECK(c.outbox == 1);
  const auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");  // kept, so that the retry re-executes the operation

  stack.api().restart();
  wait_for_lease_expiry(db, tenant, key);
  auto retry_client = stack.client();
  const auto retry = retry_client.post("/orders", body, order_headers(tenant, key));
  CHECK(retry.status == 201);
  CHECK_FALSE(retry.has_header("Idempotent-Replayed"));  // re-executed, not replayed
  const auto orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  // Found through the operation id, not created again.
  CHECK(json_string(retry, "order_id") == orders[0].order_id);
  CHECK(orders[0].attempt == 2);
  const auto after = read_row(db, tenant, key);
  REQUIRE(after);
  CHECK(after->state == "completed");
  CHECK(after->attempt == 2);

  c = wait_for_delivery(db, tenant, 1);
  CHECK(footprint(c) == kOneOperation);
}

TEST_CASE("e2e: the sidecar is killed mid-request; after its lease a retry takes over, one order") {
  OrderStack stack;  // lease 1s
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  const std::uint16_t port = stack.sidecar().port();

  // The API commits, then holds its answer long enough for the sidecar to die.
  auto doomed = std::async(std::launch::async, [&] {
    HttpClient client(port);
    try {
      client.post("/orders", body,
                  order_headers(tenant, key, {{"X-Fault", "delay-after-commit=3000"}}), 20s);
      return false;
    } catch (const std::exception&) {
      return true;  // the connection died with the sidecar
    }
  });
  wait_until([&] { return counts(db, tenant).orders == 1; }, 10s, "the order to commit");
  stack.sidecar().kill9();
  CHECK(doomed.get());
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");
  CHECK(row->attempt == 1);

  stack.sidecar().restart();
  const auto retry = retry_until_settled(stack, body, order_headers(tenant, key));
  CHECK(retry.status == 201);
  const auto orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  CHECK(json_string(retry, "order_id") == orders[0].order_id);
  CHECK(orders[0].attempt == 2);
  row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 2);

  const auto c = wait_for_delivery(db, tenant, 1);
  CHECK(footprint(c) == kOneOperation);
}

TEST_CASE("e2e: the backend rolls back; the same key succeeds once on retry") {
  OrderStack stack;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  auto client = stack.client();

  const auto failed =
      client.post("/orders", body, order_headers(tenant, key, {{"X-Fault", "rollback"}}));
  CHECK(failed.status == 500);
  auto c = counts(db, tenant);
  CHECK(c.orders == 0);
  CHECK(c.outbox == 0);
  CHECK(c.idempotency_rows == 0);  // a 5xx is not recorded: the key is free again

  const auto retry = client.post("/orders", body, order_headers(tenant, key));
  CHECK(retry.status == 201);
  CHECK_FALSE(retry.has_header("Idempotent-Replayed"));
  const auto replay = client.post("/orders", body, order_headers(tenant, key));
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == retry.body);

  c = wait_for_delivery(db, tenant, 1);
  CHECK(footprint(c) == kOneOperation);
}

namespace {

void set_api_faults(OrderStack& stack, const std::string& json) {
  auto api = stack.api_client();
  const auto res = api.request("PUT", "/_faults", {{"Content-Type", "application/json"}}, json);
  REQUIRE(res.status == 200);
}

}  // namespace

TEST_CASE("e2e: the API fails after its commit; the retry gets the order the failure hid") {
  OrderStack stack;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  auto client = stack.client();

  set_api_faults(stack, R"({"fail_next":1,"fail_mode":"after_commit","fail_status":503})");
  const auto failed = client.post("/orders", body, order_headers(tenant, key));
  CHECK(failed.status == 503);
  CHECK(problem_code(failed) == "injected_fault");
  auto c = counts(db, tenant);
  CHECK(c.orders == 1);            // committed before the failure
  CHECK(c.idempotency_rows == 0);  // a 5xx: the sidecar released the key

  const auto retry = client.post("/orders", body, order_headers(tenant, key));
  CHECK(retry.status == 201);
  const auto orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  CHECK(json_string(retry, "order_id") == orders[0].order_id);

  // before_commit: nothing is written at all.
  const auto other = unique("key");
  set_api_faults(stack, R"({"fail_every":1,"fail_mode":"before_commit"})");
  CHECK(client.post("/orders", order_body(unique("checkout")), order_headers(tenant, other)).status ==
        503);
  CHECK(counts(db, tenant).orders == 1);
  set_api_faults(stack, "{}");
  CHECK(client.post("/orders", order_body(unique("checkout")), order_headers(tenant, other)).status ==
        201);
  CHECK(counts(db, tenant).orders == 2);
}

TEST_CASE("e2e: after a failure that hid a commit, the key with another order is refused, not answered with the first") {
  OrderStack stack;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto checkout = unique("checkout");
  auto client = stack.client();

  set_api_faults(stack, R"({"fail_next":1,"fail_mode":"after_commit"})");
  CHECK(client.post("/orders", order_body(checkout, 1000), order_headers(tenant, key)).status == 503);
  // The key is free again for the sidecar, so another body is a new operation to it; but
  // the operation id already has the first body's order, which is not this request's.
  const auto reused = client.post("/orders", order_body(checkout, 2000), order_headers(tenant, key));
  CHECK(reused.status == 422);
  CHECK(problem_code(reused) == "operation_id_reused");
  CHECK(counts(db, tenant).orders == 1);
  // Recorded like any business refusal: the first body now meets another fingerprint.
  const auto first_again = client.post("/orders", order_body(checkout, 1000), order_headers(tenant, key));
  CHECK(first_again.status == 409);
  CHECK(problem_code(first_again) == "idempotency_key_reused");
}

TEST_CASE("e2e: every claim of a key reaches the backend with a fencing token of its own") {
  StackOptions o;
  o.record_arrivals = true;
  OrderStack stack(o);
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  auto client = stack.client();

  // Two released claims and the one that completes: attempt 1 each time (the key was free
  // again), and three different tokens.
  set_api_faults(stack, R"({"fail_next":2,"fail_mode":"before_commit"})");
  CHECK(client.post("/orders", body, order_headers(tenant, key)).status == 503);
  CHECK(client.post("/orders", body, order_headers(tenant, key)).status == 503);
  CHECK(client.post("/orders", body, order_headers(tenant, key)).status == 201);
  const auto rows = db.query(
      "SELECT attempt::text, fencing_token::text FROM demo_orders.arrivals WHERE tenant_id = $1 "
      "ORDER BY arrival_id",
      {tenant});
  REQUIRE(rows.size() == 3);
  std::set<std::string> tokens;
  for (const auto& r : rows) {
    CHECK(r.at(0) == "1");
    REQUIRE(r.at(1));
    tokens.insert(*r.at(1));
  }
  CHECK(tokens.size() == 3);
}

TEST_CASE("e2e: every outbox event delivered twice still charges and reserves once") {
  StackOptions o;
  o.deliver_twice = true;
  OrderStack stack(o);
  Db db(database_url());
  const auto tenant = unique("tenant");
  auto client = stack.client();
  for (int i = 0; i < 3; ++i) {
    const auto res = client.post("/orders", order_body(unique("checkout")),
                                 order_headers(tenant, unique("key")));
    REQUIRE(res.status == 201);
  }

  const auto c = wait_for_delivery(db, tenant, 3);
  CHECK(c.orders == 3);
  CHECK(c.outbox == 3);
  CHECK(c.charges == 3);
  CHECK(c.reservations == 3);
  // Proof that the duplicates really arrived: each service saw each event twice.
  for (const char* table : {"demo_payments.processed_events", "demo_inventory.processed_events"}) {
    CAPTURE(table);
    CHECK(db.scalar_int(std::string("SELECT count(*) FROM ") + table +
                            " WHERE tenant_id = $1 AND deliveries = 2",
                        {tenant}) == 3);
  }
}

TEST_CASE("e2e: a payment service that fails after charging is retried; one charge") {
  OrderStack stack;
  Db db(database_url());
  const auto tenant = unique("tenant");
  // Events other tests left undelivered would otherwise use up the injected failures.
  wait_until(
      [&] {
        return db.scalar_int(
                   "SELECT count(*) FROM demo_orders.outbox "
                   "WHERE delivered_at IS NULL AND dead_at IS NULL") == 0;
      },
      15s, "the outbox to drain");
  HttpClient payments(stack.payments().port());
  const auto set = payments.request("PUT", "/_faults", {{"Content-Type", "application/json"}},
                                    R"({"fail_next":2,"fail_mode":"after_effect"})");
  REQUIRE(set.status == 200);

  auto client = stack.client();
  REQUIRE(
      client.post("/orders", order_body(unique("checkout")), order_headers(tenant, unique("key")))
          .status == 201);

  const auto c = wait_for_delivery(db, tenant, 1);
  CHECK(c.charges == 1);
  CHECK(c.reservations == 1);
  CHECK(db.scalar_int("SELECT deliveries FROM demo_payments.processed_events WHERE tenant_id = $1",
                      {tenant}) == 3);
  CHECK(db.scalar_int("SELECT attempts FROM demo_orders.outbox WHERE tenant_id = $1", {tenant}) ==
        3);
}

TEST_CASE("e2e: fault switches are off unless the process was started to allow them") {
  Db db(database_url());
  const auto tenant = unique("tenant");
  Process api(ProcessOptions{
      .executable = order_backend_binary(),
      .args = {"api", "--database-url", database_url(), "--listen", "127.0.0.1:0"},
      .name = "order_backend_api_plain",
  });
  const auto line = api.wait_for_output("LISTENING ");
  HttpClient client(static_cast<std::uint16_t>(std::stoul(line.substr(line.find(' ') + 1))));
  const auto res = client.post("/orders", order_body(unique("checkout")),
                               {{"Content-Type", "application/json"},
                                {"X-Tenant-Id", tenant},
                                {"X-Fault", "crash-after-commit"}});
  CHECK(res.status == 201);
  CHECK(api.running());
  CHECK(counts(db, tenant).orders == 1);

  CHECK(client.get("/_faults").status == 404);  // the runtime switches do not exist either

  for (const char* command : {"relay", "api"}) {
    CAPTURE(command);
    const auto refused = run_command(ProcessOptions{
        .executable = order_backend_binary(),
        .args = {command, "--database-url", database_url(),
                 std::string(command) == "relay" ? "--fault-deliver-twice" : "--record-arrivals"},
    });
    CHECK(refused.status.code() == 2);
    CHECK(refused.output.find("--enable-fault-injection") != std::string::npos);
  }
}
