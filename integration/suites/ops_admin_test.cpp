// The admin listener from the outside: liveness and readiness (including PostgreSQL down
// and a schema that is behind), and the record API with and without a token.
#include "ops_common.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::ops;

namespace {

const std::string kOrder = R"({"customer_id":"c-1","amount":1000})";

boost::json::object json_body(const HttpResponse& res) {
  return boost::json::parse(res.body).as_object();
}

}  // namespace

TEST_CASE("ops: admin lookup and purge need the token; probes and metrics are open") {
  TestBackend backend;
  Db db(database_url());
  AdminPort admin;
  const std::string token = unique("token");
  auto o = options_for(backend);
  o.log_level = "info";  // the reload's confirmation is an info line
  o.admin_listen = admin.listen();
  o.admin_token = token;
  Sidecar sidecar(o);
  HttpClient client(sidecar.port());
  HttpClient a(admin.port);

  auto health = a.get("/healthz");
  CHECK(health.status == 200);
  CHECK(json_body(health).at("status") == "alive");
  auto ready = a.get("/readyz");
  CHECK(ready.status == 200);
  CHECK(json_body(ready).at("status") == "ready");
  CHECK(a.get("/metrics").status == 200);

  const auto tenant = unique("tenant");
  // Characters a path would otherwise split or end on: they travel percent-encoded.
  const auto key = unique("key") + "/a?b%c#d";
  auto created = client.post("/orders", kOrder, order_headers(tenant, key));
  REQUIRE(created.status == 201);
  const auto path = record_path(tenant, "POST /orders", key);

  auto anonymous = a.get(path);
  CHECK(anonymous.status == 401);
  CHECK(problem_code(anonymous) == "admin_unauthorized");
  CHECK(anonymous.header("WWW-Authenticate") == "Bearer realm=\"idemproxy-admin\"");
  CHECK(a.get(path, bearer(token + "x")).status == 401);
  CHECK(a.request("DELETE", path, bearer("nope")).status == 401);
  CHECK(read_row(db, tenant, key).has_value());

  auto found = a.get(path, bearer(token));
  REQUIRE(found.status == 200);
  INFO(found.body);
  const auto rec = json_body(found);
  CHECK(rec.at("tenant") == tenant.c_str());
  CHECK(rec.at("scope") == "POST /orders");
  CHECK(rec.at("key") == key.c_str());
  CHECK(rec.at("state") == "completed");
  CHECK(rec.at("attempt") == 1);
  CHECK(rec.at("response_status") == 201);
  CHECK(rec.at("response_body_bytes") == static_cast<std::int64_t>(created.body.size()));
  CHECK(rec.at("expired") == false);
  CHECK(rec.at("lease_expires_at").is_null());
  const auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(str(rec, "fingerprint_prefix") == row->fingerprint.substr(0, 16));
  // RFC 3339 UTC, and the same instant the database holds.
  const auto created_at = str(rec, "created_at");
  CHECK(created_at.size() == 27);
  CHECK(created_at.back() == 'Z');
  CHECK(db.scalar_int("SELECT count(*) FROM idempotency_requests WHERE tenant_id = $1 AND "
                      "created_at = $2::timestamptz", {tenant, created_at}) == 1);
  // Never the body nor a header's value.
  CHECK(found.body.find(created.body) == std::string::npos);
  CHECK(found.body.find(created.header("Location").value_or("?")) == std::string::npos);

  // Not found under another scope: records are never addressed by key alone.
  CHECK(a.get(record_path(tenant, "POST /other", key), bearer(token)).status == 404);
  CHECK(a.get("/admin/records/" + url_encode(tenant) + "/POST /orders/k", bearer(token)).status == 400);

  auto purged = a.request("DELETE", path, bearer(token));
  CHECK(purged.status == 204);
  CHECK_FALSE(read_row(db, tenant, key).has_value());
  auto again = a.request("DELETE", path, bearer(token));
  CHECK(again.status == 404);
  CHECK(problem_code(again) == "record_not_found");
  CHECK(a.get(path, bearer(token)).status == 404);

  // Purged means forgotten: the same key is a new operation.
  auto fresh = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(fresh.status == 201);
  CHECK_FALSE(fresh.has_header("Idempotent-Replayed"));
  CHECK(calls_for(backend, tenant).size() == 2);

  // A reload rotates the token without a restart.
  const auto rotated = unique("rotated");
  auto next = o;
  next.port = sidecar.port();
  next.admin_token = rotated;
  sidecar.reload(sidecar_config(next));
  sidecar.process().wait_for_output("configuration reloaded from");
  CHECK(a.get(path, bearer(token)).status == 401);
  CHECK(a.get(path, bearer(rotated)).status == 200);
  CHECK(sidecar.log().find(rotated) == std::string::npos);
}

TEST_CASE("ops: without a token the record API answers loopback clients") {
  TestBackend backend;
  AdminPort admin;
  auto o = options_for(backend);
  o.admin_listen = admin.listen();
  Sidecar sidecar(o);
  HttpClient client(sidecar.port());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  REQUIRE(client.post("/orders", kOrder, order_headers(tenant, key)).status == 201);
  HttpClient a(admin.port);
  auto found = a.get(record_path(tenant, "POST /orders", key));
  CHECK(found.status == 200);
  CHECK(json_body(found).at("state") == "completed");
}

