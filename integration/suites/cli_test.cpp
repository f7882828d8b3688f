// The command line of contract §2: exit codes, messages that name file, line and key,
// migrations, masked secrets.
#include "common.hpp"

using namespace idem::it;
using namespace idem::it::suite;

namespace {

std::string minimal_config(const std::string& extra = "") {
  return "listen: \"127.0.0.1:0\"\n"
         "upstream:\n  url: \"http://127.0.0.1:9\"\n"
         "database:\n  url: \"postgresql://app:s3cret-pass@127.0.0.1:1/db\"\n" + extra;
}

std::filesystem::path write(TempDir& dir, const std::string& name, const std::string& text) {
  return dir.write_file(name, text);
}

}  // namespace

TEST_CASE("--version and --help succeed; unknown arguments are usage errors") {
  auto v = run_idemproxy({"--version"});
  CHECK(v.status.code() == 0);
  CHECK(v.output.find("idemproxy ") != std::string::npos);
  CHECK(run_idemproxy({"--help"}).status.code() == 0);
  CHECK(run_idemproxy({"serve"}).status.code() == 2);
  CHECK(run_idemproxy({"frobnicate", "--config", "x"}).status.code() == 2);
}

TEST_CASE("check-config prints the effective config with secrets masked") {
  TempDir dir("cli");
  auto path = write(dir, "ok.yaml", minimal_config("admin:\n  token: \"tok-123\"\n"));
  auto r = run_idemproxy({"check-config", "--config", path.string()});
  CHECK(r.status.code() == 0);
  CHECK(r.output.find("s3cret-pass") == std::string::npos);
  CHECK(r.output.find("tok-123") == std::string::npos);
  CHECK(r.output.find("****") != std::string::npos);
  CHECK(r.output.find("max_request_body: 1MiB") != std::string::npos);
}

TEST_CASE("invalid configuration exits 2 naming the file, line and key") {
  TempDir dir("cli");
  auto unknown = write(dir, "unknown.yaml", minimal_config("limits:\n  max_body: 5\n"));
  auto r = run_idemproxy({"check-config", "--config", unknown.string()});
  CHECK(r.status.code() == 2);
  CHECK(r.output.find("unknown.yaml:7") != std::string::npos);
  CHECK(r.output.find("limits.max_body") != std::string::npos);

  auto bad = write(dir, "bad.yaml", minimal_config(
      "routes:\n  - name: r\n    method: POST\n    path: /orders\n    lease: 5 seconds\n"));
  auto b = run_idemproxy({"serve", "--config", bad.string()});
  CHECK(b.status.code() == 2);
  CHECK(b.output.find("bad.yaml:10") != std::string::npos);
  CHECK(b.output.find("routes[0].lease") != std::string::npos);

  auto missing = run_idemproxy({"check-config", "--config", (dir.path() / "absent.yaml").string()});
  CHECK(missing.status.code() == 2);
}

TEST_CASE("migrate applies the embedded migrations once and records their checksums") {
  ScratchDatabase fresh;
  const auto db_url = fresh.url();

  TempDir dir("cli");
  auto cfg = write(dir, "m.yaml",
                   "listen: \"127.0.0.1:0\"\nupstream:\n  url: \"http://127.0.0.1:9\"\n"
                   "database:\n  url: \"" + db_url + "\"\n  migrate: check\n");
  auto first = run_idemproxy({"migrate", "--config", cfg.string()});
  CHECK(first.status.code() == 0);
  CHECK(first.output.find("applied migration 1") != std::string::npos);
  auto second = run_idemproxy({"migrate", "--config", cfg.string()});
  CHECK(second.status.code() == 0);
  CHECK(second.output.find("current") != std::string::npos);

  Db db(db_url);
  CHECK(db.scalar_int("SELECT count(*) FROM idemproxy_schema_migrations WHERE version = 1") == 1);
  CHECK(db.scalar("SELECT checksum FROM idemproxy_schema_migrations WHERE version = 1")->size() == 64);
  CHECK(db.scalar_int("SELECT count(*) FROM idempotency_requests") == 0);
}

TEST_CASE("serve refuses a schema that is behind unless migrate: auto") {
  ScratchDatabase fresh;
  const auto db_url = fresh.url();

  TempDir dir("cli");
  auto cfg = write(dir, "s.yaml",
                   "listen: \"127.0.0.1:0\"\nupstream:\n  url: \"http://127.0.0.1:9\"\n"
                   "database:\n  url: \"" + db_url + "\"\n  migrate: check\n");
  auto r = run_idemproxy({"serve", "--config", cfg.string()});
  CHECK(r.status.code() == 1);
  CHECK(r.output.find("idemproxy migrate") != std::string::npos);
}

