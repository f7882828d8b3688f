// The request protocol end to end: a real sidecar process, a real backend process and a
// real PostgreSQL. Every case asserts the rows and the backend's calls, not just statuses.
#include "common.hpp"

using namespace idem::it;
using namespace idem::it::suite;

namespace {

const std::string kOrder =
    R"({"customer_id":"c-1","currency":"EUR","amount":1000,"items":[{"sku":"A","qty":2}],"trace_id":"t-1"})";

RouteOptions order_route() {
  RouteOptions r;
  r.fingerprint_fields = std::vector<std::string>{"/customer_id", "/currency", "/amount", "/items"};
  r.fingerprint_ignore = {"/trace_id"};
  r.fingerprint_defaults = {{"/currency", "\"EUR\""}};
  return r;
}

struct World {
  World() : db(database_url()) {
    auto o = options_for(backend);
    o.routes = {order_route()};
    sidecar = std::make_unique<Sidecar>(o);
    client = std::make_unique<HttpClient>(sidecar->port());
  }
  TestBackend backend;
  Db db;
  std::unique_ptr<Sidecar> sidecar;
  std::unique_ptr<HttpClient> client;
  std::string tenant = unique("tenant");
};

}  // namespace

TEST_CASE("replay returns the first status, body and Location; only replay_headers are replayed") {
  World w;
  const auto key = unique("key");
  auto first = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  REQUIRE(first.status == 201);
  CHECK_FALSE(first.has_header("Idempotent-Replayed"));
  CHECK(first.header("X-Backend-Seq").has_value());  // the first answer is the backend's own
  CHECK(first.header("Set-Cookie").has_value());

  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].header("X-Idempotency-Attempt") == "1");
  const auto op_id = calls[0].header("X-Idempotency-Operation-Id").value_or("");
  CHECK(op_id.size() == 64);
  CHECK(calls[0].header("Idempotency-Key") == key);

  auto row = read_row(w.db, w.tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 1);
  CHECK(row->status == 201);
  CHECK(row->body == first.body);
  CHECK(row->resource_id == first.header("Location").value_or("?"));

  for (int i = 0; i < 3; ++i) {
    auto again = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
    CHECK(again.status == 201);
    CHECK(again.body == first.body);
    CHECK(again.header("Location") == first.header("Location"));
    CHECK(again.header("ETag") == first.header("ETag"));
    CHECK(again.header("Content-Type") == first.header("Content-Type"));
    CHECK(again.header("Idempotent-Replayed") == "true");
    CHECK_FALSE(again.has_header("X-Backend-Seq"));
    CHECK_FALSE(again.has_header("Set-Cookie"));
  }
  CHECK(calls_for(w.backend, w.tenant).size() == 1);
  CHECK(count_rows(w.db, w.tenant) == 1);

  // The quoted RFC 8941 form of the same key is the same key.
  auto quoted = w.client->post("/orders", kOrder, order_headers(w.tenant, "\"" + key + "\""));
  CHECK(quoted.header("Idempotent-Replayed") == "true");
  CHECK(calls_for(w.backend, w.tenant).size() == 1);
}

TEST_CASE("a different amount under the same key is refused; equivalent bodies are not") {
  World w;
  const auto key = unique("key");
  auto first = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  REQUIRE(first.status == 201);
  const auto before = read_row(w.db, w.tenant, key);
  REQUIRE(before);

  auto changed = w.client->post(
      "/orders", R"({"customer_id":"c-1","currency":"EUR","amount":1001,"items":[{"sku":"A","qty":2}]})",
      order_headers(w.tenant, key));
  CHECK(changed.status == 409);
  CHECK(problem_code(changed) == "idempotency_key_reused");

  // Same operation written differently: other field order, whitespace, 1000.0 and 1e3,
  // the defaulted currency omitted, an ignored and an unselected field changed.
  const std::vector<std::string> equivalent = {
      R"({ "items":[{"qty":2,"sku":"A"}], "amount":1000.0, "currency":"EUR", "customer_id":"c-1" })",
      R"({"customer_id":"c-1","amount":1e3,"items":[{"sku":"A","qty":2}]})",
      R"({"customer_id":"c-1","amount":1000,"items":[{"sku":"A","qty":2}],"trace_id":"other","note":"hi"})",
  };
  for (const auto& body : equivalent) {
    auto res = w.client->post("/orders", body, order_headers(w.tenant, key));
    CHECK(res.status == 201);
    CHECK(res.header("Idempotent-Replayed") == "true");
    CHECK(res.body == first.body);
  }

  CHECK(calls_for(w.backend, w.tenant).size() == 1);
  const auto after = read_row(w.db, w.tenant, key);
  REQUIRE(after);
  CHECK(after->fingerprint == before->fingerprint);
  CHECK(after->attempt == before->attempt);
  CHECK(after->body == before->body);
  CHECK(after->state == "completed");
}

