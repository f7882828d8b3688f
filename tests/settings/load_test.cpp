// Loading: the documented example, the defaults, ${VAR} expansion, and the error for every
// kind of mistake (with its line and key).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <unistd.h>

#include "settings/support.hpp"

using namespace idem::settings;
using namespace idem::settings::test;
using idem::Millis;

namespace {

// contract.md §3, verbatim.
const std::string kContractExample = R"(listen: "127.0.0.1:8080"
upstream:
  url: "http://127.0.0.1:3000"
  connect_timeout: 2s
  response_timeout: 30s          # whole upstream exchange
  max_response_body: 8MiB
database:
  url: "${DATABASE_URL}"         # libpq URI or conninfo; multi-host URIs work as libpq defines
  pool_size: 8
  connect_timeout: 5s
  statement_timeout: 2s
  migrate: check                 # check | auto | off
tenant:
  header: X-Tenant-Id            # trusted header set by the authenticating layer in front
  principal_header: ""           # optional, e.g. X-User-Id: replay only to the same principal
limits:
  max_header_bytes: 16KiB
  max_request_body: 1MiB
  header_timeout: 10s
  body_timeout: 30s
  idle_timeout: 75s
  max_connections: 10000
admin:
  listen: "127.0.0.1:9901"       # /healthz /readyz /metrics /admin/...
  token: ""                      # bearer token for /admin/..., empty = loopback only
log:
  level: info                    # trace | debug | info | warn | error
  format: json                   # json | text
cleanup:
  interval: 60s
  batch: 1000
unmatched: pass                  # pass (proxy unchanged) | reject (404)
routes:
  - name: create-order
    method: POST
    path: /orders                # exact, or a template such as /tenants/{tid}/orders
    scope: "POST /orders"        # the `endpoint` column; default "METHOD path"
    key:
      header: Idempotency-Key
      required: true             # false: requests without a key pass through unprotected
      max_length: 255
    fingerprint:
      version: "1"               # part of the hash; bump it when the canonical form changes
      fields: [/customer_id, /currency, /amount, /items, /shipping/address_id]
      ignore: [/trace_id, /client_sent_at]
      defaults: { /currency: "EUR" }
      headers: []                # request headers that belong to the operation
      query: false               # include the canonical query string
    retention: 24h
    lease: 30s
    wait: 5s                     # how long a duplicate waits for the first before answering in-progress
    retry_after: 1s
    mismatch_status: 409         # 409 (default) or 422 (IETF draft)
    store:
      statuses: ["2xx", "4xx"]   # recorded and replayed
      except: [408, 425, 429]    # never recorded: the claim is released
    replay_headers: [Content-Type, Location, ETag]
    max_stored_body: 1MiB
)";

}  // namespace

