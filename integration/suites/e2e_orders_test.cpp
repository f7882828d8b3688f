// The guarantees of the whole stack — sidecar, order API, outbox relay, payment and
// inventory services — proven by counting rows in PostgreSQL, not by reading 200s.
// Faults (crashes, rollbacks, redeliveries) are in e2e_faults_test.cpp.
#include <set>
#include <tuple>

#include "common.hpp"
#include "e2e_stack.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::e2e;

TEST_CASE("e2e: 50 concurrent requests with one key make one order, one charge, one reservation") {
  StackOptions o;
  o.wait = "5s";  // duplicates wait for the first and replay it; in-progress is also allowed
  o.lease = "10s";
  OrderStack stack(o);
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));

  // The API takes 300 ms over the first so the other 49 arrive while it runs.
  auto results = concurrently(50, [&](std::size_t) {
    HttpClient client = stack.client();
    return client.post("/orders", body, order_headers(tenant, key, {{"X-Demo-Delay-Ms", "300"}}),
                       20s);
  });
  require_all_ok(results);

  std::set<std::string> bodies;
  int created = 0;
  int in_progress = 0;
  for (auto& r : results) {
    auto& res = r.get();
    if (res.status == 201) {
      ++created;
      bodies.insert(res.body);
    } else {
      CHECK(res.status == 409);
      CHECK(problem_code(res) == "idempotency_in_progress");
      ++in_progress;
    }
  }
  CHECK(created + in_progress == 50);
  CHECK(created >= 1);
  CHECK(bodies.size() == 1);  // every success is the same order, byte for byte

  const auto c = wait_for_delivery(db, tenant, 1);
  CHECK(footprint(c) == kOneOperation);
  CHECK(c.idempotency_completed == 1);
  const auto orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  CHECK(json_member(*bodies.begin(), "order_id") == orders[0].order_id);
  CHECK(orders[0].attempt == 1);
}

TEST_CASE("e2e: the same key with other parameters is refused and still makes one order") {
  OrderStack stack;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto checkout = unique("checkout");
  auto client = stack.client();

  const auto first = client.post("/orders", order_body(checkout, 1000), order_headers(tenant, key));
  REQUIRE(first.status == 201);
  const auto other = client.post("/orders", order_body(checkout, 2000), order_headers(tenant, key));
  CHECK(other.status == 409);
  CHECK(problem_code(other) == "idempotency_key_reused");
  // Same parameters in another spelling (member order, 1e3): the same operation.
  const std::string respelled = R"({"items":[{"sku":"A-1","qty":2}],"amount":1e3,"checkout_id":")" +
                                checkout + R"(","customer_id":"c-42"})";
  const auto replay = client.post("/orders", respelled, order_headers(tenant, key));
  CHECK(replay.status == 201);
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == first.body);

  const auto c = wait_for_delivery(db, tenant, 1);
  CHECK(footprint(c) == kOneOperation);
}

TEST_CASE(
    "e2e: after the key's retention the key is a new operation, but a checkout has one order") {
  OrderStack stack;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto checkout = unique("checkout");
  auto client = stack.client();

  const auto first = client.post("/orders", order_body(checkout), order_headers(tenant, key));
  REQUIRE(first.status == 201);
  const auto first_order = json_string(first, "order_id");
  auto orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  REQUIRE(orders[0].operation_id);
  const std::string operation_id = *orders[0].operation_id;

  // Retention passes for both: the sidecar's record and the API's operation id (they are
  // configured with the same retention; see docs/demo.md). Moved in SQL, not waited for.
  const auto expire = [&] {
    CHECK(db.exec("UPDATE idempotency_requests SET expires_at = now() - interval '1 second' "
                  "WHERE tenant_id = $1",
                  {tenant}) == 1);
    db.exec(
        "UPDATE demo_orders.orders SET operation_expires_at = now() - interval '1 second' "
        "WHERE tenant_id = $1 AND operation_id IS NOT NULL",
        {tenant});
  };
  expire();

  // The same key and the same checkout: a new operation (the sidecar forwards it, with the
  // same operation id), and the business key refuses a second order.
  const auto again = client.post("/orders", order_body(checkout), order_headers(tenant, key));
  CHECK(again.status == 409);
  CHECK(problem_code(again) == "checkout_already_ordered");
  CHECK(json_string(again, "order_id") == first_order);
  CHECK_FALSE(again.has_header("Idempotent-Replayed"));
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->status == 409);
  orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 1);
  CHECK_FALSE(orders[0].operation_id);  // retired: it now names the new operation
  CHECK(orders[0].retired_operation_id == operation_id);

  // Once more after retention, now with another checkout: a genuinely new order, which the
  // old order's operation id must not swallow.
  expire();
  const auto other_checkout = unique("checkout");
  const auto second =
      client.post("/orders", order_body(other_checkout), order_headers(tenant, key));
  CHECK(second.status == 201);
  const auto second_order = json_string(second, "order_id");
  CHECK(second_order != first_order);
  CHECK_FALSE(second.has_header("Idempotent-Replayed"));
  const auto replay =
      client.post("/orders", order_body(other_checkout), order_headers(tenant, key));
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == second.body);

  const auto c = wait_for_delivery(db, tenant, 2);
  CHECK(c.orders == 2);
  CHECK(c.idempotency_rows == 1);
  CHECK(c.outbox == 2);
  CHECK(c.charges == 2);
  CHECK(c.reservations == 2);
  orders = orders_of(db, tenant);
  REQUIRE(orders.size() == 2);
  CHECK(orders[1].order_id == second_order);
  CHECK(orders[1].operation_id == operation_id);
  CHECK(orders[1].checkout_id == other_checkout);
}