TEST_CASE("two tenants with the same key get independent operations") {
  World w;
  const auto key = unique("key");
  const auto other = unique("tenant");
  auto a = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  auto b = w.client->post("/orders", kOrder, order_headers(other, key));
  CHECK(a.status == 201);
  CHECK(b.status == 201);
  CHECK_FALSE(b.has_header("Idempotent-Replayed"));
  CHECK(a.body != b.body);
  auto ca = calls_for(w.backend, w.tenant);
  auto cb = calls_for(w.backend, other);
  REQUIRE(ca.size() == 1);
  REQUIRE(cb.size() == 1);
  CHECK(ca[0].header("X-Idempotency-Operation-Id") != cb[0].header("X-Idempotency-Operation-Id"));
  CHECK(count_rows(w.db, w.tenant) == 1);
  CHECK(count_rows(w.db, other) == 1);
}

TEST_CASE("validation failures answer the contract's codes, claim nothing, forward nothing") {
  World w;
  const auto key = unique("key");
  struct Case {
    Headers headers;
    std::string body;
    int status;
    std::string code;
  };
  const std::vector<Case> cases = {
      {{{"Content-Type", "application/json"}, {"Idempotency-Key", key}}, kOrder, 401, "tenant_missing"},
      {order_headers(w.tenant, ""), kOrder, 400, "idempotency_key_missing"},
      {order_headers(w.tenant, "bad key with spaces"), kOrder, 400, "idempotency_key_invalid"},
      {order_headers(w.tenant, std::string(256, 'k')), kOrder, 400, "idempotency_key_invalid"},
      {order_headers(w.tenant, key, {{"Idempotency-Key", "second"}}), kOrder, 400, "idempotency_key_invalid"},
      {order_headers(w.tenant, key), "{\"amount\": 10,", 400, "invalid_json"},
      {{{"Content-Type", "text/plain"}, {"X-Tenant-Id", w.tenant}, {"Idempotency-Key", key}}, "amount=10", 415,
       "unsupported_media_type"},
  };
  for (const auto& c : cases) {
    auto res = w.client->post("/orders", c.body, c.headers);
    CHECK(res.status == c.status);
    CHECK(problem_code(res) == c.code);
  }
  CHECK(count_rows(w.db, w.tenant) == 0);
  CHECK(w.backend.calls().empty());

  // A valid request with the same key still starts a fresh operation afterwards.
  auto ok = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  CHECK(ok.status == 201);
  CHECK(count_rows(w.db, w.tenant) == 1);
}

TEST_CASE("upstream 5xx is passed through and released; a retry reaches the backend") {
  World w;
  const auto key = unique("key");
  auto failed = w.client->post("/orders", kOrder, order_headers(w.tenant, key, {{"X-Test-Status", "503"}}));
  CHECK(failed.status == 503);
  CHECK(problem_code(failed).empty());  // the backend's own answer, not ours
  CHECK(count_rows(w.db, w.tenant) == 0);

  auto retry = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  CHECK(retry.status == 201);
  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].header("X-Idempotency-Attempt") == "1");
  auto row = read_row(w.db, w.tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
}

TEST_CASE("a 422 from the backend is stored and replayed") {
  World w;
  const auto key = unique("key");
  auto rejected = w.client->post("/orders", kOrder, order_headers(w.tenant, key, {{"X-Test-Status", "422"}}));
  CHECK(rejected.status == 422);
  auto replay = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  CHECK(replay.status == 422);
  CHECK(replay.body == rejected.body);
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(calls_for(w.backend, w.tenant).size() == 1);
  auto row = read_row(w.db, w.tenant, key);
  REQUIRE(row);
  CHECK(row->status == 422);
}

TEST_CASE("an expired record is replaced and the key starts a new operation") {
  World w;
  const auto key = unique("key");
  auto first = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  REQUIRE(first.status == 201);
  // Retention passing, without waiting 24h: move the row's expiry into the past.
  CHECK(w.db.exec("UPDATE idempotency_requests SET expires_at = now() - interval '1 second' "
                  "WHERE tenant_id = $1", {w.tenant}) == 1);

  // Even a different body is a new operation now, not a mismatch.
  const std::string other = R"({"customer_id":"c-2","currency":"EUR","amount":5,"items":[]})";
  auto second = w.client->post("/orders", other, order_headers(w.tenant, key));
  CHECK(second.status == 201);
  CHECK_FALSE(second.has_header("Idempotent-Replayed"));
  CHECK(second.body != first.body);

  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].header("X-Idempotency-Attempt") == "2");  // fencing tokens never go back
  CHECK(count_rows(w.db, w.tenant) == 1);
  auto row = read_row(w.db, w.tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->body == second.body);

  auto replay = w.client->post("/orders", other, order_headers(w.tenant, key));
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == second.body);
}

TEST_CASE("unmatched routes pass through unchanged and unprotected") {
  World w;
  auto get = w.client->get("/orders/ord-1", {{"X-Tenant-Id", w.tenant}, {"X-Custom", "kept"}});
  CHECK(get.status == 200);
  auto put = w.client->request("PUT", "/orders/ord-1?x=1", {{"X-Tenant-Id", w.tenant}}, "raw");
  CHECK(put.status == 200);
  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].method == "GET");
  CHECK(calls[0].target == "/orders/ord-1");
  CHECK(calls[0].header("X-Custom") == "kept");
  CHECK_FALSE(calls[0].header("X-Idempotency-Attempt").has_value());
  CHECK(calls[1].target == "/orders/ord-1?x=1");
  CHECK(calls[1].body == "raw");
  CHECK(count_rows(w.db, w.tenant) == 0);
}

