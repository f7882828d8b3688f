// Every refusal names the line and the key path, and says what is wrong.
#include <doctest/doctest.h>

#include "settings/support.hpp"

using namespace idem::settings;
using namespace idem::settings::test;

namespace {

// A route prefix at lines 5..9 for route-level cases (kMinimal holds lines 1..4).
const std::string kRoute = kMinimal +
                           "routes:\n"            // 5
                           "  - name: r\n"        // 6
                           "    method: POST\n"   // 7
                           "    path: /orders\n";  // 8

}  // namespace

TEST_CASE("unknown keys are errors, at their line, with a suggestion") {
  CHECK_CONFIG_ERROR(kMinimal + "listen: \"127.0.0.1:1\"\nlistner: x\n", 6, "listner",
                     "unknown key 'listner' (did you mean 'listen'?)");
  CHECK_CONFIG_ERROR("upstream:\n  url: http://h\n  conect_timeout: 2s\ndatabase: {url: host=x}\n", 3,
                     "upstream.conect_timeout", "did you mean 'connect_timeout'?");
  CHECK_CONFIG_ERROR(kMinimal + "log:\n  colour: always\n", 6, "log.colour",
                     "unknown key 'colour' (allowed here: level, format)");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      fields: [/a]\n      hash: sha1\n", 11,
                     "routes[0].fingerprint.hash", "unknown key 'hash'");
  CHECK_CONFIG_ERROR(kRoute + "    store:\n      except: [500]\n      statuses_: []\n", 11,
                     "routes[0].store.statuses_", "unknown key");
}

TEST_CASE("duplicate keys are errors") {
  CHECK_CONFIG_ERROR(kMinimal + "workers: 1\nworkers: 2\n", 6, "workers", "duplicate key 'workers'");
}

TEST_CASE("required keys") {
  CHECK_CONFIG_ERROR("database: {url: host=x}\n", 1, "upstream", "missing required key 'upstream'");
  CHECK_CONFIG_ERROR("upstream:\n  connect_timeout: 1s\ndatabase: {url: host=x}\n", 1, "upstream.url",
                     "missing required key 'url'");
  CHECK_CONFIG_ERROR("upstream: {url: \"http://h\"}\n", 1, "database", "missing required key");
  CHECK_CONFIG_ERROR("", 0, "upstream", "missing required key");
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - name: r\n    path: /x\n", 6, "routes[0].method",
                     "missing required key 'method'");
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - method: GET\n    path: /x\n", 6, "routes[0].name",
                     "missing required key 'name'");
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - name: a\n    method: GET\n", 6, "routes[0].path",
                     "missing required key 'path'");
}

TEST_CASE("YAML syntax errors carry their line") {
  const auto f = failure(kMinimal + "routes: [\n  {name: a\n");
  CHECK(f.line >= 5);
  CHECK(f.key.empty());
  CHECK(f.what.find("YAML syntax error") != std::string::npos);
  CHECK(f.what.rfind("test.yaml:", 0) == 0);
  CHECK_CONFIG_ERROR("upstream:\n  url: http://h\n bad: indent\n", 3, "", "YAML syntax error");
  CHECK_CONFIG_ERROR(kMinimal + "---\nlisten: \"a:1\"\n", 6, "", "one YAML document");
  CHECK_CONFIG_ERROR("- a\n- b\n", 1, "", "expected a mapping");
  CHECK_CONFIG_ERROR(kMinimal + "---\n---\nlisten: \"a:1\"\n", 6, "", "one YAML document");
}

// Found by fuzz/config: yaml-cpp yields endless empty documents for a stream that starts
// with ',', and the loader used to collect them until memory ran out.
TEST_CASE("a stream yaml-cpp cannot get past is a syntax error, not an endless loop") {
  for (const char* text : {",", ",a", ", {upstream: x}", "\n\n  ,\n"}) {
    CAPTURE(text);
    const auto f = failure(text);
    CHECK(f.what.find("YAML syntax error") != std::string::npos);
  }
}

