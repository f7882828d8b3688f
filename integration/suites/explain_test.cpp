// `idemproxy explain --database` against a real sidecar's records in PostgreSQL: what a
// retry would get now (nothing, a replay, a mismatch named by the recorded fingerprint's
// hash, an operation in progress), read-only and scoped by the request's own tenant.
#include <future>

#include "common.hpp"

using namespace idem::it;
using namespace idem::it::suite;

namespace {

const std::string kOrder = R"({"customer_id":"c-1","amount":1000,"trace_id":"t-1"})";
const std::string kOtherAmount = R"({"customer_id":"c-1","amount":2000})";

struct World {
  World() : db(database_url()) {
    auto o = options_for(backend);
    RouteOptions r;
    r.fingerprint_fields = std::vector<std::string>{"/customer_id", "/amount"};
    o.routes = {r};
    sidecar = std::make_unique<Sidecar>(o);
    client = std::make_unique<HttpClient>(sidecar->port());
  }

  // explain --database for POST /orders with this body, as the tenant's client sends it.
  CommandResult explain(const std::string& tenant, const std::string& key, const std::string& body) {
    const auto file = dir.write_file(unique("body") + ".json", body);
    auto r = run_idemproxy({"explain", "--config", sidecar->config_path().string(), "--database",
                            "--tenant", tenant, "--header", "Idempotency-Key: " + key, "--header",
                            "Content-Type: application/json", "--body", file.string(), "POST", "/orders"});
    INFO(r.output);
    CHECK(r.status.code() == 0);
    return r;
  }

  TestBackend backend;
  Db db;
  std::unique_ptr<Sidecar> sidecar;
  std::unique_ptr<HttpClient> client;
  TempDir dir{"explain"};
  std::string tenant = unique("tenant");
};

bool has(const CommandResult& r, std::string_view part) {
  const bool found = r.output.find(part) != std::string::npos;
  if (!found) MESSAGE(r.output);
  return found;
}

}  // namespace

TEST_CASE("explain --database: nothing, then a replay; its fingerprint is the one the sidecar recorded") {
  World w;
  const auto key = unique("key");
  CHECK(has(w.explain(w.tenant, key, kOrder), "a retry now:  no record: the key is new"));

  auto first = w.client->post("/orders", kOrder, order_headers(w.tenant, key));
  REQUIRE(first.status == 201);
  const auto row = read_row(w.db, w.tenant, key);
  REQUIRE(row);
  const auto r = w.explain(w.tenant, key, kOrder);
  // The hash explain computes is the one in the row the sidecar wrote.
  CHECK(has(r, "  sha256:     " + row->fingerprint + "\n"));
  CHECK(has(r, "record now:   completed, attempt 1, fingerprint " + row->fingerprint.substr(0, 12)));
  CHECK(has(r, "a retry now:  the recorded 201 replayed with Idempotent-Replayed: true"));

  // Another tenant's same key is another record: explain reads only the request's own.
  CHECK(has(w.explain(unique("tenant"), key, kOrder), "a retry now:  no record"));
  // Read-only: the row is as the sidecar left it, and the backend saw one call.
  const auto after = read_row(w.db, w.tenant, key);
  REQUIRE(after);
  CHECK(after->state == row->state);
  CHECK(after->attempt == row->attempt);
  CHECK(after->fence == row->fence);
  CHECK(after->fingerprint == row->fingerprint);
  CHECK(calls_for(w.backend, w.tenant).size() == 1);
}

TEST_CASE("explain --database: a reused key is the mismatch, named by the recorded fingerprint's hash") {
  World w;
  const auto key = unique("key");
  REQUIRE(w.client->post("/orders", kOrder, order_headers(w.tenant, key)).status == 201);
  const auto row = read_row(w.db, w.tenant, key);
  REQUIRE(row);
  const auto r = w.explain(w.tenant, key, kOtherAmount);
  CHECK(has(r, "a retry now:  409 idempotency_key_reused: the key was recorded for another request (recorded "
               "fingerprint " + row->fingerprint.substr(0, 12) + "…"));
  // And the sidecar answers that request so.
  auto reused = w.client->post("/orders", kOtherAmount, order_headers(w.tenant, key));
  CHECK(reused.status == 409);
  CHECK(problem_code(reused) == "idempotency_key_reused");
}

TEST_CASE("explain --database: an operation still running is in progress, with its lease") {
  World w;
  const auto key = unique("key");
  const auto hold = unique("hold");
  auto owner = std::async(std::launch::async, [&] {
    HttpClient client(w.sidecar->port());
    return client.post("/orders", kOrder, order_headers(w.tenant, key, {{"X-Test-Hold", hold}}), 30s);
  });
  w.backend.wait_for_call([&](const BackendCall& c) { return c.header("X-Tenant-Id") == w.tenant; },
                          "the owner's call to reach the backend");
  const auto r = w.explain(w.tenant, key, kOrder);
  CHECK(has(r, "record now:   in_progress, attempt 1"));
  CHECK(has(r, "a retry now:  in progress (lease renewed about "));
  CHECK(has(r, "waits up to 300ms for it, then replays or answers 409 idempotency_in_progress"));
  w.backend.release(hold);
  CHECK(owner.get().status == 201);
  CHECK(has(w.explain(w.tenant, key, kOrder), "a retry now:  the recorded 201 replayed"));
}

TEST_CASE("explain without --database needs no DATABASE_URL: the database section is not read") {
  TempDir dir("explain-nodb");
  // The usual production file: the URL and pool come from the environment, and explain runs
  // where neither is set (a laptop, a CI job without the production secret). More workers
  // than the default pool: that check is the database section's, so it is not made either.
  const auto config = dir.write_file("config.yaml", R"(
upstream: { url: "http://127.0.0.1:3000" }
database: { url: "${DATABASE_URL}", pool_size: "${IDEM_EXPLAIN_TEST_POOL_SIZE}" }
workers: 12
routes:
  - { name: create-order, method: POST, path: /orders }
)");
  const auto body = dir.write_file("body.json", R"({"amount":1})");
  const auto run = [&](std::vector<std::string> args) {
    auto r = run_command(ProcessOptions{.executable = idemproxy_binary(),
                                        .args = std::move(args),
                                        .unset = {"DATABASE_URL", "IDEM_EXPLAIN_TEST_POOL_SIZE"},
                                        .name = "idemproxy"},
                         kDefaultTimeout);
    INFO(r.output);
    return r;
  };
  const std::vector<std::string> request{"--tenant", "acme", "--header", "Idempotency-Key: k-1", "--header",
                                         "Content-Type: application/json", "--body", body.string(), "POST",
                                         "/orders"};
  std::vector<std::string> args{"explain", "--config", config.string()};
  args.insert(args.end(), request.begin(), request.end());
  const auto offline = run(args);
  CHECK(offline.status.code() == 0);
  CHECK(has(offline, "route:        create-order (POST /orders)"));
  CHECK(has(offline, "key as read:  k-1"));
  CHECK(has(offline, "fingerprint:"));

  // What does connect still says what is missing, naming the key and the variable.
  args.insert(args.begin() + 3, "--database");
  const auto online = run(args);
  CHECK(online.status.code() == 2);
  CHECK(has(online, "database.url"));
  CHECK(has(online, "DATABASE_URL is not set"));
  CHECK(run({"check-config", "--config", config.string()}).status.code() == 2);
}
