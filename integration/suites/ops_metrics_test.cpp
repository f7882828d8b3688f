// Metrics and logs after a scripted mix of requests: the counters scraped from /metrics
// equal what the test made happen, every metric of contract §6 is exposed, and the access
// log has one JSON line per request with the contract's fields and nothing it must not
// carry (bodies, raw keys, the database password, admin tokens).
#include <future>
#include <set>

#include "ops_common.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::ops;

namespace {

const std::vector<std::string> kOutcomes = {"created",  "replayed",        "key_reused",
                                            "in_progress", "released",     "unknown_outcome",
                                            "rejected", "store_unavailable", "passthrough"};

}  // namespace

TEST_CASE("ops: /metrics counts a scripted mix exactly; the access log leaks nothing") {
  TestBackend backend;
  ScratchDatabase fresh;
  AdminPort admin;
  const std::string body_marker = unique("BODYMARK");
  const std::string key_marker = unique("KEYMARK");
  const std::string password = unique("PWMARK");
  const std::string token = unique("TOKENMARK");
  const std::string wrong_token = unique("WRONGTOKENMARK");

  auto o = options_for(backend);
  o.database_url = with_password(fresh.url(), password);
  o.log_level = "info";
  o.log_format = "json";
  o.admin_listen = admin.listen();
  o.admin_token = token;
  o.upstream_response_timeout = "3s";
  o.routes[0].wait = "200ms";
  Sidecar sidecar(o);
  HttpClient client(sidecar.port());
  // The replay cache answers the second replay below; the counts are exact once it serves.
  wait_until([&] { return scrape(admin.port).value("idemproxy_replay_cache_active") == 1; }, 10s,
             "the replay cache to become active");

  const std::string tenant = unique("tenant");
  auto key = [&](std::string_view name) { return key_marker + "-" + std::string(name); };
  auto order = [&](int amount) {
    return R"({"customer_id":")" + body_marker + R"(","amount":)" + std::to_string(amount) + "}";
  };
  std::vector<std::string> responses;  // every body the sidecar answered
  auto post = [&](const std::string& k, int amount, Headers extra = {}) {
    auto res = client.post("/orders", order(amount), order_headers(tenant, k, std::move(extra)));
    responses.push_back(res.body);
    return res;
  };

  // created x3, replayed x2 (the second from the replay cache), key_reused x1
  CHECK(post(key("a"), 1).status == 201);
  CHECK(post(key("b"), 2).status == 201);
  CHECK(post(key("c"), 3).status == 201);
  CHECK(post(key("a"), 1).header("Idempotent-Replayed") == "true");
  CHECK(post(key("a"), 1).header("Idempotent-Replayed") == "true");
  CHECK(problem_code(post(key("b"), 999)) == "idempotency_key_reused");
  // rejected x2: no key, no tenant
  CHECK(problem_code(post("", 1)) == "idempotency_key_missing");
  {
    auto res = client.post("/orders", order(1), {{"Content-Type", "application/json"},
                                                 {"Idempotency-Key", key("no-tenant")}});
    CHECK(problem_code(res) == "tenant_missing");
  }
  // released x1: a 503 from the backend is passed on and the key freed
  CHECK(post(key("d"), 4, {{"X-Test-Status", "503"}}).status == 503);
  // passthrough x1 on no route
  CHECK(client.get("/health", {{"X-Tenant-Id", tenant}}).status == 200);

  // in_progress x1 while the owner is held; the owner then completes (created)
  const auto hold = unique("hold");
  auto owner = std::async(std::launch::async, [&] {
    HttpClient c(sidecar.port());
    return c.post("/orders", order(5), order_headers(tenant, key("e"), {{"X-Test-Hold", hold}}));
  });
  backend.wait_for_call([&](const BackendCall& c) { return c.header("X-Test-Hold") == hold; },
                        "the held owner to reach the backend");
  CHECK(problem_code(post(key("e"), 5)) == "idempotency_in_progress");
  {
    // Sampled from the database at scrape time: the held claim is at least `wait` old.
    const auto during = scrape(admin.port);
    CHECK(during.value("idemproxy_in_progress_oldest_seconds") >= 0.2);
  }
  backend.release(hold);
  {
    auto res = owner.get();
    responses.push_back(res.body);
    CHECK(res.status == 201);
  }

  // unknown_outcome x2 (an upstream timeout, a reset), each followed by a takeover (created)
  const auto slow = unique("slow");
  {
    auto timed_out = post(key("f"), 6, {{"X-Test-Hold", slow}});
    CHECK(problem_code(timed_out) == "upstream_timeout");
    backend.release(slow);
    auto retry = post(key("f"), 6);
    CHECK(retry.status == 201);
  }
  {
    auto reset = post(key("g"), 7, {{"X-Test-Close", "before-response"}});
    CHECK(reset.status == 504);
    auto retry = post(key("g"), 7);
    CHECK(retry.status == 201);
  }

  // An admin call with a wrong token (refused; the token must not be logged either).
  {
    HttpClient a(admin.port);
    CHECK(a.get(record_path(tenant, "POST /orders", key("a")), bearer(wrong_token)).status == 401);
    CHECK(a.get(record_path(tenant, "POST /orders", key("a")), bearer(token)).status == 200);
  }

  const auto m = scrape(admin.port);
  const std::map<std::string, double> expected{
      {"created", 6}, {"replayed", 2},  {"key_reused", 1}, {"in_progress", 1},
      {"released", 1}, {"unknown_outcome", 2}, {"rejected", 2}, {"store_unavailable", 0},
      {"passthrough", 0}};
  for (const auto& [outcome, count] : expected) {
    INFO("outcome " << outcome);
    CHECK(m.value("idemproxy_requests_total", {{"route", "create-order"}, {"outcome", outcome}}) ==
          count);
  }
  CHECK(m.value("idemproxy_requests_total", {{"route", "unmatched"}, {"outcome", "passthrough"}}) == 1);
  CHECK(m.value("idemproxy_request_duration_seconds_count", {{"route", "create-order"}}) == 15);
  CHECK(m.value("idemproxy_request_duration_seconds_bucket", {{"route", "create-order"}, {"le", "+Inf"}}) == 15);
  // Forwarded: a, b, c, d, e, f twice, g twice, and the unmatched GET.
  CHECK(m.value("idemproxy_upstream_duration_seconds_count") == 10);
  CHECK(m.value("idemproxy_takeovers_total") == 2);
  CHECK(m.value("idemproxy_fenced_writes_total") == 0);
  CHECK(m.value("idemproxy_lease_renewals_total") >= 1);  // the 3 s hold outlived lease/3
  CHECK(m.value("idemproxy_expired_deleted_total") == 0);
  CHECK(m.sum("idemproxy_store_errors_total") == 0);
  // Every protected request with a valid tenant and key claims once: 15 minus 2 rejected,
  // minus the replay the cache answered (the first replay read the record and kept it).
  CHECK(m.value("idemproxy_store_duration_seconds_count", {{"op", "claim"}}) == 12);
  CHECK(m.value("idemproxy_replay_cache_lookups_total", {{"result", "hit"}}) == 1);
  CHECK(m.value("idemproxy_replay_cache_lookups_total", {{"result", "miss"}}) == 12);
  CHECK(m.value("idemproxy_replay_cache_entries") == 2);  // a (replayed) and b (refused)
  CHECK(m.value("idemproxy_store_duration_seconds_count", {{"op", "take_over"}}) == 2);
  CHECK(m.value("idemproxy_store_duration_seconds_count", {{"op", "complete"}}) == 6);
  CHECK(m.value("idemproxy_store_duration_seconds_count", {{"op", "release"}}) == 1);
  CHECK(m.value("idemproxy_store_duration_seconds_count", {{"op", "expire_lease"}}) == 2);
  CHECK(m.value("idemproxy_store_duration_seconds_count", {{"op", "purge"}}) == 0);
  CHECK(m.value("idemproxy_in_progress_oldest_seconds") == 0);  // everything finished

  // Every metric contract §6 names, with its type.
  const std::map<std::string, std::string> families{
      {"idemproxy_requests_total", "counter"},
      {"idemproxy_request_duration_seconds", "histogram"},
      {"idemproxy_upstream_duration_seconds", "histogram"},
      {"idemproxy_store_duration_seconds", "histogram"},
      {"idemproxy_takeovers_total", "counter"},
      {"idemproxy_fenced_writes_total", "counter"},
      {"idemproxy_lease_renewals_total", "counter"},
      {"idemproxy_in_progress_oldest_seconds", "gauge"},
      {"idemproxy_expired_deleted_total", "counter"},
      {"idemproxy_store_errors_total", "counter"}};
  for (const auto& [name, type] : families) {
    INFO(name);
    REQUIRE(m.has_family(name));
    CHECK(m.types.at(name) == type);
  }
  for (const auto& outcome : kOutcomes) {
    CHECK(m.find("idemproxy_requests_total", {{"route", "create-order"}, {"outcome", outcome}}));
  }

  REQUIRE(sidecar.stop().success());
  const std::string log = sidecar.log();

  // Nothing secret, anywhere in the output.
  for (const auto& marker : {body_marker, key_marker, password, token, wrong_token}) {
    INFO("marker " << marker);
    CHECK(log.find(marker) == std::string::npos);
  }
  for (const auto& body : responses) {
    if (body.size() < 8) continue;
    INFO("response body " << body);
    CHECK(log.find(body) == std::string::npos);
  }
  for (const auto& call : backend.calls()) {
    if (auto op = call.header("X-Idempotency-Operation-Id")) CHECK(log.find(*op) == std::string::npos);
  }
  // The database is named, masked.
  CHECK(log.find(":****@") != std::string::npos);

  // One JSON access line per request, with the contract's fields.
  std::map<std::string, int> by_outcome;
  int access_lines = 0;
  int from_memory = 0;
  for (const auto& line : json_lines(log)) {
    CHECK(!str(line, "ts").empty());
    CHECK(!str(line, "level").empty());
    if (str(line, "type") != "access") {
      CHECK(line.contains("msg"));
      continue;
    }
    ++access_lines;
    const std::string outcome = str(line, "outcome");
    ++by_outcome[outcome];
    INFO("access line: " << boost::json::serialize(line));
    CHECK(std::find(kOutcomes.begin(), kOutcomes.end(), outcome) != kOutcomes.end());
    REQUIRE(line.contains("status"));
    CHECK(line.at("status").is_int64());
    CHECK(line.at("duration_ms").is_number());
    const std::string path = str(line, "path");
    if (path == "/health") {
      CHECK(str(line, "route").empty());
      CHECK(line.contains("upstream_ms"));
      continue;
    }
    CHECK(path == "/orders");
    CHECK(str(line, "route") == "create-order");
    CHECK(str(line, "method") == "POST");
    if (outcome == "rejected") continue;  // no valid key: no hash, no store
    const std::string hash = str(line, "key_hash");
    CHECK(hash.size() == 12);
    CHECK(hash.find_first_not_of("0123456789abcdef") == std::string::npos);
    if (str(line, "replay_cache") == "hit") {
      ++from_memory;  // answered by the replay cache: no store call to time
      CHECK(outcome == "replayed");
      CHECK_FALSE(line.contains("store_ms"));
    } else {
      CHECK(line.contains("store_ms"));
    }
    if (outcome == "created" || outcome == "released" || outcome == "unknown_outcome") {
      CHECK(line.at("attempt").as_int64() >= 1);
      CHECK(line.contains("upstream_ms"));
    }
    if (outcome != "created" && outcome != "replayed" && outcome != "released") {
      CHECK(!str(line, "code").empty());
    }
  }
  CHECK(access_lines == 16);
  CHECK(from_memory == 1);
  for (const auto& [outcome, count] : expected) {
    INFO("outcome " << outcome);
    CHECK(by_outcome[outcome] == count + (outcome == "passthrough" ? 1 : 0));
  }
}
