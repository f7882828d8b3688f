// render_effective: every key present, secrets masked, and the text loads back unchanged.
#include <doctest/doctest.h>

#include "settings/support.hpp"

using namespace idem::settings;
using namespace idem::settings::test;
using idem::Millis;

namespace {

// Every field compared, so a key the renderer forgets fails the round trip.
void check_same(const Settings& a, const Settings& b) {
  CHECK(a.listen.host == b.listen.host);
  CHECK(a.listen.port == b.listen.port);
  CHECK(a.workers == b.workers);
  CHECK(a.upstream.url == b.upstream.url);
  CHECK(a.upstream.host == b.upstream.host);
  CHECK(a.upstream.port == b.upstream.port);
  CHECK(a.upstream.base_path == b.upstream.base_path);
  CHECK(a.upstream.connect_timeout == b.upstream.connect_timeout);
  CHECK(a.upstream.response_timeout == b.upstream.response_timeout);
  CHECK(a.upstream.max_response_body == b.upstream.max_response_body);
  CHECK(a.database.url == b.database.url);
  CHECK(a.database.pool_size == b.database.pool_size);
  CHECK(a.database.connect_timeout == b.database.connect_timeout);
  CHECK(a.database.statement_timeout == b.database.statement_timeout);
  CHECK(a.database.migrate == b.database.migrate);
  CHECK(a.database.batching == b.database.batching);
  CHECK(a.database.batch_max == b.database.batch_max);
  CHECK(a.tenant.header == b.tenant.header);
  CHECK(a.tenant.principal_header == b.tenant.principal_header);
  CHECK(a.tenant.from == b.tenant.from);
  CHECK(a.tenant.jwt.jwks_file == b.tenant.jwt.jwks_file);
  CHECK(a.tenant.jwt.issuers == b.tenant.jwt.issuers);
  CHECK(a.tenant.jwt.audiences == b.tenant.jwt.audiences);
  CHECK(a.tenant.jwt.tenant_claim == b.tenant.jwt.tenant_claim);
  CHECK(a.tenant.jwt.principal_claim == b.tenant.jwt.principal_claim);
  CHECK(a.tenant.jwt.leeway == b.tenant.jwt.leeway);
  CHECK(a.tenant.mtls.uri_prefix == b.tenant.mtls.uri_prefix);
  CHECK(a.tls.has_value() == b.tls.has_value());
  if (a.tls && b.tls) {
    CHECK(a.tls->cert_file == b.tls->cert_file);
    CHECK(a.tls->key_file == b.tls->key_file);
    CHECK(a.tls->client_ca_file == b.tls->client_ca_file);
  }
  CHECK(a.upstream.https == b.upstream.https);
  CHECK(a.upstream.tls.ca_file == b.upstream.tls.ca_file);
  CHECK(a.upstream.tls.server_name == b.upstream.tls.server_name);
  CHECK(a.upstream.tls.verify == b.upstream.tls.verify);
  CHECK(a.limits.max_header_bytes == b.limits.max_header_bytes);
  CHECK(a.limits.max_request_body == b.limits.max_request_body);
  CHECK(a.limits.header_timeout == b.limits.header_timeout);
  CHECK(a.limits.body_timeout == b.limits.body_timeout);
  CHECK(a.limits.idle_timeout == b.limits.idle_timeout);
  CHECK(a.limits.max_connections == b.limits.max_connections);
  CHECK(a.limits.drain_timeout == b.limits.drain_timeout);
  CHECK(a.admin.listen.has_value() == b.admin.listen.has_value());
  if (a.admin.listen && b.admin.listen) {
    CHECK(a.admin.listen->host == b.admin.listen->host);
    CHECK(a.admin.listen->port == b.admin.listen->port);
  }
  CHECK(a.admin.token == b.admin.token);
  CHECK(a.log.level == b.log.level);
  CHECK(a.log.format == b.log.format);
  CHECK(a.cleanup.interval == b.cleanup.interval);
  CHECK(a.cleanup.batch == b.cleanup.batch);
  CHECK(a.unmatched == b.unmatched);
  REQUIRE(a.routes.size() == b.routes.size());
  for (std::size_t i = 0; i < a.routes.size(); ++i) {
    const auto& x = a.routes[i];
    const auto& y = b.routes[i];
    CHECK(x.name == y.name);
    CHECK(x.method == y.method);
    CHECK(x.path == y.path);
    CHECK(x.scope == y.scope);
    CHECK(x.key.from == y.key.from);
    CHECK(x.key.header == y.key.header);
    CHECK(x.key.pointer == y.key.pointer);
    CHECK(x.key.param == y.key.param);
    CHECK(x.key.required == y.key.required);
    CHECK(x.key.max_length == y.key.max_length);
    CHECK(x.fingerprint.format == y.fingerprint.format);
    CHECK(x.fingerprint.media_types == y.fingerprint.media_types);
    CHECK(x.fingerprint.repeated_names == y.fingerprint.repeated_names);
    CHECK(x.fingerprint.version == y.fingerprint.version);
    CHECK(x.fingerprint.fields == y.fingerprint.fields);
    CHECK(x.fingerprint.ignore == y.fingerprint.ignore);
    CHECK(x.fingerprint.defaults == y.fingerprint.defaults);
    CHECK(x.fingerprint.headers == y.fingerprint.headers);
    CHECK(x.fingerprint.query == y.fingerprint.query);
    CHECK(x.retention == y.retention);
    CHECK(x.lease == y.lease);
    CHECK(x.wait == y.wait);
    CHECK(x.retry_after == y.retry_after);
    CHECK(x.mismatch_status == y.mismatch_status);
    REQUIRE(x.store.statuses.size() == y.store.statuses.size());
    for (std::size_t k = 0; k < x.store.statuses.size(); ++k) {
      CHECK(x.store.statuses[k].low == y.store.statuses[k].low);
      CHECK(x.store.statuses[k].high == y.store.statuses[k].high);
    }
    CHECK(x.store.except == y.store.except);
    CHECK(x.replay_headers == y.replay_headers);
    CHECK(x.max_stored_body == y.max_stored_body);
    CHECK(x.completion == y.completion);
    REQUIRE(x.async.has_value() == y.async.has_value());
    if (x.async) {
      CHECK(x.async->after == y.async->after);
      CHECK(x.async->status_path == y.async->status_path);
    }
    CHECK(x.replay_mode == y.replay_mode);
    CHECK(x.refetch_hosts == y.refetch_hosts);
    CHECK(x.on_unknown_outcome == y.on_unknown_outcome);
    CHECK(x.reconcile.method == y.reconcile.method);
    CHECK(x.reconcile.path == y.reconcile.path);
    REQUIRE(x.same_payload_new_key.has_value() == y.same_payload_new_key.has_value());
    if (x.same_payload_new_key) {
      CHECK(x.same_payload_new_key->window == y.same_payload_new_key->window);
      CHECK(x.same_payload_new_key->action == y.same_payload_new_key->action);
    }
  }
  CHECK(a.policy_path == b.policy_path);
}

const std::string kRich = R"(listen: "[::1]:18080"
workers: 3
upstream:
  url: "http://orders.internal:3000/api/"
  connect_timeout: 1500ms
  response_timeout: 2m
  max_response_body: 3000
database:
  url: "host=db dbname=orders user=idem"
  pool_size: 12
  connect_timeout: 7s
  statement_timeout: 250ms
  migrate: auto
  batching: false
  batch_max: 7
tenant:
  header: X-Org
  principal_header: X-User-Id
limits:
  max_header_bytes: 32KiB
  max_request_body: 2MiB
  header_timeout: 3s
  body_timeout: 4s
  idle_timeout: 5s
  max_connections: 77
  drain_timeout: 1500ms
admin:
  listen: ""
log:
  level: warn
  format: text
cleanup:
  interval: 90s
  batch: 5
unmatched: reject
policy_path: /idempotency-policy
routes:
  - name: create-order
    method: post
    path: /orders
    fingerprint:
      version: "v2 \"quoted\" $$1"
      fields: [/customer_id, /items/*/sku, "/a~1b"]
      ignore: [/trace_id]
      defaults:
        /currency: "EUR"
        /qty: 1
        /price: 1.5e3
        /flags: [true, null, "$$x"]
        /addr: {zip: "1000", "$k": "$$v", line: "two\nlines"}
      headers: [X-Api-Version]
      query: true
    retention: 7d
    lease: 45s
    wait: 2s
    retry_after: 3s
    mismatch_status: 422
    store:
      statuses: ["2xx", 409, "5xx"]
      except: [503]
    replay_headers: [Content-Type]
    max_stored_body: 0
    async: {after: 1500ms, status_path: "/operations/{operation_id}/status"}
    replay: {mode: refetch, hosts: ["Orders.Example", "api.example:08443", "[::1]:9000"]}
    on_unknown_outcome: reconcile
    reconcile: {method: post, path: "/orders/lookup/{operation_id}"}
  - name: tenant-orders
    method: PUT
    path: /tenants/{tid}/orders/{id}
    scope: "orders:put"
    key: {header: X-Request-Key, required: false, max_length: 64}
    replay_headers: []
  - name: square-orders
    method: POST
    path: /v2/orders
    key: {from: body, pointer: "/idempotency_key", max_length: 45}
  - name: aws-orders
    method: POST
    path: /v1/orders
    key: {from: query, param: "Client Token$$", header: X-Amz-Token}
    fingerprint: {query: true}
  - name: stripe-charges
    method: POST
    path: /v1/charges
    key: {from: body, pointer: "metadata[idempotency_key]"}
    fingerprint:
      format: form
      repeated_names: list
      fields: [/amount, /currency, "/items/*/price"]
      defaults: {/currency: "usd", /tags: ["a", null]}
  - name: proto-orders
    method: PUT
    path: /v3/orders
    fingerprint: {format: raw, media_types: [application/x-protobuf, Application/Vnd.Acme+CBOR], headers: [X-Proto-Schema]}
    same_payload_new_key: {window: 90s, action: reject}
  - name: mobile-orders
    method: POST
    path: /m/orders
    same_payload_new_key: {}
)";

}  // namespace