TEST_CASE("the contract's example configuration loads with the stated values") {
  const Env env{{"DATABASE_URL", "postgresql://idem:secret@db.internal:5432/orders"}};
  const auto s = load(kContractExample, env);
  CHECK(s->source_file == "test.yaml");
  CHECK(s->listen.host == "127.0.0.1");
  CHECK(s->listen.port == 8080);
  CHECK(s->workers == 0);
  CHECK(s->upstream.url == "http://127.0.0.1:3000");
  CHECK(s->upstream.host == "127.0.0.1");
  CHECK(s->upstream.port == 3000);
  CHECK(s->upstream.base_path == "");
  CHECK(s->upstream.connect_timeout == Millis(2000));
  CHECK(s->upstream.response_timeout == Millis(30000));
  CHECK(s->upstream.max_response_body == 8u * 1024 * 1024);
  CHECK(s->database.url == "postgresql://idem:secret@db.internal:5432/orders");
  CHECK(s->database.pool_size == 8);
  CHECK(s->database.connect_timeout == Millis(5000));
  CHECK(s->database.statement_timeout == Millis(2000));
  CHECK(s->database.migrate == MigrateMode::check);
  CHECK(s->database.batching);
  CHECK(s->database.batch_max == 32);
  CHECK(s->tenant.header == "X-Tenant-Id");
  CHECK(s->tenant.principal_header == "");
  CHECK(s->limits.max_header_bytes == 16u * 1024);
  CHECK(s->limits.max_request_body == 1024u * 1024);
  CHECK(s->limits.header_timeout == Millis(10000));
  CHECK(s->limits.body_timeout == Millis(30000));
  CHECK(s->limits.idle_timeout == Millis(75000));
  CHECK(s->limits.max_connections == 10000);
  REQUIRE(s->admin.listen.has_value());
  CHECK(s->admin.listen->host == "127.0.0.1");
  CHECK(s->admin.listen->port == 9901);
  CHECK(s->admin.token == "");
  CHECK(s->log.level == LogLevel::info);
  CHECK(s->log.format == LogFormat::json);
  CHECK(s->cleanup.interval == Millis(60000));
  CHECK(s->cleanup.batch == 1000);
  CHECK(s->replay_cache.enabled);
  CHECK(s->replay_cache.max_bytes == 32u << 20);
  CHECK(s->replay_cache.ttl == Millis(10000));
  CHECK(s->unmatched == Unmatched::pass);

  REQUIRE(s->routes.size() == 1);
  const auto& r = s->routes[0];
  CHECK(r.name == "create-order");
  CHECK(r.method == "POST");
  CHECK(r.path == "/orders");
  CHECK(r.scope == "POST /orders");
  CHECK(r.key.header == "Idempotency-Key");
  CHECK(r.key.required);
  CHECK(r.key.max_length == 255);
  CHECK(r.fingerprint.version == "1");
  REQUIRE(r.fingerprint.fields.has_value());
  CHECK(*r.fingerprint.fields ==
        std::vector<std::string>{"/customer_id", "/currency", "/amount", "/items", "/shipping/address_id"});
  CHECK(r.fingerprint.ignore == std::vector<std::string>{"/trace_id", "/client_sent_at"});
  CHECK(r.fingerprint.defaults == std::map<std::string, std::string>{{"/currency", "\"EUR\""}});
  CHECK(r.fingerprint.headers.empty());
  CHECK_FALSE(r.fingerprint.query);
  CHECK(r.retention == Millis(24LL * 3600 * 1000));
  CHECK(r.lease == Millis(30000));
  CHECK(r.wait == Millis(5000));
  CHECK(r.retry_after == Millis(1000));
  CHECK(r.mismatch_status == 409);
  REQUIRE(r.store.statuses.size() == 2);
  CHECK(r.store.statuses[0].low == 200);
  CHECK(r.store.statuses[0].high == 299);
  CHECK(r.store.statuses[1].low == 400);
  CHECK(r.store.statuses[1].high == 499);
  CHECK(r.store.except == std::vector<int>{408, 425, 429});
  CHECK(r.replay_headers == std::vector<std::string>{"Content-Type", "Location", "ETag"});
  CHECK(r.max_stored_body == 1024u * 1024);
}

