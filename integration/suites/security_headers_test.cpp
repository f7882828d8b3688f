// Security, classes 3, 4, 8 and 9 (Host and Connection) of issue 10: the headers idemproxy
// decides by reach the backend exactly as decided, or the request is refused.
#include "security_common.hpp"

using namespace idem::it;
using namespace idem::it::security;

TEST_CASE("security: Connection cannot remove the tenant, key or principal header") {
  World w;
  for (const std::string option : {"X-Tenant-Id", "Idempotency-Key", "X-User-Id", "x_tenant_id"}) {
    CAPTURE(option);
    HttpClient client(w.sidecar->port());
    auto res = client.post("/orders", kOrder,
                           order_headers(w.tenant, unique("key"),
                                         {{"X-User-Id", "alice"}, {"Connection", "keep-alive, " + option}}));
    CHECK(res.status == 400);
    CHECK(problem_code(res) == "bad_request");
  }
  // Not on an unmatched route either: the backend trusts the tenant header there too.
  HttpClient client(w.sidecar->port());
  auto other = client.get("/orders/1", {{"X-Tenant-Id", w.tenant}, {"Connection", "X-Tenant-Id"}});
  CHECK(other.status == 400);
  CHECK(w.calls().empty());
  CHECK(w.rows() == 0);

  // An option naming a field idemproxy does not decide by is honoured as before.
  auto ok = w.client->post("/orders", kOrder,
                           order_headers(w.tenant, unique("key"), {{"Connection", "X-Debug"}, {"X-Debug", "1"}}));
  CHECK(ok.status == 201);
  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 1);
  CHECK_FALSE(calls[0].header("X-Debug").has_value());
  CHECK(calls[0].header("Idempotency-Key").has_value());
  CHECK(w.rows() == 1);
}

TEST_CASE("security: a repeated principal header is refused") {
  World w;
  const auto key = unique("key");
  auto res = w.client->post("/orders", kOrder,
                            order_headers(w.tenant, key, {{"X-User-Id", "alice"}, {"X-User-Id", "mallory"}}));
  CHECK(res.status == 401);
  CHECK(problem_code(res) == "principal_invalid");
  CHECK(w.calls().empty());
  CHECK(w.rows() == 0);
}

TEST_CASE("security: header names that read as a trusted or scoping header for CGI are dropped") {
  World w;
  const std::string victim = unique("victim");
  const auto key = unique("key");
  auto res = w.client->post("/orders", kOrder,
                            order_headers(w.tenant, key,
                                          {{"X_Tenant_Id", victim},
                                           {"X_Idempotency_Operation_Id", std::string(64, 'f')},
                                           {"X_Idempotency_Attempt", "1"},
                                           {"X_Idempotency_Fencing_Token", "999999"},
                                           {"X_User_Id", "admin"},
                                           {"Idempotency_Key", "other"},
                                           {"X-Idempotency-Attempt", "7"}}));
  CHECK(res.status == 201);
  auto passed = w.client->get("/status", {{"X-Tenant-Id", w.tenant}, {"X_Tenant_Id", victim},
                                          {"X_Idempotency_Attempt", "9"}});
  CHECK(passed.status == 200);

  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 2);
  for (const auto& call : calls) {
    CHECK_FALSE(has_underscore_name(call));
    CHECK(call.headers_named("X-Tenant-Id") == std::vector<std::string>{w.tenant});
  }
  CHECK(calls[0].headers_named("X-Idempotency-Attempt") == std::vector<std::string>{"1"});
  CHECK(calls[0].headers_named("X-Idempotency-Fencing-Token").size() == 1);
  CHECK(calls[0].header("X-Idempotency-Fencing-Token") != "999999");
  CHECK(calls[0].header("X-Idempotency-Operation-Id") != std::string(64, 'f'));
  CHECK_FALSE(calls[1].header("X-Idempotency-Attempt").has_value());
  CHECK(w.rows() == 1);
  CHECK(count_rows(w.db, victim) == 0);
  auto row = read_row(w.db, w.tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
}

TEST_CASE("security: HTTP/1.1 without exactly one Host is refused with 400") {
  World w;
  const std::string rest = "X-Tenant-Id: " + w.tenant + "\r\nContent-Type: application/json\r\n"
                           "Idempotency-Key: " + unique("k") + "\r\n" + with_length(kOrder);
  for (const std::string target : {"/orders", "/notes"}) {
    CAPTURE(target);
    auto none = w.raw("POST " + target + " HTTP/1.1\r\n" + rest);
    CHECK(none.status == 400);
    CHECK(problem_code(none) == "bad_request");
    CHECK_FALSE(none.keep_alive);
    auto two = w.raw("POST " + target + " HTTP/1.1\r\nHost: a\r\nHost: b\r\n" + rest);
    CHECK(two.status == 400);
    auto bad = w.raw("POST " + target + " HTTP/1.1\r\nHost: a/b\r\n" + rest);
    CHECK(bad.status == 400);
  }
  CHECK(w.calls().empty());
  CHECK(w.rows() == 0);
}

TEST_CASE("security: Connection: close in a second Connection field is honoured") {
  World w;
  RawConnection conn(w.sidecar->port());
  conn.send("GET /status HTTP/1.1\r\nHost: a\r\nX-Tenant-Id: " + w.tenant +
            "\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n");
  auto res = conn.read_response();
  CHECK(res.status == 200);
  CHECK_FALSE(res.keep_alive);
  CHECK(conn.wait_closed(5s));
  auto calls = calls_for(w.backend, w.tenant);
  CHECK(calls.size() == 1);
}

TEST_CASE("security: a second Content-Type on a protected route is refused") {
  World w;
  auto res = w.client->post("/orders", kOrder,
                            order_headers(w.tenant, unique("key"), {{"Content-Type", "text/plain"}}));
  CHECK(res.status == 400);
  CHECK(problem_code(res) == "bad_request");
  CHECK(w.calls().empty());
  CHECK(w.rows() == 0);
}