TEST_CASE("mask_database_url") {
  CHECK(mask_database_url("postgresql://idem:s3cret@db:5432/orders") == "postgresql://idem:****@db:5432/orders");
  CHECK(mask_database_url("postgres://idem@db/orders") == "postgres://idem@db/orders");
  CHECK(mask_database_url("postgresql://db/orders") == "postgresql://db/orders");
  CHECK(mask_database_url("postgresql://u:p%40ss@h1:5432,h2:5433/db?target_session_attrs=read-write") ==
        "postgresql://u:****@h1:5432,h2:5433/db?target_session_attrs=read-write");
  CHECK(mask_database_url("postgresql://u@h/db?sslmode=require&password=hunter2&application_name=x") ==
        "postgresql://u@h/db?sslmode=require&password=****&application_name=x");
  CHECK(mask_database_url("postgresql://h/db?password=a&sslpassword=b") ==
        "postgresql://h/db?password=****&sslpassword=****");
  CHECK(mask_database_url("postgresql://u:@h/db") == "postgresql://u:****@h/db");
  CHECK(mask_database_url("host=db user=idem password=s3cret dbname=orders") ==
        "host=db user=idem password=**** dbname=orders");
  CHECK(mask_database_url("host=db password = 'se cr\\'et' dbname=x") == "host=db password = **** dbname=x");
  // Malformed quoting: whatever follows is masked too (libpq would refuse the string).
  CHECK(mask_database_url("host=db password='it''s secret' dbname=x") == "host=db password=********");
  CHECK(mask_database_url("password=a\\ b host=db") == "password=**** host=db");
  CHECK(mask_database_url("host=db sslpassword='k' password=") == "host=db sslpassword=**** password=****");
  CHECK(mask_database_url("host=db garbage s3cret") == "host=db garbage ****");
  CHECK(mask_database_url("") == "");
  // A connection URI inside a conninfo value (libpq expands such a dbname): its password
  // is masked too (fuzz/config).
  CHECK(mask_database_url("host=db dbname=postgresql://u:s3cret@h/db") ==
        "host=db dbname=postgresql://u:****@h/db");
  CHECK(mask_database_url("host=db user=i[::1]:postgresql://idem:pw@db:5432/orders-x} dbname=o") ==
        "host=db user=i[::1]:postgresql://idem:****@db:5432/orders-x} dbname=o");
  CHECK(mask_database_url("host=db dbname=postgresql://u@h/db") == "host=db dbname=postgresql://u@h/db");
  CHECK(mask_database_url("postgresql://u:a@h/db\x1a postgresql://u:b@h/db") ==
        "postgresql://u:****@h/db\x1a postgresql://u:****@h/db");
}

