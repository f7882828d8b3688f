// The reload policy: what a SIGHUP applies at once and what waits for a restart.
#include <doctest/doctest.h>

#include <algorithm>

#include "app/config.hpp"

using namespace idem;

namespace {

settings::Settings base() {
  settings::Settings s;
  s.listen = {"127.0.0.1", 8080};
  s.upstream.url = "http://127.0.0.1:3000";
  s.upstream.host = "127.0.0.1";
  s.upstream.port = 3000;
  s.database.url = "postgresql://db/orders";
  s.workers = 2;
  s.admin.listen = settings::Endpoint{"127.0.0.1", 9901};
  s.admin.token = "old-token";
  s.replay_cache.enabled = true;
  settings::RouteSettings r;
  r.name = "create-order";
  r.wait = Millis{5000};
  s.routes.push_back(r);
  return s;
}

bool lists(const app::ReloadPlan& p, std::string_view key) {
  return std::find(p.restart_only.begin(), p.restart_only.end(), key) != p.restart_only.end();
}

}  // namespace

TEST_CASE("reload: an unchanged file plans nothing for a restart") {
  const auto running = base();
  const auto plan = app::plan_reload(running, running, true);
  CHECK(plan.restart_only.empty());
}

TEST_CASE("reload: routes, limits, logging, cleanup and the admin token apply at once") {
  const auto running = base();
  auto next = base();
  next.routes.front().wait = Millis{100};
  next.limits.max_request_body = 1234;
  next.log.level = settings::LogLevel::debug;
  next.cleanup.batch = 7;
  next.admin.token = "new-token";
  next.replay_cache.max_bytes = 99;
  const auto plan = app::plan_reload(next, running, true);
  CHECK(plan.restart_only.empty());
  CHECK(plan.effective->routes.front().wait == Millis{100});
  CHECK(plan.effective->limits.max_request_body == 1234);
  CHECK(plan.effective->log.level == settings::LogLevel::debug);
  CHECK(plan.effective->cleanup.batch == 7);
  CHECK(plan.effective->admin.token == "new-token");
  CHECK(plan.effective->replay_cache.max_bytes == 99);
}

TEST_CASE("reload: what is bound at start-up keeps its running value and is named") {
  const auto running = base();
  auto next = base();
  next.listen.port = 8081;
  next.upstream.url = "http://127.0.0.1:4000";
  next.upstream.port = 4000;
  next.database.statement_timeout = Millis{9000};
  next.workers = 4;
  next.admin.listen.reset();
  next.routes.front().wait = Millis{100};  // still applied
  const auto plan = app::plan_reload(next, running, true);
  CHECK(plan.restart_only.size() == 5);
  for (const char* key : {"listen", "upstream", "database", "workers", "admin.listen"}) {
    CAPTURE(key);
    CHECK(lists(plan, key));
  }
  const auto& e = *plan.effective;
  CHECK(e.listen.port == 8080);
  CHECK(e.upstream.port == 3000);
  CHECK(e.upstream.url == "http://127.0.0.1:3000");
  CHECK(e.database.statement_timeout == running.database.statement_timeout);
  CHECK(e.workers == 2);
  REQUIRE(e.admin.listen.has_value());
  CHECK(e.admin.listen->port == 9901);
  CHECK(e.routes.front().wait == Millis{100});
}

TEST_CASE("reload: the replay cache switches only with a running change feed") {
  const auto running = base();
  auto next = base();
  next.replay_cache.enabled = false;
  SUBCASE("feed running: the cache can be switched off") {
    const auto plan = app::plan_reload(next, running, true);
    CHECK_FALSE(plan.effective->replay_cache.enabled);
    CHECK(plan.restart_only.empty());
  }
  SUBCASE("no feed (started disabled): enabling it waits for a restart") {
    auto off = base();
    off.replay_cache.enabled = false;
    auto on = base();
    const auto plan = app::plan_reload(on, off, false);
    CHECK_FALSE(plan.effective->replay_cache.enabled);
    CHECK(lists(plan, "replay_cache.enabled"));
  }
}

// --- TLS and verified identity -------------------------------------------------------------

namespace {

settings::Settings with_tls(settings::Settings s) {
  s.tls = settings::ListenerTls{"/etc/tls/server.pem", "/etc/tls/server.key", ""};
  s.upstream.url = "https://orders.internal:8443";
  s.upstream.https = true;
  s.upstream.host = "orders.internal";
  s.upstream.port = 8443;
  s.upstream.tls.ca_file = "/etc/tls/ca.pem";
  s.tenant.from = settings::TenantSource::jwt;
  s.tenant.jwt.jwks_file = "/etc/idemproxy/jwks.json";
  s.tenant.jwt.issuers = {"https://idp.example/"};
  s.tenant.jwt.audiences = {"orders-api"};
  s.tenant.jwt.tenant_claim = "tenant";
  return s;
}

}  // namespace

