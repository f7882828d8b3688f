// Security, classes 6, 7 and 9 (replay markers) of issue 10: what the backend answers is
// read in step, recorded exactly, and never mistaken for idemproxy's own markers.
#include "security_common.hpp"

using namespace idem::it;
using namespace idem::it::security;

TEST_CASE("security: a 204 that carries body bytes anyway retires the upstream connection") {
  World w;
  const auto first_key = unique("key");
  // The backend answers 204 and owes a whole fake response, which it sends on that
  // connection just before its next answer: a pooled connection would hand it to the
  // next request as that request's answer.
  const std::string late = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged";
  auto first = w.client->post("/orders", kOrder,
                              order_headers(w.tenant, first_key,
                                            {{"X-Test-Raw-Response-Hex", hex("HTTP/1.1 204 No Content\r\n\r\n")},
                                             {"X-Test-Stray-Hex", hex(late)}}));
  CHECK(first.status == 204);

  const auto key = unique("key");
  auto second = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  CHECK(second.status == 201);
  CHECK(second.body.find("\"order_id\"") != std::string::npos);
  auto row = read_row(w.db, w.tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->status == 201);
  CHECK(row->body == second.body);

  // Its retry replays the recorded answer: the create ran exactly once.
  auto retry = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  CHECK(retry.header("Idempotent-Replayed") == "true");
  CHECK(retry.body == second.body);
  auto calls = calls_for(w.backend, w.tenant);
  CHECK(calls.size() == 2);
  CHECK(read_row(w.db, w.tenant, first_key)->status == 204);
}

TEST_CASE("security: header bytes that are not UTF-8 are recorded and replayed exactly") {
  World w;
  const auto key = unique("key");
  const std::string location = "/orders/caf\xe9-\xff";
  const std::string etag = "\"\x80\tx\"";
  auto first = w.client->post("/orders", kOrder,
                              order_headers(w.tenant, key,
                                            {{"X-Test-Header-Hex", hex("Location: " + location)},
                                             {"X-Test-Header-Hex", hex("ETag: " + etag)}}));
  REQUIRE(first.status == 201);
  CHECK(first.header("Location") == location);
  CHECK(first.header("ETag") == etag);
  auto row = read_row(w.db, w.tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->resource_id == "/orders/caf%E9-%FF");

  auto replay = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  CHECK(replay.status == 201);
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.header("Location") == location);
  CHECK(replay.header("ETag") == etag);
  CHECK(replay.body == first.body);
  CHECK(calls_for(w.backend, w.tenant).size() == 1);
}

TEST_CASE("security: a backend's own replay markers never reach a first answer") {
  World w;
  const Headers markers = {{"X-Test-Header-Hex", hex("Idempotent-Replayed: true")},
                           {"X-Test-Header-Hex", hex("Idempotent-Replay-Body: omitted")}};
  const auto key = unique("key");
  auto first = w.client->post("/orders", kOrder, order_headers(w.tenant, key, markers));
  REQUIRE(first.status == 201);
  CHECK_FALSE(first.has_header("Idempotent-Replayed"));
  CHECK_FALSE(first.has_header("Idempotent-Replay-Body"));
  const auto stored = w.db.scalar(
      "SELECT response_headers::text FROM idempotency_requests WHERE tenant_id = $1", {w.tenant});
  REQUIRE(stored);
  CHECK(stored->find("Idempotent") == std::string::npos);

  auto replay = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  CHECK(replay.headers_named("Idempotent-Replayed") == std::vector<std::string>{"true"});
  CHECK_FALSE(replay.has_header("Idempotent-Replay-Body"));
  CHECK(replay.body == first.body);

  auto passed = w.client->get("/status", Headers{{"X-Tenant-Id", w.tenant}, markers[0], markers[1]});
  CHECK(passed.status == 200);
  CHECK_FALSE(passed.has_header("Idempotent-Replayed"));
  CHECK_FALSE(passed.has_header("Idempotent-Replay-Body"));
  CHECK(calls_for(w.backend, w.tenant).size() == 2);
  CHECK(w.rows() == 1);
}