TEST_CASE("unmatched: reject answers 404 and forwards nothing") {
  TestBackend backend;
  auto o = options_for(backend);
  o.unmatched = "reject";
  Sidecar sidecar(o);
  HttpClient client(sidecar.port());
  auto res = client.get("/elsewhere");
  CHECK(res.status == 404);
  CHECK(problem_code(res) == "route_not_found");
  CHECK(backend.calls().empty());
}

TEST_CASE("one keep-alive connection serves many requests") {
  World w;
  for (int i = 0; i < 100; ++i) {
    const auto key = "k" + std::to_string(i % 10);
    auto res = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
    REQUIRE(res.status == 201);
    CHECK(res.keep_alive);
  }
  auto get = w.client->get("/orders/x", {{"X-Tenant-Id", w.tenant}});
  CHECK(get.status == 200);
  CHECK(w.client->connections_opened() == 1);
  CHECK(calls_for(w.backend, w.tenant).size() == 11);  // 10 keys + 1 GET
  CHECK(count_rows(w.db, w.tenant) == 10);
}

TEST_CASE("client-supplied operation id and attempt headers never reach the backend") {
  World w;
  const auto key = unique("key");
  w.client->post("/orders", kOrder,
                 order_headers(w.tenant, key, {{"X-Idempotency-Operation-Id", "forged"},
                                               {"X-Idempotency-Attempt", "7"}}));
  w.client->get("/orders/1", {{"X-Tenant-Id", w.tenant}, {"X-Idempotency-Attempt", "7"}});
  auto calls = calls_for(w.backend, w.tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].headers_named("X-Idempotency-Attempt") == std::vector<std::string>{"1"});
  CHECK(calls[0].header("X-Idempotency-Operation-Id") != "forged");
  CHECK(calls[1].headers_named("X-Idempotency-Attempt").empty());
}

// docs/http.md, replay.mode refetch: an absolute Location is re-fetched only on the request's
// own host (or a host of replay.hosts); any other replays the record's stored bytes. Shown
// by what the backend received: a GET of the resource, or nothing.
TEST_CASE("refetch follows an absolute Location on the request's own host only") {
  TestBackend backend;
  Db db(database_url());
  auto o = options_for(backend);
  o.routes = {order_route()};
  o.routes[0].extra_yaml = "replay:\n  mode: refetch\n  hosts: [\"api.example:8443\"]\n";
  Sidecar sidecar(o);
  HttpClient client(sidecar.port());
  const auto tenant = unique("tenant");
  const auto located = [&](const std::string& key, const std::string& location) {
    return order_headers(tenant, key, {{"Host", "shop.example"},
                                       {"X-Test-Header-Hex", idem::text::to_hex("Location: " + location)}});
  };

  SUBCASE("another host: the stored bytes, and no request for the resource") {
    const auto key = unique("key");
    const auto first = client.post("/orders", kOrder, located(key, "http://other.example/orders/o-1"));
    REQUIRE(first.status == 201);
    const auto replay = client.post("/orders", kOrder, located(key, "http://other.example/orders/o-1"));
    CHECK(replay.status == 201);
    CHECK(replay.header("Idempotent-Replayed") == "true");
    CHECK_FALSE(replay.has_header("Idempotent-Replay-Body"));
    CHECK(replay.body == first.body);
    CHECK(replay.header("Location") == "http://other.example/orders/o-1");
    const auto calls = calls_for(backend, tenant);
    REQUIRE(calls.size() == 1);  // the create; the other host's resource was never asked for
    CHECK(calls[0].method == "POST");
    const auto row = read_row(db, tenant, key);
    REQUIRE(row);
    CHECK(row->resource_id == "http://other.example/orders/o-1");
  }
  std::string location;
  SUBCASE("the request's own host") { location = "http://SHOP.example/orders/o-2?view=full"; }
  SUBCASE("a host of replay.hosts") { location = "https://api.example:8443/orders/o-2?view=full"; }
  if (location.empty()) return;
  const auto key = unique("key");
  REQUIRE(client.post("/orders", kOrder, located(key, location)).status == 201);
  const auto replay = client.post("/orders", kOrder, located(key, location));
  CHECK(replay.status == 201);  // the first status
  CHECK(replay.header("Idempotent-Replay-Body") == "current");
  const auto calls = calls_for(backend, tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].method == "GET");
  CHECK(calls[1].target == "/orders/o-2?view=full");
  CHECK(calls[1].body.empty());
  // The body is the fetch's answer, not the record's.
  const auto fetched = boost::json::parse(replay.body).as_object();
  CHECK(fetched.at("seq").as_int64() == static_cast<std::int64_t>(calls[1].seq));
}