TEST_CASE("render_effective masks secrets") {
  const auto s = load("upstream: {url: \"http://h\"}\n"
                      "database: {url: \"postgresql://idem:pa$$w0rd@db/orders?password=x\"}\n"
                      "admin: {token: \"t0ken\"}\n");
  CHECK(s->database.url == "postgresql://idem:pa$w0rd@db/orders?password=x");
  const auto text = render_effective(*s);
  INFO(text);
  CHECK(text.find("w0rd") == std::string::npos);
  CHECK(text.find("t0ken") == std::string::npos);
  CHECK(text.find("password=x") == std::string::npos);
  CHECK(text.find("  url: \"postgresql://idem:****@db/orders?password=****\"\n") != std::string::npos);
  CHECK(text.find("  token: \"****\"\n") != std::string::npos);
  // Still a valid configuration: check-config output can be fed back once secrets are filled in.
  const auto again = load(text);
  CHECK(again->database.url == "postgresql://idem:****@db/orders?password=****");
  CHECK(again->admin.token == "****");

  const auto conninfo = load("upstream: {url: \"http://h\"}\n"
                             "database: {url: \"host=db password='p w' user=u\"}\n");
  CHECK(render_effective(*conninfo).find("  url: \"host=db password=**** user=u\"\n") != std::string::npos);
  const auto no_token = load(kMinimal);
  CHECK(render_effective(*no_token).find("  token: \"\"\n") != std::string::npos);
}