TEST_CASE("reload: TLS files, upstream.tls and the JWT settings apply at once") {
  const auto running = with_tls(base());
  auto next = with_tls(base());
  next.tls->cert_file = "/etc/tls/rotated.pem";
  next.tls->key_file = "/etc/tls/rotated.key";
  next.tls->client_ca_file = "/etc/tls/clients.pem";
  next.upstream.tls.ca_file = "/etc/tls/new-ca.pem";
  next.upstream.tls.server_name = "orders.example";
  next.tenant.jwt.jwks_file = "/etc/idemproxy/jwks-2.json";
  next.tenant.jwt.audiences = {"orders-api", "orders-api-v2"};
  next.tenant.jwt.leeway = Millis{5000};
  const auto plan = app::plan_reload(next, running, true);
  CHECK(plan.restart_only.empty());
  const auto& e = *plan.effective;
  CHECK(e.tls->cert_file == "/etc/tls/rotated.pem");
  CHECK(e.tls->client_ca_file == "/etc/tls/clients.pem");
  CHECK(e.upstream.tls.ca_file == "/etc/tls/new-ca.pem");
  CHECK(e.upstream.tls.server_name == "orders.example");
  CHECK(e.tenant.jwt.jwks_file == "/etc/idemproxy/jwks-2.json");
  CHECK(e.tenant.jwt.audiences.size() == 2);
  CHECK(e.tenant.jwt.leeway == Millis{5000});
}

TEST_CASE("reload: TLS on or off, another identity mode, another upstream scheme wait for a restart") {
  const auto running = with_tls(base());
  auto next = base();  // plain listener, http upstream, tenant from header
  const auto plan = app::plan_reload(next, running, true);
  for (const char* key : {"tls", "tenant.from", "upstream"}) {
    CAPTURE(key);
    CHECK(lists(plan, key));
  }
  const auto& e = *plan.effective;
  REQUIRE(e.tls.has_value());
  CHECK(e.tls->cert_file == "/etc/tls/server.pem");
  CHECK(e.tenant.from == settings::TenantSource::jwt);
  CHECK(e.tenant.jwt.jwks_file == "/etc/idemproxy/jwks.json");  // verification never dropped
  CHECK(e.upstream.https);
  CHECK(e.upstream.tls.ca_file == "/etc/tls/ca.pem");

  // The other way: a running plain sidecar is not switched to TLS or jwt by a reload.
  const auto back = app::plan_reload(with_tls(base()), base(), true);
  CHECK(lists(back, "tls"));
  CHECK(lists(back, "tenant.from"));
  CHECK_FALSE(back.effective->tls.has_value());
  CHECK(back.effective->tenant.from == settings::TenantSource::header);
}

TEST_CASE("reload: mtls keeps the client CA it needs") {
  auto running = base();
  running.tls = settings::ListenerTls{"/c.pem", "/k.pem", "/clients.pem"};
  running.tenant.from = settings::TenantSource::mtls;
  running.tenant.mtls.uri_prefix = "spiffe://orders.example/tenant/";
  auto next = running;
  next.tls->client_ca_file.clear();
  next.tenant.from = settings::TenantSource::header;  // itself restart-only
  const auto plan = app::plan_reload(next, running, true);
  CHECK(lists(plan, "tenant.from"));
  CHECK(lists(plan, "tls.client_ca_file"));
  CHECK(plan.effective->tls->client_ca_file == "/clients.pem");
  CHECK(plan.effective->tenant.from == settings::TenantSource::mtls);
}

// --- encryption keys --------------------------------------------------------------------------

namespace {

settings::Settings with_keys(settings::Settings s, std::vector<std::string> ids, std::string active) {
  s.encryption.keys.clear();
  for (auto& id : ids) s.encryption.keys.push_back({id, "/etc/idemproxy/" + id + ".key"});
  s.encryption.active = std::move(active);
  return s;
}

std::string reload_error(const settings::Settings& next, const settings::Settings& running) {
  try {
    app::plan_reload(next, running, true);
  } catch (const settings::ConfigError& e) {
    return e.key() + ": " + e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("reload: new encryption keys and another active key apply at once") {
  const auto running = with_keys(base(), {"a"}, "a");
  auto next = with_keys(base(), {"a", "b"}, "b");
  next.encryption.keys[0].file = "/etc/idemproxy/a-moved.key";
  const auto plan = app::plan_reload(next, running, true);
  CHECK(plan.restart_only.empty());
  const auto& e = plan.effective->encryption;
  REQUIRE(e.keys.size() == 2);
  CHECK(e.keys[0].file == "/etc/idemproxy/a-moved.key");
  CHECK(e.keys[1].id == "b");
  CHECK(e.active == "b");
  // Retiring a key is a reload too (its records stop opening: 503, never another answer).
  const auto retired = app::plan_reload(with_keys(base(), {"b"}, "b"), next, true);
  CHECK(retired.restart_only.empty());
  CHECK(retired.effective->encryption.keys.size() == 1);
}

TEST_CASE("reload: encryption is not turned on or off; kept, it still refuses clear backend records") {
  const auto on = with_keys(base(), {"a"}, "a");
  const auto off = base();
  const auto to_off = app::plan_reload(off, on, true);
  CHECK(lists(to_off, "encryption"));
  CHECK(to_off.effective->encryption.active == "a");
  const auto to_on = app::plan_reload(on, off, true);
  CHECK(lists(to_on, "encryption"));
  CHECK(to_on.effective->encryption.keys.empty());

  // The file without encryption may have a backend-completed route; the running keys stay,
  // and would store that route's records in clear without the opt-in: refused.
  auto backend = off;
  backend.routes.front().completion = settings::Completion::backend;
  const auto refused = reload_error(backend, on);
  CHECK(refused.rfind("routes[0].completion: ", 0) == 0);
  CHECK(refused.find("allow_clear_backend_records") != std::string::npos);
  auto allowed = on;
  allowed.encryption.allow_clear_backend_records = true;
  CHECK(app::plan_reload(backend, allowed, true).effective->routes.front().completion ==
        settings::Completion::backend);
}