TEST_CASE("wrong value types") {
  CHECK_CONFIG_ERROR(kMinimal + "limits: 5\n", 5, "limits", "expected a mapping, got '5'");
  CHECK_CONFIG_ERROR(kMinimal + "admin:\n  token:\n", 6, "admin.token", "write \"\" for an empty string");
  CHECK_CONFIG_ERROR(kMinimal + "listen: [a]\n", 5, "listen", "expected a value, got a list");
  CHECK_CONFIG_ERROR(kRoute + "    replay_headers: ETag\n", 9, "routes[0].replay_headers", "expected a list");
  CHECK_CONFIG_ERROR(kRoute + "    key: {required: yes}\n", 9, "routes[0].key.required",
                     "expected true or false, got 'yes'");
  CHECK_CONFIG_ERROR("upstream: {url: [x]}\ndatabase: {url: host=x}\n", 1, "upstream.url", "expected a value");
}

TEST_CASE("durations") {
  CHECK_CONFIG_ERROR(kMinimal + "cleanup:\n  interval: 60\n", 6, "cleanup.interval", "has no unit");
  CHECK_CONFIG_ERROR(kMinimal + "cleanup:\n  interval: -5s\n", 6, "cleanup.interval", "cannot be negative");
  CHECK_CONFIG_ERROR(kMinimal + "cleanup:\n  interval: 5 s\n", 6, "cleanup.interval", "invalid duration unit");
  CHECK_CONFIG_ERROR(kMinimal + "cleanup:\n  interval: 1.5s\n", 6, "cleanup.interval", "invalid duration unit");
  CHECK_CONFIG_ERROR(kMinimal + "cleanup:\n  interval: 5sec\n", 6, "cleanup.interval", "invalid duration unit 'sec'");
  CHECK_CONFIG_ERROR(kMinimal + "cleanup:\n  interval: 0s\n", 6, "cleanup.interval", "must be at least 1ms");
  CHECK_CONFIG_ERROR(kMinimal + "cleanup:\n  interval: 99999999999999999999d\n", 6, "cleanup.interval",
                     "too large");
  CHECK_CONFIG_ERROR(kMinimal + "cleanup:\n  interval: 999999999999999d\n", 6, "cleanup.interval", "too large");
  CHECK_CONFIG_ERROR(kRoute + "    lease: 500ms\n", 9, "routes[0].lease", "must be at least 1s");
  CHECK_CONFIG_ERROR(kRoute + "    retry_after: 0s\n", 9, "routes[0].retry_after", "at least 1s");
  CHECK_CONFIG_ERROR(kRoute + "    wait: 0ms\n", 9, "routes[0].wait", "at least 1ms");
  CHECK_CONFIG_ERROR(kRoute + "    lease: 2m\n    retention: 90s\n", 10, "routes[0].retention",
                     "must be at least the lease (2m)");
  CHECK_CONFIG_ERROR(kRoute + "    lease: 2d\n", 6, "routes[0].retention", "at least the lease");
}

TEST_CASE("sizes") {
  CHECK_CONFIG_ERROR(kMinimal + "limits:\n  max_request_body: 1MB\n", 6, "limits.max_request_body",
                     "ambiguous: use KiB, MiB or GiB");
  CHECK_CONFIG_ERROR(kMinimal + "limits:\n  max_request_body: 1kb\n", 6, "limits.max_request_body",
                     "invalid size unit 'kb'");
  CHECK_CONFIG_ERROR(kMinimal + "limits:\n  max_request_body: -1\n", 6, "limits.max_request_body",
                     "cannot be negative");
  CHECK_CONFIG_ERROR(kMinimal + "limits:\n  max_request_body: 0\n", 6, "limits.max_request_body",
                     "must be between 1 and 1GiB");
  CHECK_CONFIG_ERROR(kMinimal + "limits:\n  max_header_bytes: 512\n", 6, "limits.max_header_bytes",
                     "must be between 1KiB and 1MiB, got 512");
  CHECK_CONFIG_ERROR(kMinimal + "limits:\n  max_request_body: 99999999999GiB\n", 6, "limits.max_request_body",
                     "too large");
  CHECK_CONFIG_ERROR(kRoute + "    max_stored_body: 1GiB\n", 9, "routes[0].max_stored_body", "between 0 and 512MiB");
}

