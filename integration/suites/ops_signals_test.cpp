// Signals: SIGTERM drains (the request in flight is answered and recorded, new connections
// are refused, exit 0), a request cut off by the drain limit leaves a row a retry takes
// over, and SIGHUP applies a changed configuration or, when the file is broken, keeps the
// running one and says why.
#include <csignal>
#include <future>

#include "ops_common.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::ops;

namespace {

const std::string kOrder = R"({"customer_id":"c-1","amount":1000})";

bool held_call_arrived(const BackendCall& c, const std::string& hold) {
  return c.header("X-Test-Hold") == hold;
}

}  // namespace

TEST_CASE("ops: SIGTERM during a slow request answers and records it, refuses new connections, exits 0") {
  TestBackend backend;
  Db db(database_url());
  AdminPort admin;
  auto o = options_for(backend);
  o.log_level = "info";
  o.drain_timeout = "20s";
  o.admin_listen = admin.listen();
  Sidecar sidecar(o);
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto hold = unique("hold");

  auto answer = std::async(std::launch::async, [&] {
    HttpClient client(sidecar.port());
    return client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", hold}}), 30s);
  });
  backend.wait_for_call([&](const BackendCall& c) { return held_call_arrived(c, hold); },
                        "the slow request to reach the backend");
  // A keep-alive connection that is idle when the signal comes: closed by the drain.
  RawConnection idle(sidecar.port());

  sidecar.signal(SIGTERM);
  wait_until([&] { return !port_open(sidecar.port()); }, 10s,
             "the request listener to close after SIGTERM");
  CHECK_THROWS_AS(RawConnection(sidecar.port(), 2s), Failure);  // refused, not queued
  CHECK(idle.wait_closed(5s));
  // Still running, and saying so: the admin listener answers until the end of the drain.
  CHECK(sidecar.running());
  {
    HttpClient a(admin.port);
    auto ready = a.get("/readyz");
    CHECK(ready.status == 503);
    CHECK(boost::json::parse(ready.body).as_object().at("reason") == "draining");
    CHECK(a.get("/healthz").status == 200);
  }
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");

  backend.release(hold);
  auto res = answer.get();
  CHECK(res.status == 201);
  CHECK_FALSE(res.keep_alive);  // the drain closes the connection after the answer
  row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 1);
  CHECK(row->body == res.body);

  const auto status = sidecar.process().wait_exit(15s);
  REQUIRE(status);
  CHECK(status->success());
  CHECK(sidecar.log().find("drained: every in-flight request has been answered") != std::string::npos);
  CHECK(calls_for(backend, tenant).size() == 1);
}

TEST_CASE("ops: SIGTERM after a 202 waits for the operation behind it and records it") {
  TestBackend backend;
  Db db(database_url());
  auto o = options_for(backend);
  o.log_level = "info";
  o.drain_timeout = "20s";
  RouteOptions r;
  r.extra_yaml = "async:\n  after: 100ms\n  status_path: /operations/{operation_id}\n";
  o.routes = {r};
  Sidecar sidecar(o);
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto hold = unique("hold");

  {
    // Closed at the end of the block: no connection of ours to the sidecar is left open.
    HttpClient client(sidecar.port());
    const auto accepted =
        client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", hold}}), 30s);
    REQUIRE(accepted.status == 202);
  }
  backend.wait_for_call([&](const BackendCall& c) { return held_call_arrived(c, hold); },
                        "the slow request to reach the backend");

  sidecar.signal(SIGTERM);
  wait_until([&] { return !port_open(sidecar.port()); }, 10s,
             "the request listener to close after SIGTERM");
  // No client connection is open, and still the drain waits: the operation is running.
  CHECK(sidecar.running());
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");

  backend.release(hold);
  const auto status = sidecar.process().wait_exit(15s);
  REQUIRE(status);
  CHECK(status->success());
  row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->status == 201);
  CHECK(sidecar.log().find("long operation finished after 202") != std::string::npos);
  CHECK(sidecar.log().find("drained: every in-flight request has been answered") != std::string::npos);
  CHECK(calls_for(backend, tenant).size() == 1);
}