TEST_CASE("render_effective writes every key with defaults in readable units") {
  const auto s = load(kMinimal + "routes:\n  - {name: r, method: POST, path: /orders}\n");
  const auto text = render_effective(*s);
  INFO(text);
  for (const char* line : {
           "listen: \"127.0.0.1:8080\"\n", "workers: 0", "upstream:\n  url: \"http://127.0.0.1:3000\"\n",
           "  connect_timeout: 2s\n", "  response_timeout: 30s\n", "  max_response_body: 8MiB\n",
           "  pool_size: 8\n", "  connect_timeout: 5s\n", "  statement_timeout: 2s\n", "  migrate: check\n",
           "  header: \"X-Tenant-Id\"\n", "  principal_header: \"\"\n", "  max_header_bytes: 16KiB\n",
           "  max_request_body: 1MiB\n", "  header_timeout: 10s\n", "  body_timeout: 30s\n",
           "  idle_timeout: 75s\n", "  max_connections: 10000\n", "  drain_timeout: 30s\n", "  listen: \"127.0.0.1:9901\"\n",
           "  level: info\n", "  format: json\n", "  interval: 1m\n", "  batch: 1000\n", "unmatched: pass\n",
           "  - name: \"r\"\n", "    method: \"POST\"\n", "    path: \"/orders\"\n", "    scope: \"POST /orders\"\n",
           "      from: header\n", "      header: \"Idempotency-Key\"\n", "      required: true\n", "      max_length: 255\n",
           "      format: json\n", "      version: \"1\"\n", "      # fields: not set", "      ignore: []\n", "      defaults: {}\n",
           "      headers: []\n", "      query: false\n", "    retention: 1d\n", "    lease: 30s\n",
           "    wait: 5s\n", "    retry_after: 1s\n", "    mismatch_status: 409\n",
           "      statuses: [\"2xx\", \"4xx\"]\n", "      except: [408, 425, 429]\n",
           "    replay_headers: [\"Content-Type\", \"Location\", \"ETag\"]\n", "    max_stored_body: 1MiB\n"}) {
    INFO(line);
    CHECK(text.find(line) != std::string::npos);
  }
  CHECK(render_effective(*load(kMinimal)).find("routes: []\n") != std::string::npos);
}