TEST_CASE("integers and enums") {
  CHECK_CONFIG_ERROR(kMinimal.substr(0, kMinimal.size()) + "workers: four\n", 5, "workers",
                     "expected an integer, got 'four'");
  CHECK_CONFIG_ERROR("upstream: {url: \"http://h\"}\ndatabase:\n  url: host=x\n  pool_size: 0\n", 4,
                     "database.pool_size", "must be between 1 and 1000, got 0");
  CHECK_CONFIG_ERROR("upstream: {url: \"http://h\"}\ndatabase:\n  url: host=x\n  pool_size: 1001\n", 4,
                     "database.pool_size", "between 1 and 1000");
  CHECK_CONFIG_ERROR("upstream: {url: \"http://h\"}\ndatabase:\n  url: host=x\n  pool_size: +8\n", 4,
                     "database.pool_size", "expected an integer");
  CHECK_CONFIG_ERROR("upstream: {url: \"http://h\"}\ndatabase:\n  url: host=x\n  migrate: yes\n", 4,
                     "database.migrate", "invalid value 'yes': expected check | auto | off");
  CHECK_CONFIG_ERROR("upstream: {url: \"http://h\"}\ndatabase:\n  url: host=x\n  batch_max: 1\n", 4,
                     "database.batch_max", "must be between 2 and 1000, got 1");
  CHECK_CONFIG_ERROR(kMinimal + "log:\n  format: xml\n", 6, "log.format", "expected json | text");
  CHECK_CONFIG_ERROR(kMinimal + "unmatched: drop\n", 5, "unmatched", "expected pass | reject");
  CHECK_CONFIG_ERROR(kMinimal + "cleanup: {batch: 0}\n", 5, "cleanup.batch", "between 1 and 100000");
  CHECK_CONFIG_ERROR(kRoute + "    key: {max_length: 2048}\n", 9, "routes[0].key.max_length", "between 1 and 1024");
  CHECK_CONFIG_ERROR(kRoute + "    mismatch_status: 400\n", 9, "routes[0].mismatch_status", "must be 409 or 422");
}

TEST_CASE("addresses and urls") {
  CHECK_CONFIG_ERROR(kMinimal + "listen: \"127.0.0.1\"\n", 5, "listen", "missing port");
  CHECK_CONFIG_ERROR(kMinimal + "listen: \"::1:8080\"\n", 5, "listen", "must be written in brackets");
  CHECK_CONFIG_ERROR(kMinimal + "listen: \"[::g]:8080\"\n", 5, "listen", "not a valid IPv6 address");
  CHECK_CONFIG_ERROR(kMinimal + "listen: \"127.0.0.300:8080\"\n", 5, "listen", "not a valid IPv4 address");
  CHECK_CONFIG_ERROR(kMinimal + "listen: \"127.0.0.1:70000\"\n", 5, "listen", "invalid port '70000'");
  CHECK_CONFIG_ERROR(kMinimal + "admin: {listen: \"bad host:1\"}\n", 5, "admin.listen", "not a valid host name");
  CHECK_CONFIG_ERROR("upstream:\n  url: ftp://h\ndatabase: {url: host=x}\n", 2, "upstream.url",
                     "expected http[s]://host[:port][/path]");
  CHECK_CONFIG_ERROR("upstream:\n  url: h:80\ndatabase: {url: host=x}\n", 2, "upstream.url",
                     "expected http[s]://host[:port][/path]");
  CHECK_CONFIG_ERROR("upstream:\n  url: http://h/x?y=1\ndatabase: {url: host=x}\n", 2, "upstream.url",
                     "query or fragment");
  CHECK_CONFIG_ERROR("upstream:\n  url: http://u:p@h/\ndatabase: {url: host=x}\n", 2, "upstream.url",
                     "user information");
  CHECK_CONFIG_ERROR("upstream:\n  url: http://h:0\ndatabase: {url: host=x}\n", 2, "upstream.url",
                     "invalid port '0'");
  CHECK_CONFIG_ERROR("upstream:\n  url: http://\ndatabase: {url: host=x}\n", 2, "upstream.url", "no host");
  CHECK_CONFIG_ERROR("upstream: {url: http://h}\ndatabase:\n  url: orders\n", 3, "database.url",
                     "libpq URI (postgresql://...) or conninfo");
  CHECK_CONFIG_ERROR("upstream: {url: http://h}\ndatabase:\n  url: \"\"\n", 3, "database.url", "must not be empty");
}