TEST_CASE("e2e: two tenants with the same key and checkout are isolated") {
  OrderStack stack;
  Db db(database_url());
  const auto tenant_a = unique("tenant-a");
  const auto tenant_b = unique("tenant-b");
  const auto key = unique("key");
  const auto body = order_body(unique("checkout"));
  auto client = stack.client();

  const auto a = client.post("/orders", body, order_headers(tenant_a, key));
  const auto b = client.post("/orders", body, order_headers(tenant_b, key));
  REQUIRE(a.status == 201);
  REQUIRE(b.status == 201);
  CHECK_FALSE(b.has_header("Idempotent-Replayed"));
  const auto order_a = json_string(a, "order_id");
  const auto order_b = json_string(b, "order_id");
  CHECK(order_a != order_b);

  for (const auto& [tenant, mine, theirs] :
       {std::tuple{tenant_a, order_a, order_b}, std::tuple{tenant_b, order_b, order_a}}) {
    CAPTURE(tenant);
    const auto own = client.get("/orders/" + mine, {{"X-Tenant-Id", tenant}});
    CHECK(own.status == 200);
    CHECK(json_string(own, "order_id") == mine);
    const auto other = client.get("/orders/" + theirs, {{"X-Tenant-Id", tenant}});
    CHECK(other.status == 404);
    CHECK(problem_code(other) == "order_not_found");
    const auto c = wait_for_delivery(db, tenant, 1);
    CHECK(footprint(c) == kOneOperation);
  }
  // The operation id includes the tenant: the two orders never shared one.
  const auto ops = db.scalar_int(
      "SELECT count(DISTINCT operation_id) FROM demo_orders.orders WHERE tenant_id IN ($1, $2)",
      {tenant_a, tenant_b});
  CHECK(ops == 2);
}

TEST_CASE("e2e: business rejections are stable 422s, replayed, and create nothing") {
  OrderStack stack;
  Db db(database_url());
  const auto tenant = unique("tenant");
  auto client = stack.client();

  const auto key = unique("key");
  const auto zero = client.post("/orders", order_body("", 0), order_headers(tenant, key));
  CHECK(zero.status == 422);
  CHECK(problem_code(zero) == "invalid_amount");
  const auto zero_again = client.post("/orders", order_body("", 0), order_headers(tenant, key));
  CHECK(zero_again.status == 422);
  CHECK(zero_again.header("Idempotent-Replayed") == "true");
  CHECK(zero_again.body == zero.body);

  const auto expired = client.post("/orders", order_body(unique("checkout"), 1000, "SPRING2020"),
                                   order_headers(tenant, unique("key")));
  CHECK(expired.status == 422);
  CHECK(problem_code(expired) == "coupon_expired");

  const auto valid = client.post("/orders", order_body(unique("checkout"), 1000, "WELCOME10"),
                                 order_headers(tenant, unique("key")));
  CHECK(valid.status == 201);
  CHECK(valid.body.find(R"("total":900)") != std::string::npos);

  const auto c = wait_for_delivery(db, tenant, 1);
  CHECK(c.orders == 1);
  CHECK(c.idempotency_rows == 3);  // the rejections are recorded answers too
  CHECK(c.outbox == 1);
  CHECK(c.charges == 1);
  CHECK(db.scalar_int("SELECT amount FROM demo_payments.charges WHERE tenant_id = $1", {tenant}) ==
        900);
}

TEST_CASE("e2e: an attempt older than the one recorded on the order changes nothing") {
  // Straight to the API, as a straggler of a superseded attempt would arrive.
  OrderStack stack;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const std::string operation(64, 'c');
  const auto body = order_body(unique("checkout"));
  auto api = stack.api_client();
  const auto send = [&](int attempt) {
    return api.post("/orders", body,
                    {{"Content-Type", "application/json"},
                     {"X-Tenant-Id", tenant},
                     {"X-Idempotency-Operation-Id", operation},
                     {"X-Idempotency-Attempt", std::to_string(attempt)}});
  };

  const auto second = send(2);
  REQUIRE(second.status == 201);
  const auto version =
      db.scalar("SELECT xmin::text FROM demo_orders.orders WHERE tenant_id = $1", {tenant});
  const auto stale = send(1);
  CHECK(stale.status == 201);
  CHECK(stale.body == second.body);
  // Not one column written: the row version is the same.
  CHECK(db.scalar("SELECT xmin::text FROM demo_orders.orders WHERE tenant_id = $1", {tenant}) ==
        version);
  CHECK(orders_of(db, tenant).at(0).attempt == 2);

  const auto third = send(3);
  CHECK(third.body == second.body);
  CHECK(orders_of(db, tenant).at(0).attempt == 3);
  CHECK(counts(db, tenant).outbox == 1);
}