TEST_CASE("render_effective round-trips") {
  const auto first = load(kRich);
  REQUIRE(first->routes.size() == 7);
  REQUIRE(first->routes[5].same_payload_new_key.has_value());
  CHECK(first->routes[5].same_payload_new_key->window == Millis{90000});
  CHECK(first->routes[6].same_payload_new_key->action == SamePayloadAction::count);
  CHECK(first->routes[6].same_payload_new_key->window == Millis{600000});
  CHECK_FALSE(first->routes[0].same_payload_new_key.has_value());
  CHECK(first->routes[4].fingerprint.format == BodyFormat::form);
  CHECK(first->routes[5].fingerprint.media_types ==
        std::vector<std::string>{"application/x-protobuf", "application/vnd.acme+cbor"});
  CHECK(first->routes[2].key.from == KeySource::body);
  CHECK(first->routes[3].key.param == "Client Token$");
  // Spot checks that kRich exercises what it claims to.
  const auto& fp = first->routes[0].fingerprint;
  CHECK(fp.version == "v2 \"quoted\" $1");
  CHECK(fp.defaults.at("/flags") == "[true,null,\"$x\"]");
  CHECK(fp.defaults.at("/addr") == "{\"$k\":\"$v\",\"line\":\"two\\nlines\",\"zip\":\"1000\"}");
  CHECK(fp.defaults.at("/price") == "1.5e3");
  CHECK_FALSE(first->admin.listen.has_value());
  CHECK(first->upstream.base_path == "/api");
  REQUIRE(first->routes[0].async.has_value());
  CHECK(first->routes[0].async->after == Millis{1500});
  CHECK(first->routes[0].replay_mode == ReplayMode::refetch);
  CHECK(first->routes[0].refetch_hosts ==
        std::vector<std::string>{"orders.example", "api.example:8443", "[::1]:9000"});
  CHECK(first->routes[0].on_unknown_outcome == UnknownOutcome::reconcile);
  CHECK(first->routes[0].reconcile.method == "POST");
  CHECK_FALSE(first->routes[1].async.has_value());
  CHECK(first->policy_path == "/idempotency-policy");

  const auto text = render_effective(*first);
  INFO(text);
  const auto second = load(text);
  check_same(*first, *second);
  // Rendering is a fixed point: the reloaded settings render to the same text.
  CHECK(render_effective(*second) == text);
}

TEST_CASE("render_effective round-trips the defaults and the contract example") {
  const auto minimal = load(kMinimal + "routes:\n  - {name: r, method: POST, path: /orders}\n");
  check_same(*minimal, *load(render_effective(*minimal)));

  // An https upstream with every TLS default: check-config prints ca_file and server_name
  // as "" (found by fuzz/config: the printed file did not load).
  const auto https = load("upstream:\n  url: https://h:8443/base\ndatabase:\n  url: postgresql://app@db/orders\n");
  const auto https_text = render_effective(*https);
  INFO(https_text);
  CHECK(https_text.find("    ca_file: \"\"\n") != std::string::npos);
  const auto https_again = load(https_text);
  check_same(*https, *https_again);
  CHECK(https_again->upstream.tls.ca_file.empty());
  CHECK(https_again->upstream.tls.server_name.empty());
  CHECK(render_effective(*https_again) == https_text);

  const Env env{{"DATABASE_URL", "postgresql://idem@db/orders"}};
  const std::string example =
      "upstream: {url: \"http://127.0.0.1:3000\"}\n"
      "database: {url: \"${DATABASE_URL}\"}\n"
      "routes:\n"
      "  - name: create-order\n"
      "    method: POST\n"
      "    path: /orders\n"
      "    fingerprint:\n"
      "      fields: [/customer_id, /currency, /amount, /items, /shipping/address_id]\n"
      "      ignore: [/trace_id, /client_sent_at]\n"
      "      defaults: { /currency: \"EUR\" }\n";
  const auto s = load(example, env);
  const auto reloaded = load(render_effective(*s));  // no ${...} left in the output
  check_same(*s, *reloaded);
}

TEST_CASE("render_effective writes keys longer than YAML's implicit-key limit as explicit keys") {
  // YAML limits an implicit key to 1024 characters; the config fuzzer found a default whose
  // JSON member name was 1288 bytes, and the printed configuration did not load. (The file
  // itself has to use explicit keys for them too.)
  const std::string name(1300, 'n');
  const std::string pointer = "/" + std::string(1100, 'p');
  const auto s = load(kMinimal +
                      "routes:\n  - name: r\n    method: POST\n    path: /orders\n    fingerprint:\n"
                      "      defaults:\n"
                      "        ? \"" + pointer + "\"\n"
                      "        : {? \"" + name + "\": [1, {\"short\": 2}], \"b\": 3}\n"
                      "        /c: {? \"" + name + "\": 4}\n");
  REQUIRE(s->routes.size() == 1);
  const auto& defaults = s->routes[0].fingerprint.defaults;
  REQUIRE(defaults.count(pointer) == 1);
  CHECK(defaults.at(pointer).find("\"" + name + "\":[1,{\"short\":2}]") != std::string::npos);
  const auto text = render_effective(*s);
  INFO(text.substr(0, 2000));
  CHECK(text.find("? \"" + name + "\": ") != std::string::npos);  // flow: explicit key
  CHECK(text.find("        ? \"" + pointer + "\"\n        : {") != std::string::npos);  // block
  CHECK(text.find("\"short\": 2") != std::string::npos);  // short keys stay implicit
  const auto again = load(text);
  check_same(*s, *again);
  CHECK(render_effective(*again) == text);
}