TEST_CASE("routes") {
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - name: \"create order\"\n    method: POST\n    path: /o\n", 6,
                     "routes[0].name", "route names are 1..64 letters");
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - name: a\n    method: \"PO ST\"\n    path: /o\n", 7,
                     "routes[0].method", "not a valid HTTP method");
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - name: a\n    method: POST\n    path: orders\n", 8,
                     "routes[0].path", "must start with '/'");
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - name: a\n    method: POST\n    path: /o/x{id}\n", 8,
                     "routes[0].path", "whole segments");
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - name: a\n    method: POST\n    path: /o/{id}/{id}\n", 8,
                     "routes[0].path", "appears twice");
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - name: a\n    method: POST\n    path: /o?x=1\n", 8,
                     "routes[0].path", "cannot contain '?'");
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - name: a\n    method: POST\n    path: /o//p\n", 8,
                     "routes[0].path", "empty segment");
  CHECK_CONFIG_ERROR(kMinimal + "routes:\n  - name: a\n    method: POST\n    path: /o/{1d}\n", 8,
                     "routes[0].path", "invalid template parameter name");

  const std::string two = kMinimal +
                          "routes:\n"                                    // 5
                          "  - {name: a, method: POST, path: \"/t/{tid}\"}\n"  // 6
                          "  - name: a\n"                                 // 7
                          "    method: PUT\n"                             // 8
                          "    path: /t/{tid}\n";                         // 9
  CHECK_CONFIG_ERROR(two, 7, "routes[1].name", "duplicate route name 'a' (also routes[0])");
  const std::string same_shape = kMinimal +
                                 "routes:\n"
                                 "  - {name: a, method: POST, path: \"/t/{tid}\"}\n"
                                 "  - name: b\n"
                                 "    method: post\n"
                                 "    path: /t/{other}\n";  // 9
  CHECK_CONFIG_ERROR(same_shape, 9, "routes[1].path", "matches the same requests as routes[0]");
  // Same path with another method is a different route.
  CHECK(load(kMinimal + "routes:\n  - {name: a, method: POST, path: /t}\n  - {name: b, method: PUT, path: /t}\n")
            ->routes.size() == 2);

  CHECK_CONFIG_ERROR(kRoute + "    scope: \"\"\n", 9, "routes[0].scope", "must not be empty");
  CHECK_CONFIG_ERROR(kRoute + "    key:\n      header: \"Idem Key\"\n", 10, "routes[0].key.header",
                     "not a valid header name");
  CHECK_CONFIG_ERROR(kRoute + "    key:\n      header: x-tenant-id\n", 10, "routes[0].key.header",
                     "also the tenant or principal header");
}

TEST_CASE("fingerprint settings") {
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      fields: [/a, b]\n", 10, "routes[0].fingerprint.fields[1]",
                     "'b' is not a JSON Pointer");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      fields:\n        - /a\n        - /b\n        - /c~2\n", 13,
                     "routes[0].fingerprint.fields[2]", "~0");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      ignore: [/a~]\n", 10, "routes[0].fingerprint.ignore[0]",
                     "not a JSON Pointer");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      defaults:\n        currency: EUR\n", 11,
                     "routes[0].fingerprint.defaults.currency", "not a JSON Pointer");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      defaults:\n        /rate: .5\n", 11,
                     "routes[0].fingerprint.defaults[\"/rate\"]", "YAML number but not a JSON number");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      defaults:\n        /n: 0x1F\n", 11,
                     "routes[0].fingerprint.defaults[\"/n\"]", "not a JSON number");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      defaults:\n        /n: !!int 5\n", 11,
                     "routes[0].fingerprint.defaults[\"/n\"]", "unsupported YAML tag");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      defaults: [/a]\n", 10, "routes[0].fingerprint.defaults",
                     "expected a mapping of JSON Pointer to value");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      headers: [X-A, x-a]\n", 10,
                     "routes[0].fingerprint.headers[1]", "listed twice");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      version: \"\"\n", 10, "routes[0].fingerprint.version",
                     "must not be empty");
  CHECK_CONFIG_ERROR(kRoute + "    fingerprint:\n      query: 1\n", 10, "routes[0].fingerprint.query",
                     "expected true or false");
}