TEST_CASE("an omitted key takes the documented default") {
  const auto s = load(kMinimal + "routes:\n  - {name: r, method: post, path: /orders}\n");
  const Settings defaults;
  CHECK(s->listen.host == "127.0.0.1");
  CHECK(s->listen.port == 8080);
  CHECK(s->workers == 0);
  CHECK(s->upstream.connect_timeout == defaults.upstream.connect_timeout);
  CHECK(s->upstream.response_timeout == Millis(30000));
  CHECK(s->upstream.max_response_body == 8u << 20);
  CHECK(s->database.pool_size == 8);
  CHECK(s->database.migrate == MigrateMode::check);
  CHECK(s->database.start_wait == Millis(30000));
  CHECK(s->tenant.header == "X-Tenant-Id");
  CHECK(s->limits.max_header_bytes == 16u << 10);
  CHECK(s->limits.max_connections == 10000);
  CHECK(s->limits.drain_timeout == Millis(30000));
  REQUIRE(s->admin.listen.has_value());
  CHECK(s->admin.listen->port == 9901);
  CHECK(s->log.format == LogFormat::json);
  CHECK(s->cleanup.batch == 1000);
  CHECK(s->unmatched == Unmatched::pass);

  REQUIRE(s->routes.size() == 1);
  const auto& r = s->routes[0];
  CHECK(r.method == "POST");  // upper-cased
  CHECK(r.scope == "POST /orders");
  CHECK(r.key.header == "Idempotency-Key");
  CHECK(r.key.required);
  CHECK(r.key.max_length == 255);
  CHECK(r.fingerprint.version == "1");
  CHECK_FALSE(r.fingerprint.fields.has_value());  // whole body
  CHECK(r.fingerprint.defaults.empty());
  CHECK(r.retention == Millis(86'400'000));
  CHECK(r.lease == Millis(30'000));
  CHECK(r.mismatch_status == 409);
  CHECK(r.store.stores(201));
  CHECK(r.store.stores(404));
  CHECK_FALSE(r.store.stores(429));
  CHECK_FALSE(r.store.stores(500));
  CHECK(r.replay_headers == std::vector<std::string>{"Content-Type", "Location", "ETag"});
  CHECK(r.max_stored_body == 1u << 20);
}

TEST_CASE("routes may be absent or empty: everything passes through") {
  CHECK(load(kMinimal)->routes.empty());
  CHECK(load(kMinimal + "routes: []\n")->routes.empty());
}

TEST_CASE("workers, templates, IPv6 and disabled admin") {
  const auto s = load(kMinimal +
                      "listen: \"[::1]:0\"\n"
                      "workers: 4\n"
                      "admin:\n  listen: \"\"\n  token: s3cret\n"
                      "unmatched: reject\n"
                      "routes:\n"
                      "  - name: tenant-orders\n"
                      "    method: PUT\n"
                      "    path: /tenants/{tid}/orders/{id}\n"
                      "    mismatch_status: 422\n"
                      "    store: {statuses: [\"2xx\", 409], except: []}\n"
                      "    fingerprint: {headers: [X-Api-Version], query: true, fields: []}\n");
  CHECK(s->listen.host == "::1");
  CHECK(s->listen.port == 0);
  CHECK(s->workers == 4);
  CHECK_FALSE(s->admin.listen.has_value());
  CHECK(s->admin.token == "s3cret");
  CHECK(s->unmatched == Unmatched::reject);
  const auto& r = s->routes.at(0);
  CHECK(r.scope == "PUT /tenants/{tid}/orders/{id}");
  CHECK(r.mismatch_status == 422);
  CHECK(r.store.stores(200));
  CHECK(r.store.stores(409));
  CHECK_FALSE(r.store.stores(404));
  CHECK(r.fingerprint.headers == std::vector<std::string>{"X-Api-Version"});
  CHECK(r.fingerprint.query);
  REQUIRE(r.fingerprint.fields.has_value());
  CHECK(r.fingerprint.fields->empty());
}

TEST_CASE("upstream url: port and base path") {
  auto s = load("upstream: {url: \"http://orders.svc:8081/api/v1/\"}\ndatabase: {url: \"host=db\"}\n");
  CHECK(s->upstream.host == "orders.svc");
  CHECK(s->upstream.port == 8081);
  CHECK(s->upstream.base_path == "/api/v1");
  s = load("upstream: {url: \"HTTP://[::1]/\"}\ndatabase: {url: \"host=db\"}\n");
  CHECK(s->upstream.host == "::1");
  CHECK(s->upstream.port == 80);
  CHECK(s->upstream.base_path == "");
}

TEST_CASE("fingerprint defaults keep their YAML type as JSON") {
  const auto s = load(kMinimal + R"(routes:
  - name: r
    method: POST
    path: /o
    fingerprint:
      defaults:
        /quoted: "100"
        /plain: 100
        /float: -1.5e3
        /word: EUR
        /yes: true
        /nothing: null
        /empty:
        /list: [1, "a", false]
        /object: {b: 1, a: "x\"y"}
        /single: 'it''s'
        /tagged: !!str 7
        /items/*/qty: 1
        "/a~1b": 2
)");
  const auto& d = s->routes.at(0).fingerprint.defaults;
  CHECK(d.at("/quoted") == "\"100\"");
  CHECK(d.at("/plain") == "100");
  CHECK(d.at("/float") == "-1.5e3");
  CHECK(d.at("/word") == "\"EUR\"");
  CHECK(d.at("/yes") == "true");
  CHECK(d.at("/nothing") == "null");
  CHECK(d.at("/empty") == "null");
  CHECK(d.at("/list") == "[1,\"a\",false]");
  CHECK(d.at("/object") == "{\"a\":\"x\\\"y\",\"b\":1}");  // keys sorted
  CHECK(d.at("/single") == "\"it's\"");
  CHECK(d.at("/tagged") == "\"7\"");
  CHECK(d.at("/items/*/qty") == "1");
  CHECK(d.at("/a~1b") == "2");
}

TEST_CASE("${VAR} expansion") {
  const Env env{{"POOL", "16"}, {"HOST", "db.internal"}, {"EMPTY", ""}, {"LEVEL", "debug"}};
  SUBCASE("in strings and before type conversion") {
    const auto s = load(
        "upstream: {url: \"http://${HOST}:3000\"}\n"
        "database:\n"
        "  url: \"postgresql://u@${HOST}/${DB:-orders}\"\n"
        "  pool_size: ${POOL:-8}\n"
        "  connect_timeout: ${CONNECT:-3s}\n"
        "log: {level: \"${LEVEL}\"}\n"
        "admin: {token: \"pa$$word$x\"}\n"
        "tenant: {principal_header: \"${EMPTY}\"}\n"
        "cleanup: {batch: \"${EMPTY:-250}\"}\n",
        env);
    CHECK(s->upstream.host == "db.internal");
    CHECK(s->database.url == "postgresql://u@db.internal/orders");
    CHECK(s->database.pool_size == 16);
    CHECK(s->database.connect_timeout == Millis(3000));
    CHECK(s->log.level == LogLevel::debug);
    CHECK(s->admin.token == "pa$word$x");  // $$ is a '$'; a lone '$' stays
    CHECK(s->tenant.principal_header == "");
    CHECK(s->cleanup.batch == 250);  // ":-" also covers set-but-empty
  }
  SUBCASE("an unset variable without default is an error naming it") {
    const auto f = failure(kMinimal + "admin:\n  token: \"${ADMIN_TOKEN}\"\n", env);
    CHECK(f.line == 6);
    CHECK(f.key == "admin.token");
    CHECK(f.what.find("environment variable ADMIN_TOKEN is not set") != std::string::npos);
  }
  SUBCASE("the contract example needs DATABASE_URL") {
    const auto f = failure(kContractExample, {});
    CHECK(f.line == 8);
    CHECK(f.key == "database.url");
    CHECK(f.what.find("DATABASE_URL") != std::string::npos);
  }
  SUBCASE("malformed references") {
    CHECK(failure(kMinimal + "admin: {token: \"${A\"}\n").what.find("unterminated") != std::string::npos);
    CHECK(failure(kMinimal + "admin: {token: \"${1A}\"}\n").what.find("invalid variable reference") !=
          std::string::npos);
    CHECK(failure(kMinimal + "admin: {token: \"${A-x}\"}\n").what.find("invalid variable reference") !=
          std::string::npos);
  }
  SUBCASE("expand_env directly") {
    const auto e = lookup(env);
    CHECK(detail::expand_env("", e) == "");
    CHECK(detail::expand_env("$", e) == "$");
    CHECK(detail::expand_env("a$$b", e) == "a$b");
    CHECK(detail::expand_env("$$${POOL}", e) == "$16");
    CHECK(detail::expand_env("${NOPE:-}", e) == "");
    CHECK(detail::expand_env("${NOPE:-a b:-c}", e) == "a b:-c");
    CHECK(detail::expand_env("${HOST}${POOL}", e) == "db.internal16");
  }
}

TEST_CASE("LoadOptions{.database = false}: the section must be there, none of it is read") {
  // explain without --database: a ${DATABASE_URL} it names need not be set, and what the
  // section holds keeps its defaults (nothing that does not connect reads it).
  const std::string yaml = "upstream: {url: \"http://h\"}\n"
                           "database: {url: \"${DATABASE_URL}\", pool_size: \"${POOL}\"}\n"
                           "workers: 12\n";
  const auto s = detail::load_text(yaml, "test.yaml", lookup({}), LoadOptions{.database = false});
  CHECK(s->database.url == "");
  CHECK(s->database.pool_size == DatabaseSettings{}.pool_size);
  CHECK(s->workers == 12);
  // By default the same file is refused, naming the variable.
  CHECK(failure(yaml).what.find("DATABASE_URL is not set") != std::string::npos);
  // The file is still a whole configuration.
  try {
    detail::load_text("upstream: {url: \"http://h\"}\n", "test.yaml", lookup({}), LoadOptions{.database = false});
    FAIL("a file without a database section loaded");
  } catch (const ConfigError& e) {
    CHECK(e.key() == "database");
  }
}

TEST_CASE("load_text uses the process environment") {
  ::setenv("IDEM_SETTINGS_TEST_POOL", "33", 1);
  const auto s = load_text("upstream: {url: \"http://h\"}\n"
                           "database: {url: \"host=x\", pool_size: \"${IDEM_SETTINGS_TEST_POOL}\"}\n",
                           "x.yaml");
  ::unsetenv("IDEM_SETTINGS_TEST_POOL");
  CHECK(s->database.pool_size == 33);
  CHECK(s->source_file == "x.yaml");
}

TEST_CASE("load_file names the file, also when it cannot be read") {
  char path[] = "/tmp/idem-settings-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  {
    std::ofstream out(path);
    out << kMinimal << "log:\n  level: loud\n";
  }
  try {
    load_file(path);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.file() == path);
    CHECK(e.line() == 6);
    CHECK(e.key() == "log.level");
    CHECK(std::string(e.what()) == "invalid value 'loud': expected trace | debug | info | warn | error");
    CHECK(e.full_message() ==
          std::string(path) + ":6: log.level: invalid value 'loud': expected trace | debug | info | warn | error");
  }
  {
    std::ofstream out(path);
    out << kMinimal;
  }
  CHECK(load_file(path)->source_file == path);
  std::remove(path);
  try {
    load_file(path);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.line() == 0);
    CHECK(std::string(e.what()).find("cannot read the file") != std::string::npos);
  }
}

