// Security, class 5 of issue 10: one target normalization before route matching and
// forwarding; forms a backend could read as a route, but that are not its exact form,
// are refused instead of passed through unprotected.
#include "security_common.hpp"

using namespace idem::it;
using namespace idem::it::security;

TEST_CASE("security: targets a backend normalizes to a route are protected as that route") {
  World w;
  const std::vector<std::string> targets = {"/%6Frders", "/./orders", "/x/../orders",
                                            "/%2e/orders", "http://front.example/orders"};
  for (const auto& target : targets) {
    CAPTURE(target);
    const auto key = unique("key");
    auto first = w.raw(raw_post(target, "X-Tenant-Id: " + w.tenant + "\r\nIdempotency-Key: " + key + "\r\n",
                                with_length(kOrder)));
    CHECK(first.status == 201);
    auto row = read_row(w.db, w.tenant, key);
    REQUIRE(row);  // claimed as the route's record
    CHECK(row->state == "completed");
    // The same key on the plain path is the same operation: a replay.
    auto again = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
    CHECK(again.status == 201);
    CHECK(again.header("Idempotent-Replayed") == "true");
    CHECK(again.body == first.body);
  }
  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == targets.size());
  for (const auto& call : calls) {
    CHECK(call.target == "/orders");  // the backend runs what was matched
    CHECK(call.header("X-Idempotency-Attempt") == "1");
    CHECK(call.headers_named("Host").size() == 1);
  }
  CHECK(calls.back().header("Host") == "front.example");  // absolute-form's authority
  CHECK(w.rows() == static_cast<std::int64_t>(targets.size()));
}

TEST_CASE("security: ambiguous targets and fragments are refused, never passed through") {
  World w;
  for (const std::string target :
       {"//orders", "/orders/", "/ORDERS", "/orders;x=1", "/orders.", "/a/..%2Forders",
        "/orders#f", "/ord%zzers", "/%00orders", "/or\\ders", "ftp://h/orders", "http://u@h/orders",
        "orders"}) {
    CAPTURE(target);
    auto res = w.raw(raw_post(target, "X-Tenant-Id: " + w.tenant + "\r\nIdempotency-Key: " + unique("k") + "\r\n",
                              with_length(kOrder)));
    CHECK(res.status == 400);
    CHECK(problem_code(res) == "bad_request");
  }
  // The method read loosely, too: a backend that matches "post" as POST runs the create.
  auto lower = w.raw("post /orders HTTP/1.1\r\nHost: a\r\nX-Tenant-Id: " + w.tenant +
                     "\r\nContent-Type: application/json\r\nIdempotency-Key: k\r\n" + with_length(kOrder));
  CHECK(lower.status == 400);
  CHECK(w.calls().empty());
  CHECK(w.rows() == 0);
}

TEST_CASE("security: unmatched targets are normalized the same way before forwarding") {
  World w;
  HttpClient client(w.sidecar->port());
  auto res = client.get("/notes/./a/../b?q=%6f%2f", {{"X-Tenant-Id", w.tenant}});
  CHECK(res.status == 200);
  auto other = client.get("/notes//c/", {{"X-Tenant-Id", w.tenant}});  // near no route
  CHECK(other.status == 200);
  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].target == "/notes/b?q=o%2F");
  CHECK(calls[1].target == "/notes//c/");
  CHECK(w.rows() == 0);
}

TEST_CASE("security: a method override cannot turn a request into a route's method") {
  World w([](SidecarOptions& o) {
    RouteOptions update;
    update.name = "update-order";
    update.method = "PUT";
    update.path = "/orders/{id}";
    o.routes.push_back(update);
  });
  // POST /orders/1 is no route, but a backend honouring the override runs PUT /orders/1.
  auto res = w.client->post("/orders/1", kOrder,
                            order_headers(w.tenant, unique("k"), {{"X-HTTP-Method-Override", "PUT"}}));
  CHECK(res.status == 400);
  CHECK(problem_code(res) == "bad_request");
  auto on_route = w.client->post("/orders", kOrder,
                                 order_headers(w.tenant, unique("k"), {{"X-HTTP-Method-Override", "DELETE"}}));
  CHECK(on_route.status == 400);
  CHECK(w.calls().empty());
  CHECK(w.rows() == 0);
}