TEST_CASE("store and replay settings") {
  CHECK_CONFIG_ERROR(kRoute + "    store:\n      statuses: [\"2xx\", \"6xx\"]\n", 10,
                     "routes[0].store.statuses[1]", "expected a status class 2xx..5xx or a status code");
  CHECK_CONFIG_ERROR(kRoute + "    store:\n      statuses: [99]\n", 10, "routes[0].store.statuses[0]",
                     "status code 100..599");
  CHECK_CONFIG_ERROR(kRoute + "    store:\n      except: [\"4xx\"]\n", 10, "routes[0].store.except[0]",
                     "expected an integer");
  CHECK_CONFIG_ERROR(kRoute + "    store:\n      except: [600]\n", 10, "routes[0].store.except[0]",
                     "between 100 and 599");
  CHECK_CONFIG_ERROR(kRoute + "    replay_headers: [ETag, Content-Length]\n", 9, "routes[0].replay_headers[1]",
                     "frames one response or is one of idemproxy's own fields");
  CHECK_CONFIG_ERROR(kRoute + "    replay_headers: [X-Idempotency-Directive]\n", 9,
                     "routes[0].replay_headers[0]", "cannot be replayed");
  CHECK_CONFIG_ERROR(kRoute + "    completion: both\n", 9, "routes[0].completion", "sidecar");
  CHECK_CONFIG_ERROR(kRoute + "    replay_headers: [ETag, etag]\n", 9, "routes[0].replay_headers[1]",
                     "listed twice");
  CHECK_CONFIG_ERROR(kRoute + "    replay_headers: [\"Bad:Name\"]\n", 9, "routes[0].replay_headers[0]",
                     "not a valid header name");
}

TEST_CASE("long-operation settings") {
  CHECK_CONFIG_ERROR(kRoute + "    async: {after: 1s, status_path: /operations/x}\n", 9,
                     "routes[0].async.status_path", "{operation_id}");
  CHECK_CONFIG_ERROR(kRoute + "    async: {status_path: \"/op/{operation_id}\"}\n", 9,
                     "routes[0].async.after", "missing required key 'after'");
  CHECK_CONFIG_ERROR(kRoute + "    async: {after: 1m, status_path: \"/op/{operation_id}\"}\n", 9,
                     "routes[0].async.after", "response_timeout");
  CHECK_CONFIG_ERROR(kRoute + "    replay: {mode: fresh}\n", 9, "routes[0].replay.mode", "refetch");
  CHECK_CONFIG_ERROR(kRoute + "    replay: {hosts: [a.example]}\n", 9, "routes[0].replay.hosts",
                     "needs replay.mode: refetch");
  CHECK_CONFIG_ERROR(kRoute + "    replay: {mode: refetch, hosts: [\"http://a.example\"]}\n", 9,
                     "routes[0].replay.hosts[0]", "not a host or host:port");
  CHECK_CONFIG_ERROR(kRoute + "    replay: {mode: refetch, hosts: [\"a.example/x\"]}\n", 9,
                     "routes[0].replay.hosts[0]", "not a host or host:port");
  CHECK_CONFIG_ERROR(kRoute + "    replay: {mode: refetch, hosts: [\"a.example:0\"]}\n", 9,
                     "routes[0].replay.hosts[0]", "invalid port");
  CHECK_CONFIG_ERROR(kRoute + "    replay: {mode: refetch, hosts: [a.example, A.EXAMPLE]}\n", 9,
                     "routes[0].replay.hosts[1]", "listed twice");
  CHECK_CONFIG_ERROR(kRoute + "    replay: {mode: refetch, hosts: [\"\"]}\n", 9,
                     "routes[0].replay.hosts[0]", "empty host");
  CHECK_CONFIG_ERROR(kRoute + "    on_unknown_outcome: reconcile\n", 9,
                     "routes[0].on_unknown_outcome", "needs reconcile");
  CHECK_CONFIG_ERROR(kRoute + "    reconcile: {path: \"/o/{operation_id}\"}\n", 9,
                     "routes[0].reconcile", "only used with on_unknown_outcome: reconcile");
  CHECK_CONFIG_ERROR(kMinimal + "policy_path: \"/p/{x}\"\n", 5, "policy_path", "template");
}