TEST_CASE("YAML merge keys share settings between routes") {
  const auto s = load(kMinimal + R"(routes:
  - &base
    name: a
    method: POST
    path: /a
    lease: 10s
    retention: 1h
    store: {statuses: ["2xx"]}
  - <<: *base
    name: b
    path: /b
    lease: 20s
  - <<: [{wait: 3s, lease: 40s}, *base]
    name: c
    path: /c
)");
  REQUIRE(s->routes.size() == 3);
  const auto& b = s->routes[1];
  CHECK(b.name == "b");
  CHECK(b.method == "POST");
  CHECK(b.path == "/b");
  CHECK(b.lease == Millis(20'000));  // explicit key wins
  CHECK(b.retention == Millis(3'600'000));
  CHECK_FALSE(b.store.stores(404));
  const auto& c = s->routes[2];
  CHECK(c.lease == Millis(40'000));  // the earlier merged mapping wins
  CHECK(c.wait == Millis(3'000));
  CHECK(c.retention == Millis(3'600'000));

  // A merged key is still checked, at the line where it is written.
  const auto f = failure(kMinimal + "routes:\n  - &base\n    name: a\n    method: POST\n    path: /a\n"
                                    "  - <<: {leese: 1s}\n    name: b\n    path: /b\n");
  CHECK(f.line == 10);
  CHECK(f.key == "routes[1].leese");
  CHECK(f.what.find("did you mean 'lease'?") != std::string::npos);
  CHECK(failure(kMinimal + "routes:\n  - <<: 5\n    name: b\n").what.find("'<<' merges a mapping") !=
        std::string::npos);
}

// Found by fuzz/config: a self-referencing alias overflowed the stack and nested aliases
// exhausted memory, which would crash a running proxy on reload instead of refusing the file.
TEST_CASE("aliases: a cycle or an exponential expansion is refused, not followed") {
  const std::string route = kMinimal + "routes:\n  - name: r\n    method: POST\n    path: /o\n"
                                       "    fingerprint:\n      defaults:\n";
  const auto cycle = failure(route + "        /a: &a [1, *a]\n");
  CHECK(cycle.what.find("an alias is used inside its own anchor") != std::string::npos);
  CHECK(cycle.line == 11);
  // Deeper inside, and in a mapping's key: still a cycle.
  CHECK(failure(route + "        /a: &a\n          b: [1, {c: *a}]\n").what.find("inside its own anchor") !=
        std::string::npos);
  CHECK(failure(route + "        /a: &a {*a : 1}\n").what.find("inside its own anchor") !=
        std::string::npos);
  // An anchor defined again is another node: an alias after it means the latest one.
  const auto redefined =
      load(route + "        /a: &a [1]\n        /b: &a [2, 3]\n        /c: *a\n");
  CHECK(redefined->routes.at(0).fingerprint.defaults.at("/c") == "[2,3]");

  std::string laughs = route + "        /a: &a0 [1,1,1,1,1,1,1,1,1,1]\n";
  for (int i = 1; i <= 8; ++i) {  // 10^9 nodes once expanded
    laughs += "        /a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) laughs += (k ? ",*a" : "*a") + std::to_string(i - 1);
    laughs += "]\n";
  }
  CHECK(failure(laughs).what.find("expands to more than") != std::string::npos);

  // Within the bound, aliases keep working (the merge-key case above, and plain reuse).
  const auto ok = load(route + "        /a: &v {currency: EUR}\n        /b: *v\n");
  CHECK(ok->routes.at(0).fingerprint.defaults.at("/b") == "{\"currency\":\"EUR\"}");
}

TEST_CASE("limits.drain_timeout: a duration, zero allowed") {
  CHECK(load(kMinimal + "limits:\n  drain_timeout: 45s\n")->limits.drain_timeout == Millis(45000));
  CHECK(load(kMinimal + "limits:\n  drain_timeout: 0s\n")->limits.drain_timeout == Millis(0));
  CHECK_CONFIG_ERROR(kMinimal + "limits:\n  drain_timeout: -1s\n", 6, "limits.drain_timeout",
                     "negative");
  CHECK_CONFIG_ERROR(kMinimal + "limits:\n  drain_timeout: soon\n", 6, "limits.drain_timeout",
                     "invalid duration");
}

TEST_CASE("database.start_wait: a duration, zero allowed (one attempt)") {
  CHECK(load(kMinimal + "  start_wait: 2m\n")->database.start_wait == Millis(120000));
  CHECK(load(kMinimal + "  start_wait: 0s\n")->database.start_wait == Millis(0));
  CHECK_CONFIG_ERROR(kMinimal + "  start_wait: -1s\n", 5, "database.start_wait", "negative");
  CHECK_CONFIG_ERROR(kMinimal + "  start_wait: later\n", 5, "database.start_wait", "invalid duration");
}

TEST_CASE("replay_cache: switch, byte budget and ttl") {
  const auto s = load(kMinimal + "replay_cache:\n  enabled: false\n  max_bytes: 4MiB\n  ttl: 2s\n");
  CHECK_FALSE(s->replay_cache.enabled);
  CHECK(s->replay_cache.max_bytes == 4u << 20);
  CHECK(s->replay_cache.ttl == Millis(2000));
  CHECK(load(kMinimal + "replay_cache: {max_bytes: 0}\n")->replay_cache.max_bytes == 0);
  CHECK_CONFIG_ERROR(kMinimal + "replay_cache:\n  ttl: 0s\n", 6, "replay_cache.ttl", "at least 1ms");
  CHECK_CONFIG_ERROR(kMinimal + "replay_cache:\n  enabled: maybe\n", 6, "replay_cache.enabled", "");
  CHECK_CONFIG_ERROR(kMinimal + "replay_cache:\n  size: 1MiB\n", 6, "replay_cache.size", "");
}

TEST_CASE("key.from: header (default), body with key.pointer, query with key.param") {
  const std::string routes = "routes:\n"
                             "  - {name: h, method: POST, path: /h}\n"
                             "  - name: b\n"
                             "    method: POST\n"
                             "    path: /b\n"
                             "    key: {from: body, pointer: /idempotency_key}\n"
                             "  - name: q\n"
                             "    method: POST\n"
                             "    path: /q\n"
                             "    key: {from: query, param: ClientToken, header: X-Client-Token}\n";
  const auto s = load(kMinimal + routes);
  REQUIRE(s->routes.size() == 3);
  CHECK(s->routes[0].key.from == KeySource::header);
  CHECK(s->routes[0].key.pointer.empty());
  CHECK(s->routes[1].key.from == KeySource::body);
  CHECK(s->routes[1].key.pointer == "/idempotency_key");
  CHECK(s->routes[1].key.header == "Idempotency-Key");
  CHECK(s->routes[2].key.from == KeySource::query);
  CHECK(s->routes[2].key.param == "ClientToken");
  CHECK(s->routes[2].key.header == "X-Client-Token");

  const std::string r = kMinimal + "routes:\n  - name: r\n    method: POST\n    path: /o\n";  // key at line 9
  CHECK_CONFIG_ERROR(r + "    key: {from: form}\n", 9, "routes[0].key.from", "header | body | query");
  CHECK_CONFIG_ERROR(r + "    key: {from: body}\n", 9, "routes[0].key.pointer", "missing required key 'pointer'");
  CHECK_CONFIG_ERROR(r + "    key: {from: query}\n", 9, "routes[0].key.param", "missing required key 'param'");
  CHECK_CONFIG_ERROR(r + "    key: {pointer: /k}\n", 9, "routes[0].key.pointer", "only used with key.from: body");
  CHECK_CONFIG_ERROR(r + "    key: {from: body, pointer: /k, param: k}\n", 9, "routes[0].key.param",
                     "only used with key.from: query");
  CHECK_CONFIG_ERROR(r + "    key: {from: query, param: \"\"}\n", 9, "routes[0].key.param", "must not be empty");
  for (const char* bad : {"\"\"", "/items/*/key", "\"/a~2\"", "\"k[]\"", "\"[k]\"", "\"k[a]b\"", "\"k[a\""}) {
    INFO(bad);
    CHECK_CONFIG_ERROR(r + "    key: {from: body, pointer: " + bad + "}\n", 9, "routes[0].key.pointer", "");
  }
}

TEST_CASE("fingerprint.format: json (default), form with repeated_names, raw with media_types") {
  const std::string routes = "routes:\n"
                             "  - {name: j, method: POST, path: /j}\n"
                             "  - name: f\n"
                             "    method: POST\n"
                             "    path: /f\n"
                             "    key: {from: body, pointer: \"metadata[idempotency_key]\"}\n"
                             "    fingerprint: {format: form, repeated_names: list, defaults: {/currency: \"usd\"}}\n"
                             "  - name: r\n"
                             "    method: POST\n"
                             "    path: /r\n"
                             "    fingerprint: {format: raw, media_types: [Application/X-Protobuf, application/xml]}\n";
  const auto s = load(kMinimal + routes);
  REQUIRE(s->routes.size() == 3);
  CHECK(s->routes[0].fingerprint.format == BodyFormat::json);
  CHECK(s->routes[1].fingerprint.format == BodyFormat::form);
  CHECK(s->routes[1].fingerprint.repeated_names == RepeatedNames::list);
  CHECK(s->routes[1].key.pointer == "metadata[idempotency_key]");
  CHECK(s->routes[2].fingerprint.format == BodyFormat::raw);
  CHECK(s->routes[2].fingerprint.media_types == std::vector<std::string>{"application/x-protobuf", "application/xml"});
  CHECK(s->routes[2].fingerprint.repeated_names == RepeatedNames::reject);

  const std::string r = kMinimal + "routes:\n  - name: r\n    method: POST\n    path: /o\n";  // line 9 next
  CHECK_CONFIG_ERROR(r + "    fingerprint: {format: xml}\n", 9, "routes[0].fingerprint.format", "json | form | raw");
  CHECK_CONFIG_ERROR(r + "    fingerprint: {media_types: [application/xml]}\n", 9,
                     "routes[0].fingerprint.media_types", "needs fingerprint.format: raw");
  CHECK_CONFIG_ERROR(r + "    fingerprint: {format: raw, media_types: [\"application/xml; charset=utf-8\"]}\n", 9,
                     "routes[0].fingerprint.media_types[0]", "without parameters");
  CHECK_CONFIG_ERROR(r + "    fingerprint: {format: raw, media_types: [xml]}\n", 9,
                     "routes[0].fingerprint.media_types[0]", "type/subtype");
  CHECK_CONFIG_ERROR(r + "    fingerprint: {format: raw, media_types: [a/b, A/B]}\n", 9,
                     "routes[0].fingerprint.media_types[1]", "listed twice");
  CHECK_CONFIG_ERROR(r + "    fingerprint: {repeated_names: list}\n", 9, "routes[0].fingerprint.repeated_names",
                     "needs fingerprint.format: form");
  CHECK_CONFIG_ERROR(r + "    fingerprint: {format: form, repeated_names: last}\n", 9,
                     "routes[0].fingerprint.repeated_names", "reject | list");
  for (const auto& [key, yaml] : std::vector<std::pair<std::string, std::string>>{
           {"fields", "fields: [/a]"}, {"ignore", "ignore: [/a]"}, {"defaults", "defaults: {/a: \"1\"}"}}) {
    INFO(key);
    CHECK_CONFIG_ERROR(r + "    fingerprint: {format: raw, " + yaml + "}\n", 9, "routes[0].fingerprint." + key,
                       "fingerprint.format: raw hashes the exact bytes");
  }
  CHECK(load(r + "    fingerprint: {format: raw, ignore: [], defaults: {}}\n")->routes[0].fingerprint.ignore.empty());
  CHECK_CONFIG_ERROR(r + "    fingerprint: {format: raw, fields: []}\n", 9, "routes[0].fingerprint.fields", "raw");
  CHECK_CONFIG_ERROR(r + "    key: {from: body, pointer: /k}\n    fingerprint: {format: raw}\n", 9,
                     "routes[0].key.from", "raw has none");
  CHECK_CONFIG_ERROR(r + "    key: {from: body, pointer: \"meta[k]\"}\n", 9, "routes[0].key.pointer",
                     "a JSON body names its key member by JSON Pointer");
}

TEST_CASE("same_payload_new_key: absent (off), or a window and an action") {
  const std::string r = kMinimal + "routes:\n  - name: r\n    method: POST\n    path: /o\n";  // line 9 next
  CHECK_FALSE(load(r)->routes[0].same_payload_new_key.has_value());
  const auto on = load(r + "    same_payload_new_key: {window: 2m, action: warn}\n");
  REQUIRE(on->routes[0].same_payload_new_key.has_value());
  CHECK(on->routes[0].same_payload_new_key->window == Millis{120000});
  CHECK(on->routes[0].same_payload_new_key->action == SamePayloadAction::warn);
  CHECK_CONFIG_ERROR(r + "    same_payload_new_key: {action: block}\n", 9,
                     "routes[0].same_payload_new_key.action", "count | warn | reject");
  CHECK_CONFIG_ERROR(r + "    same_payload_new_key: {window: 500ms}\n", 9,
                     "routes[0].same_payload_new_key.window", "at least 1s");
  CHECK_CONFIG_ERROR(r + "    same_payload_new_key: {window: 2d}\n", 9,
                     "routes[0].same_payload_new_key.window", "at most 1d");
  CHECK_CONFIG_ERROR(r + "    same_payload_new_key: {windw: 1m}\n", 9,
                     "routes[0].same_payload_new_key.windw", "did you mean 'window'");
}
