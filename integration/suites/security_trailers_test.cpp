// Security, classes 1 and 2 of issue 10: trailer fields never become header fields, and
// chunk extensions and trailers are bounded.
#include "security_common.hpp"

using namespace idem::it;
using namespace idem::it::security;

TEST_CASE("security: a tenant in a trailer does not scope the request (no cross-tenant replay)") {
  World w;
  const std::string victim = unique("victim");
  const auto key = unique("key");
  auto created = w.client->post("/orders", kOrder, order_headers(victim, key));
  REQUIRE(created.status == 201);

  // No tenant header at all: only the trailer names the victim.
  auto res = w.raw(raw_post("/orders", "Idempotency-Key: " + key + "\r\n",
                            chunked(kOrder, "X-Tenant-Id: " + victim + "\r\n")));
  CHECK(res.status == 401);
  CHECK(problem_code(res) == "tenant_missing");
  CHECK(res.body.find("ord-") == std::string::npos);  // the victim's order is not in it
  CHECK_FALSE(res.has_header("Idempotent-Replayed"));

  // With the attacker's own tenant in the header, the trailer changes nothing either.
  auto own = w.raw(raw_post("/orders", "X-Tenant-Id: " + w.tenant + "\r\nIdempotency-Key: " + key + "\r\n",
                            chunked(kOrder, "X-Tenant-Id: " + victim + "\r\n")));
  CHECK(own.status == 201);
  CHECK_FALSE(own.has_header("Idempotent-Replayed"));
  const auto calls = calls_for(w.backend, victim);
  CHECK(calls.size() == 1);  // only the victim's own create
  CHECK(count_rows(w.db, victim) == 1);
  CHECK(w.rows() == 1);  // the attacker's request is scoped to the attacker
  auto mine = calls_for(w.backend, w.tenant);
  REQUIRE(mine.size() == 1);
  CHECK(mine[0].headers_named("X-Tenant-Id") == std::vector<std::string>{w.tenant});
}

TEST_CASE("security: a principal in a trailer does not pass the principal check") {
  World w;
  const auto key = unique("key");
  auto created = w.client->post("/orders", kOrder, order_headers(w.tenant, key, {{"X-User-Id", "alice"}}));
  REQUIRE(created.status == 201);

  // Without a principal header the request is the anonymous principal's, whatever the
  // trailer says: alice's record is not replayed to it.
  auto res = w.raw(raw_post("/orders", "X-Tenant-Id: " + w.tenant + "\r\nIdempotency-Key: " + key + "\r\n",
                            chunked(kOrder, "X-User-Id: alice\r\n")));
  CHECK(res.status == 403);
  CHECK(problem_code(res) == "idempotency_key_forbidden");
  CHECK(res.body.find("ord-") == std::string::npos);
  CHECK(calls_for(w.backend, w.tenant).size() == 1);
  CHECK(w.rows() == 1);
}

TEST_CASE("security: trailer fields on an unmatched route never reach the backend as header fields") {
  World w;
  auto res = w.raw("POST /notes HTTP/1.1\r\nHost: front.example\r\nX-Tenant-Id: " + w.tenant +
                   "\r\nContent-Type: text/plain\r\n" +
                   chunked("hello", "Host: evil.example\r\nX-Tenant-Id: victim\r\nX-Extra: 1\r\n"));
  CHECK(res.status == 201);
  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].target == "/notes");
  CHECK(calls[0].body == "hello");
  CHECK(calls[0].headers_named("Host") == std::vector<std::string>{"front.example"});
  CHECK(calls[0].headers_named("X-Tenant-Id") == std::vector<std::string>{w.tenant});
  CHECK_FALSE(calls[0].header("X-Extra").has_value());
  CHECK_FALSE(calls[0].header("Transfer-Encoding").has_value());
  CHECK(calls[0].header("Content-Length") == "5");
}

TEST_CASE("security: an endless chunk extension or trailer is refused at the budget, not buffered") {
  // max_header_bytes is 4 KiB and body_timeout 3 s: a sidecar that kept buffering would
  // answer 408 after the timeout; a bounded one refuses once the budget is used.
  World w;
  const std::string head = "X-Tenant-Id: " + w.tenant + "\r\nIdempotency-Key: " + unique("k") +
                           "\r\nTransfer-Encoding: chunked\r\n\r\n";
  const auto t0 = std::chrono::steady_clock::now();
  auto ext = w.raw(raw_post("/orders", head, "1;" + std::string(256 * 1024, 'e')));
  CHECK(ext.status == 400);
  CHECK(problem_code(ext) == "bad_request");
  CHECK_FALSE(ext.keep_alive);

  auto trailer = w.raw(raw_post("/orders", head, "1\r\nx\r\n0\r\nX-Long: " + std::string(256 * 1024, 't')));
  CHECK(trailer.status == 431);
  CHECK(problem_code(trailer) == "headers_too_large");

  // Short extensions, each complete, that together pass the budget (the body they carry,
  // "11...1", is valid JSON: only the extensions are wrong).
  std::string many;
  for (int i = 0; i < 20; ++i) many += "1;ext=" + std::string(300, 'e') + "\r\n1\r\n";
  auto sum = w.raw(raw_post("/orders", head, many + "0\r\n\r\n"));
  CHECK(sum.status == 400);
  CHECK(problem_code(sum) == "bad_request");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));  // all refused before a single body timeout

  CHECK(w.calls().empty());
  CHECK(w.rows() == 0);
}