TEST_CASE("ops: a request cut off by the drain limit leaves its row for a retry to take over") {
  TestBackend backend;
  Db db(database_url());
  auto o = options_for(backend);
  o.log_level = "info";
  o.drain_timeout = "300ms";
  o.routes[0].lease = "1s";
  o.routes[0].wait = "100ms";
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto hold = unique("hold");

  auto a = std::make_unique<Sidecar>(o);
  auto cut_off = std::async(std::launch::async, [&] {
    HttpClient client(a->port());
    try {
      client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", hold}}), 30s);
      return false;
    } catch (const Failure&) {
      return true;  // the connection ended without an answer
    }
  });
  const auto first = backend.wait_for_call(
      [&](const BackendCall& c) { return held_call_arrived(c, hold); },
      "the slow request to reach the backend");
  a->signal(SIGTERM);
  const auto status = a->process().wait_exit(15s);
  REQUIRE(status);
  CHECK(status->success());
  CHECK(cut_off.get());
  CHECK(a->log().find("drain ended with 1 connections still open") != std::string::npos);

  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");
  CHECK(row->attempt == 1);

  // The lease is no longer renewed by anyone: once it lapses a retry owns the operation,
  // with the next attempt and the same operation id for the backend to deduplicate on.
  o.drain_timeout.clear();
  Sidecar b(o);
  wait_until([&] {
    auto r = read_row(db, tenant, key);
    return r && r->lease_expired;
  }, 10s, "the cut-off request's lease to lapse");
  HttpClient client(b.port());
  auto retry = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(retry.status == 201);
  auto calls = calls_for(backend, tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].header("X-Idempotency-Attempt") == "2");
  CHECK(calls[1].header("X-Idempotency-Operation-Id") == first.header("X-Idempotency-Operation-Id"));
  row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 2);
  backend.release(hold);
}

TEST_CASE("ops: SIGHUP applies a changed route at once; a broken file keeps the old one and says why") {
  TestBackend backend;
  auto o = options_for(backend);
  o.log_level = "info";
  Sidecar sidecar(o);
  HttpClient client(sidecar.port());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const std::string other = R"({"customer_id":"c-1","amount":2000})";

  // Before: /payments is on no route (passes through unprotected); reuse answers 409.
  CHECK(client.post("/payments", kOrder, order_headers(tenant, "")).status == 201);
  CHECK(client.post("/orders", kOrder, order_headers(tenant, key)).status == 201);
  CHECK(client.post("/orders", other, order_headers(tenant, key)).status == 409);

  auto changed = o;
  changed.port = sidecar.port();
  changed.routes[0].mismatch_status = 422;
  RouteOptions payments;
  payments.name = "create-payment";
  payments.path = "/payments";
  changed.routes.push_back(payments);
  sidecar.reload(sidecar_config(changed));
  sidecar.process().wait_for_output("configuration reloaded from");

  // Same process, same connection: the new routes apply to the next request.
  auto reused = client.post("/orders", other, order_headers(tenant, key));
  CHECK(reused.status == 422);
  CHECK(problem_code(reused) == "idempotency_key_reused");
  CHECK(problem_code(client.post("/payments", kOrder, order_headers(tenant, ""))) ==
        "idempotency_key_missing");

  auto broken = changed;
  broken.routes[0].lease = "banana";
  sidecar.reload(sidecar_config(broken));
  const auto line = sidecar.process().wait_for_output("reload refused");
  INFO(line);
  CHECK(line.find("keeping the running configuration") != std::string::npos);
  CHECK(line.find(sidecar.config_path().string()) != std::string::npos);
  CHECK(line.find("routes[0].lease") != std::string::npos);
  CHECK(line.find("banana") != std::string::npos);

  // Still the configuration of the last good reload.
  CHECK(sidecar.running());
  CHECK(client.post("/orders", other, order_headers(tenant, key)).status == 422);
  CHECK(problem_code(client.post("/payments", kOrder, order_headers(tenant, ""))) ==
        "idempotency_key_missing");
  CHECK(client.post("/orders", kOrder, order_headers(tenant, unique("key"))).status == 201);
}