TEST_CASE("the message has the file:line: key: shape") {
  const auto f = failure(kMinimal + "log:\n  level: loud\n");
  CHECK(f.what == "test.yaml:6: log.level: invalid value 'loud': expected trace | debug | info | warn | error");
  const ConfigError no_line("f.yaml", 0, "", "cannot read");
  CHECK(std::string(no_line.what()) == "cannot read");
  CHECK(no_line.full_message() == "f.yaml: cannot read");
  const ConfigError no_key("f.yaml", 3, "", "YAML syntax error: x");
  CHECK(no_key.full_message() == "f.yaml:3: YAML syntax error: x");
}

TEST_CASE("a secret-bearing section written as one value is refused without echoing it") {
  const auto db = failure("upstream: {url: \"http://h\"}\ndatabase: \"postgresql://u:s3cr3t@h/db\"\n");
  CHECK(db.key == "database");
  CHECK(db.line == 2);
  CHECK(db.what.find("expected a mapping") != std::string::npos);
  CHECK(db.what.find("s3cr3t") == std::string::npos);
  const auto admin = failure(kMinimal + "admin: t0ps3cr3t\n");
  CHECK(admin.key == "admin");
  CHECK(admin.what.find("t0ps3cr3t") == std::string::npos);
}

// Fuzzing finding 7 (docs/fuzzing.md): database.url was only asked for an '=' somewhere, so
// a conninfo libpq refuses passed check-config and a reload, and rendered (masked) to text
// that did not load. It is now read as libpq reads it, without connecting, and the refusal
// quotes nothing of it: any word may be the password, or part of it.
TEST_CASE("database.url is checked as libpq reads it, and the refusal never echoes it") {
  const auto refused = [](const std::string& url, const std::string& reason) {
    const auto f = failure("upstream: {url: http://h}\ndatabase:\n  url: " + url + "\n");
    INFO("url: " << url << "\nerror: " << f.what);
    CHECK(f.line == 3);
    CHECK(f.key == "database.url");
    CHECK(f.what.find("expected a libpq URI (postgresql://...) or conninfo") != std::string::npos);
    CHECK(f.what.find(reason) != std::string::npos);
    CHECK(f.what.find("s3cr3t") == std::string::npos);
    CHECK(f.what.find("idem") == std::string::npos);
  };
  // The fuzzer's input: an '=' further on, but the first word is not a pair.
  refused("\"hoNULdb user=idem password=s3cr3t dbname=orders\"", "the 1st word is not a key = value pair");
  refused("\"host=db user=idem password=s3cr3t orders\"", "the 4th word is not a key = value pair");
  refused("\"host=db password=s3 cr3t\"", "the 3rd word is not a key = value pair");
  refused("\"host=db user=idem password='s3cr3t\"", "the value of the 3rd pair has no closing quote");
  refused("\"host=db user=idem pasword=s3cr3t\"", "the 3rd pair names a parameter libpq does not know");
  refused("\"host=db =s3cr3t user=idem\"", "the 2nd pair has no parameter name before '='");
  refused("\"postgresql://idem:s3%zzcr3t@db/orders\"", "libpq refused the URI");
  refused("\"postgresql://idem:s3cr3t@db/orders?sslmod=require\"", "libpq refused the URI");
  refused("\"host=db\\0 password=s3cr3t\"", "it contains a NUL byte");

  // What libpq accepts loads, and check-config's (masked) rendering of it loads again.
  for (const std::string url :
       {"host=db user=idem password=s3cr3t dbname=orders", "host = db  dbname= orders\tuser =idem",
        "host=db password='s3 cr3t' dbname='a \\' b'", "host=db password='s3cr3t'dbname=orders",
        "host=db password=s3\\ cr3t", "host=", "postgresql://idem:s3cr3t@db:5432/orders?sslmode=require",
        "postgres://db/orders", "postgresql://%2Fvar%2Frun%2Fpostgresql/orders"}) {
    INFO("url: " << url);
    Env env{{"DB", url}};
    const auto loaded = load("upstream: {url: http://h}\ndatabase: {url: \"${DB}\"}\n", env);
    REQUIRE(loaded);
    CHECK(loaded->database.url == url);
    const auto text = render_effective(*loaded);
    CHECK(text.find("s3cr3t") == std::string::npos);
    CHECK(text.find("s3 cr3t") == std::string::npos);
    CHECK_NOTHROW(load(text));
  }
}