TEST_CASE("verify-backend fails against a backend that ignores the operation id, and cleans up") {
  TestBackend backend;  // answers every call with a new order: no deduplication, no fencing
  Db db(database_url());
  TempDir dir("cli");
  for (const char* mode : {"sidecar", "backend"}) {
    CAPTURE(mode);
    auto path = write(dir, std::string("verify-") + mode + ".yaml",
                      "listen: \"127.0.0.1:0\"\n"
                      "upstream:\n  url: \"" + backend.url() + "\"\n"
                      "database:\n  url: \"" + database_url() + "\"\n  migrate: auto\n"
                      "routes:\n  - name: create-order\n    method: POST\n    path: /orders\n"
                      "    completion: " + mode + "\n");
    REQUIRE(run_idemproxy({"migrate", "--config", path.string()}).status.code() == 0);
    const auto tenant = unique("verify");
    auto r = run_idemproxy({"verify-backend", "--config", path.string(), "--route",
                            "create-order", "--tenant", tenant});
    INFO(r.output);
    CHECK(r.status.code() == 1);
    CHECK(r.output.find("[FAIL] operation-id deduplication") != std::string::npos);
    if (std::string(mode) == "backend") {
      CHECK(r.output.find("[FAIL] stale attempt fenced") != std::string::npos);
      CHECK(r.output.find("[FAIL] completion in the backend's transaction") != std::string::npos);
    } else {
      CHECK(r.output.find("[skip] stale attempt fenced") != std::string::npos);
    }
    // It forwarded as the sidecar would, under the tenant given, and left no record behind.
    const auto calls = calls_for(backend, tenant);
    REQUIRE(calls.size() >= 2);
    CHECK(calls[0].header("X-Idempotency-Operation-Id") == calls[1].header("X-Idempotency-Operation-Id"));
    CHECK(calls[0].header("X-Idempotency-Attempt") == "1");
    CHECK(calls[1].header("X-Idempotency-Attempt") == "2");
    CHECK(count_rows(db, tenant) == 0);
  }
  CHECK(run_idemproxy({"verify-backend", "--config", (dir.path() / "verify-backend.yaml").string(),
                       "--route", "no-such-route"})
            .status.code() == 2);
  CHECK(run_idemproxy({"verify-backend", "--config", "x"}).status.code() == 2);  // no --route
}

TEST_CASE("migrate --plan names each pending step's lock and changes nothing") {
  ScratchDatabase fresh;
  TempDir dir;
  const auto cfg = dir.write_file("idemproxy.yaml",
                                  "listen: \"127.0.0.1:1\"\nupstream:\n  url: \"http://127.0.0.1:1\"\n"
                                  "database:\n  url: \"" + fresh.url() + "\"\n  migrate: check\n");
  auto plan = run_idemproxy({"migrate", "--config", cfg.string(), "--plan"});
  INFO(plan.output);
  CHECK(plan.status.code() == 0);
  CHECK(plan.output.find("0003_fencing_tokens: 5 steps") != std::string::npos);
  CHECK(plan.output.find("backfill of idempotency_requests") != std::string::npos);
  CHECK(plan.output.find("online SHARE UPDATE EXCLUSIVE on idempotency_requests: validates") != std::string::npos);
  CHECK(plan.output.find("every step is online") != std::string::npos);
  Db db(fresh.url());
  CHECK(db.scalar_int("SELECT count(*) FROM pg_class WHERE relname IN"
                      " ('idempotency_requests', 'idemproxy_schema_migrations')") == 0);

  // Applied, each step reported as it runs; then the plan has nothing left to do.
  auto applied = run_idemproxy({"migrate", "--config", cfg.string()});
  REQUIRE(applied.status.code() == 0);
  CHECK(applied.output.find("0003_fencing_tokens step 2/5 started: backfill") != std::string::npos);
  auto current = run_idemproxy({"migrate", "--config", cfg.string(), "--plan"});
  CHECK(current.output.find("nothing to apply") != std::string::npos);
  auto bad = run_idemproxy({"migrate", "--config", cfg.string(), "--lock-wait", "soon"});
  CHECK(bad.status.code() == 2);
}
