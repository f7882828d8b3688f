// Real concurrent requests with one key: the database, not timing, decides who is first.
#include <future>
#include <set>

#include "common.hpp"

using namespace idem::it;
using namespace idem::it::suite;

namespace {
const std::string kOrder = R"({"customer_id":"c-1","amount":1000})";

// Sends the first request of an operation from its own thread and returns once the
// backend holds it (until `hold` is released): the owner is then provably in flight.
std::future<HttpResponse> send_held_first(Sidecar& sidecar, TestBackend& backend,
                                          const std::string& tenant, const std::string& key,
                                          const std::string& hold) {
  auto first = std::async(std::launch::async, [&sidecar, tenant, key, hold] {
    HttpClient client(sidecar.port());
    return client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", hold}}), 30s);
  });
  backend.wait_for_call([&](const BackendCall& c) { return c.header("X-Tenant-Id") == tenant; },
                        "the first request to reach the backend");
  return first;
}
}

TEST_CASE("50 concurrent requests with one key: one backend call, one row, identical answers") {
  TestBackend backend;
  Db db(database_url());
  auto o = options_for(backend);
  o.database_pool_size = 8;
  o.routes[0].wait = "20s";  // every duplicate waits for the first and gets its replay
  o.routes[0].lease = "30s";
  Sidecar sidecar(o);
  const auto tenant = unique("tenant");
  const auto key = unique("key");

  // Released together by a latch; the backend takes a moment over the first call so the
  // rest arrive while it runs. The assertions hold for any interleaving: whoever is not
  // first either waits for the first or finds it completed.
  auto results = concurrently(50, [&](std::size_t) {
    HttpClient client(sidecar.port());
    return client.post("/orders", kOrder,
                       order_headers(tenant, key, {{"X-Test-Delay-Ms", "300"}}), 30s);
  });
  require_all_ok(results);

  std::set<std::string> bodies;
  int replays = 0;
  for (auto& r : results) {
    auto& res = r.get();
    CHECK(res.status == 201);
    bodies.insert(res.body);
    if (res.header("Idempotent-Replayed") == "true") ++replays;
  }
  CHECK(bodies.size() == 1);
  CHECK(replays == 49);
  CHECK(calls_for(backend, tenant).size() == 1);
  CHECK(count_rows(db, tenant) == 1);
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 1);
}

TEST_CASE("a duplicate past `wait` gets 409 in progress with Retry-After, then the replay") {
  TestBackend backend;
  Db db(database_url());
  auto o = options_for(backend);
  o.routes[0].wait = "300ms";
  o.routes[0].retry_after = "2s";
  Sidecar sidecar(o);
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto hold = unique("hold");

  auto first = send_held_first(sidecar, backend, tenant, key, hold);

  HttpClient client(sidecar.port());
  auto dup = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(dup.status == 409);
  CHECK(problem_code(dup) == "idempotency_in_progress");
  CHECK(dup.header("Retry-After") == "2");
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");

  backend.release(hold);
  auto original = first.get();
  CHECK(original.status == 201);

  auto replay = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(replay.status == 201);
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == original.body);
  CHECK(calls_for(backend, tenant).size() == 1);
  row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
}

TEST_CASE("a duplicate within `wait` is answered with the first's result as soon as it completes") {
  TestBackend backend;
  Db db(database_url());
  auto o = options_for(backend);
  o.routes[0].wait = "20s";
  Sidecar sidecar(o);
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto hold = unique("hold");

  auto first = send_held_first(sidecar, backend, tenant, key, hold);
  auto dup = std::async(std::launch::async, [&] {
    HttpClient client(sidecar.port());
    return client.post("/orders", kOrder, order_headers(tenant, key), 30s);
  });
  // The duplicate is parked in the sidecar; it has not been answered while the first runs.
  CHECK(dup.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
  backend.release(hold);
  auto a = first.get();
  auto b = dup.get();
  CHECK(a.status == 201);
  CHECK(b.status == 201);
  CHECK(b.header("Idempotent-Replayed") == "true");
  CHECK(b.body == a.body);
  CHECK(calls_for(backend, tenant).size() == 1);
}