TEST_CASE("ops: /readyz is 503 while PostgreSQL is stopped and 200 again after it restarts") {
  TestBackend backend;
  AdminPort admin;
  auto o = options_for(backend);
  o.admin_listen = admin.listen();
  o.database_connect_timeout = "1s";
  o.database_statement_timeout = "1s";
  Sidecar sidecar(o);
  HttpClient a(admin.port);
  REQUIRE(a.get("/readyz").status == 200);
  {
    PostgresOutage outage;
    HttpResponse res;
    wait_until([&] {
      res = a.get("/readyz");
      return res.status == 503;
    }, 20s, "/readyz to report the outage");
    const auto reason = str(json_body(res), "reason");
    CHECK((reason == "store_unavailable" || reason == "store_timeout"));
    CHECK(a.get("/healthz").status == 200);  // alive: nothing to restart
    CHECK(a.get("/metrics").status == 200);  // and observable
    outage.end();
  }
  wait_until([&] { return a.get("/readyz").status == 200; }, 30s,
             "/readyz to recover after PostgreSQL restarted");
  CHECK(sidecar.running());
}

TEST_CASE("ops: /readyz is 503 on a schema that is behind, 200 once it is migrated") {
  TestBackend backend;
  ScratchDatabase fresh;
  AdminPort admin;
  auto o = options_for(backend);
  o.admin_listen = admin.listen();
  o.database_url = fresh.url();
  o.database_migrate = "off";  // serve starts without looking at the schema
  Sidecar sidecar(o);
  HttpClient a(admin.port);

  auto behind = a.get("/readyz");
  CHECK(behind.status == 503);
  CHECK(str(json_body(behind), "reason") == "schema_behind");
  CHECK(a.get("/healthz").status == 200);

  auto migrate = run_idemproxy({"migrate", "--config", sidecar.config_path().string()});
  INFO(migrate.output);
  REQUIRE(migrate.status.success());
  wait_until([&] { return a.get("/readyz").status == 200; }, 10s, "/readyz after the migration");
}

// The compatibility rule seen by a replica of this release (docs/operations.md,
// "Upgrading"): a newer migration that allows this binary's schema keeps it ready, with a
// metric and a log line saying so, and it keeps serving (and fencing) as before; one that
// does not turns it unready with a reason of its own.
TEST_CASE("ops: /readyz on a newer schema: ready when it allows this release, schema_incompatible when not") {
  TestBackend backend;
  ScratchDatabase fresh;
  AdminPort admin;
  auto o = options_for(backend);
  o.admin_listen = admin.listen();
  o.database_url = fresh.url();
  o.database_migrate = "auto";
  o.log_level = "info";
  Sidecar sidecar(o);
  HttpClient a(admin.port);
  HttpClient client(sidecar.port());
  Db db(fresh.url());
  REQUIRE(a.get("/readyz").status == 200);
  const int version = static_cast<int>(db.scalar_int("SELECT max(version) FROM idemproxy_schema_migrations"));

  // A newer release migrated: its migration allows schemas from this one's on.
  db.exec("INSERT INTO idemproxy_schema_migrations (version, name, checksum, compatible_from)"
          " VALUES ($1, 'add_a_column', 'x', $2)", {version + 1, version});
  auto ready = a.get("/readyz");
  REQUIRE(ready.status == 200);
  CHECK(str(json_body(ready), "reason") == "schema_newer_compatible");
  CHECK(str(json_body(ready), "detail").find(std::to_string(version + 1)) != std::string::npos);
  const auto metrics = a.get("/metrics").body;
  CHECK(metrics.find("idemproxy_schema_newer_compatible 1") != std::string::npos);
  CHECK(metrics.find("idemproxy_schema_version{of=\"database\"} " + std::to_string(version + 1)) !=
        std::string::npos);
  sidecar.wait_for_log("newer than this binary");
  // It serves as before: one order, one record, a replay.
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  CHECK(client.post("/orders", kOrder, order_headers(tenant, key)).status == 201);
  auto replay = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(replay.status == 201);
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(calls_for(backend, tenant).size() == 1);
  CHECK(db.scalar_int("SELECT count(*) FROM idempotency_requests WHERE tenant_id = $1", {tenant}) == 1);

  // A later one needs binaries of its own schema: this replica must leave the Service.
  db.exec("INSERT INTO idemproxy_schema_migrations (version, name, checksum, compatible_from)"
          " VALUES ($1, 'drop_a_column', 'x', $1)", {version + 2});
  auto unready = a.get("/readyz");
  CHECK(unready.status == 503);
  CHECK(str(json_body(unready), "reason") == "schema_incompatible");
  CHECK(str(json_body(unready), "detail").find("drop_a_column") != std::string::npos);
  CHECK(a.get("/metrics").body.find("idemproxy_schema_newer_compatible 0") != std::string::npos);

  // Restarted on it (a rollback one release too far), it refuses to start, saying why.
  sidecar.stop();
  auto serve = run_idemproxy({"serve", "--config", sidecar.config_path().string()});
  CHECK(serve.status.code() == 1);
  CHECK(serve.output.find("drop_a_column") != std::string::npos);
  CHECK(serve.output.find("deploy a newer release") != std::string::npos);
}
