// A crashed or paused owner is harmless: its lease lapses, a retry takes over with a higher
// attempt token and the same operation id, and the stale owner can no longer write.
#include <csignal>
#include <future>

#include "common.hpp"

using namespace idem::it;
using namespace idem::it::suite;

namespace {

const std::string kOrder = R"({"customer_id":"c-1","amount":1000})";

SidecarOptions crash_options(const TestBackend& backend) {
  auto o = options_for(backend);
  o.routes[0].lease = "1s";
  o.routes[0].wait = "100ms";
  return o;
}

void wait_for_lease_expiry(Db& db, const std::string& tenant, const std::string& key) {
  // The lease is decided by the database clock; poll the row, not our own clock.
  wait_until([&] {
    auto row = read_row(db, tenant, key);
    return row && row->state == "in_progress" && row->lease_expired;
  }, 10s, "the crashed owner's lease to lapse");
}

}  // namespace

TEST_CASE("sidecar killed with SIGKILL mid-request: a retry takes over with attempt 2") {
  TestBackend backend;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto hold = unique("hold");
  auto a = std::make_unique<Sidecar>(crash_options(backend));

  auto doomed = std::async(std::launch::async, [&] {
    HttpClient client(a->port());
    try {
      client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", hold}}), 30s);
      return false;
    } catch (const std::exception&) {
      return true;  // the connection died with the sidecar
    }
  });
  auto first_call = backend.wait_for_call(
      [&](const BackendCall& c) { return c.header("X-Tenant-Id") == tenant; },
      "the first attempt to reach the backend");
  a->kill9();
  CHECK(doomed.get());
  backend.release(hold);  // the backend finishes its work; nobody is left to hear it

  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");
  CHECK(row->attempt == 1);

  Sidecar b(crash_options(backend));
  HttpClient client(b.port());
  wait_for_lease_expiry(db, tenant, key);

  auto retry = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(retry.status == 201);
  auto calls = calls_for(backend, tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[0].header("X-Idempotency-Attempt") == "1");
  CHECK(calls[1].header("X-Idempotency-Attempt") == "2");
  CHECK(calls[1].header("X-Idempotency-Operation-Id") ==
        first_call.header("X-Idempotency-Operation-Id"));

  row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 2);
  CHECK(row->body == retry.body);

  auto replay = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == retry.body);
  CHECK(calls_for(backend, tenant).size() == 2);
}

TEST_CASE("a paused owner resumed after a takeover cannot overwrite the new attempt's result") {
  TestBackend backend;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto hold = unique("hold");
  Sidecar stale(crash_options(backend));
  Sidecar fresh(crash_options(backend));

  auto stale_answer = std::async(std::launch::async, [&] {
    HttpClient client(stale.port());
    return client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", hold}}), 30s);
  });
  backend.wait_for_call([&](const BackendCall& c) { return c.header("X-Tenant-Id") == tenant; },
                        "the stale owner's call to reach the backend");
  stale.signal(SIGSTOP);  // a long GC pause, a frozen VM: the owner is alive but silent
  wait_for_lease_expiry(db, tenant, key);

  HttpClient client(fresh.port());
  auto taken = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(taken.status == 201);
  const auto after_takeover = read_row(db, tenant, key);
  REQUIRE(after_takeover);
  CHECK(after_takeover->state == "completed");
  CHECK(after_takeover->attempt == 2);

  stale.signal(SIGCONT);
  backend.release(hold);
  auto old = stale_answer.get();  // answered only after its (fenced) completion attempt
  // The backend's answer to attempt 1 is not the key's: its client gets what the record
  // holds, exactly as a retry would.
  CHECK(old.status == 201);
  CHECK(old.body == taken.body);
  CHECK(old.header("Idempotent-Replayed") == "true");

  const auto final_row = read_row(db, tenant, key);
  REQUIRE(final_row);
  CHECK(final_row->attempt == 2);
  CHECK(final_row->body == after_takeover->body);
  CHECK(final_row->state == "completed");
  CHECK(count_rows(db, tenant) == 1);

  auto replay = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(replay.body == taken.body);
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(stale.log().find("fenced") != std::string::npos);
}

TEST_CASE("a stale owner finishing while the new attempt still runs changes nothing") {
  // The row is still in progress under attempt 2 when attempt 1 tries to complete it, so
  // only the attempt token (not the state) can stop that write.
  TestBackend backend;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto stale_hold = unique("hold");
  const auto fresh_hold = unique("hold");
  Sidecar stale(crash_options(backend));
  Sidecar fresh(crash_options(backend));
  auto attempt_is = [&](const char* n) {
    return [&tenant, n](const BackendCall& c) {
      return c.header("X-Tenant-Id") == tenant && c.header("X-Idempotency-Attempt") == n;
    };
  };

  auto stale_answer = std::async(std::launch::async, [&] {
    HttpClient client(stale.port());
    return client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", stale_hold}}), 30s);
  });
  backend.wait_for_call(attempt_is("1"), "attempt 1 to reach the backend");
  stale.signal(SIGSTOP);
  wait_for_lease_expiry(db, tenant, key);

  auto fresh_answer = std::async(std::launch::async, [&] {
    HttpClient client(fresh.port());
    return client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", fresh_hold}}), 30s);
  });
  backend.wait_for_call(attempt_is("2"), "attempt 2 to reach the backend");

  stale.signal(SIGCONT);
  backend.release(stale_hold);
  // Sent only after its completion was tried and fenced: attempt 2 still runs, so the
  // stale owner's client is told to retry rather than given attempt 1's answer.
  const auto stale_res = stale_answer.get();
  CHECK(stale_res.status == 409);
  CHECK(problem_code(stale_res) == "idempotency_in_progress");
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");
  CHECK(row->attempt == 2);
  CHECK_FALSE(row->status.has_value());

  backend.release(fresh_hold);
  const auto taken = fresh_answer.get();
  CHECK(taken.status == 201);
  row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->attempt == 2);
  CHECK(row->body == taken.body);
}

TEST_CASE("an upstream that times out leaves the outcome unknown: 504, then an immediate takeover") {
  TestBackend backend;
  Db db(database_url());
  auto o = options_for(backend);
  o.upstream_response_timeout = "300ms";
  Sidecar sidecar(o);
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto hold = unique("hold");
  HttpClient client(sidecar.port());

  auto timed_out = client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", hold}}));
  CHECK(timed_out.status == 504);
  CHECK(problem_code(timed_out) == "upstream_timeout");
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");
  CHECK(row->lease_expired);  // expired at once: no need to wait out the lease
  backend.release(hold);

  auto retry = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(retry.status == 201);
  auto calls = calls_for(backend, tenant);
  REQUIRE(calls.size() == 2);
  CHECK(calls[1].header("X-Idempotency-Attempt") == "2");
  CHECK(calls[1].header("X-Idempotency-Operation-Id") == calls[0].header("X-Idempotency-Operation-Id"));
}

TEST_CASE("upstream refusing connections: 502, claim released, nothing recorded") {
  TestBackend backend;
  Db db(database_url());
  Sidecar sidecar(options_for(backend));
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  backend.stop();
  HttpClient client(sidecar.port());
  auto res = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(res.status == 502);
  CHECK(problem_code(res) == "upstream_unavailable");
  CHECK(count_rows(db, tenant) == 0);
  backend.restart();
  auto ok = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(ok.status == 201);
  CHECK(read_row(db, tenant, key)->attempt == 1);
}

// The lost completion of the fencing issue, made deterministic. Attempt 1 pauses past its
// lease; a retry takes over (attempt 2), gets a 503 and releases the key; the next retry
// claims the key afresh, so its attempt is 1 again. Attempt 1 resumes with a 503 of its
// own and releases with its token. With a token per row (attempt_token) that release
// deleted the running new claim: its completion then found no row, its client saw 201,
// and PostgreSQL held no record of the operation. The fencing token never repeats for a
// key, so the stale release matches nothing.
TEST_CASE("lost completion: a stale owner of a released claim cannot release the key's new claim") {
  TestBackend backend;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto stale_hold = unique("hold");
  const auto new_hold = unique("hold");
  Sidecar stale(crash_options(backend));
  Sidecar fresh(crash_options(backend));
  HttpClient client(fresh.port());

  auto stale_answer = std::async(std::launch::async, [&] {
    HttpClient c(stale.port());
    return c.post("/orders", kOrder,
                  order_headers(tenant, key, {{"X-Test-Hold", stale_hold}, {"X-Test-Status", "503"}}),
                  30s);
  });
  const auto first = backend.wait_for_call(
      [&](const BackendCall& c) { return c.header("X-Tenant-Id") == tenant; },
      "attempt 1 to reach the backend");
  stale.signal(SIGSTOP);
  wait_for_lease_expiry(db, tenant, key);

  // Attempt 2 takes over and fails transiently: the key is released (the row deleted).
  auto failed = client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Status", "503"}}));
  CHECK(failed.status == 503);
  CHECK(count_rows(db, tenant) == 0);

  // The next retry claims the key afresh and runs.
  auto new_answer = std::async(std::launch::async, [&] {
    HttpClient c(fresh.port());
    return c.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", new_hold}}), 30s);
  });
  const auto running = backend.wait_for_call(
      [&](const BackendCall& c) {
        return c.header("X-Tenant-Id") == tenant && c.header("X-Test-Hold") == new_hold;
      },
      "the new claim to reach the backend");
  CHECK(running.header("X-Idempotency-Attempt") == "1");  // what backends see starts over
  CHECK(running.header("X-Idempotency-Fencing-Token") != first.header("X-Idempotency-Fencing-Token"));
  CHECK(running.header("X-Idempotency-Operation-Id") == first.header("X-Idempotency-Operation-Id"));

  // Attempt 1 resumes, gets its 503 and releases with its own token: nothing happens.
  stale.signal(SIGCONT);
  backend.release(stale_hold);
  const auto stale_res = stale_answer.get();
  CHECK(stale_res.status == 409);  // from the record: the new claim still runs
  CHECK(problem_code(stale_res) == "idempotency_in_progress");
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");
  CHECK(std::to_string(row->fence) == running.header("X-Idempotency-Fencing-Token"));
  CHECK(stale.log().find("release fenced") != std::string::npos);

  // The new claim completes, and PostgreSQL holds exactly what its client saw.
  backend.release(new_hold);
  const auto created = new_answer.get();
  CHECK(created.status == 201);
  row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->body == created.body);
  CHECK(count_rows(db, tenant) == 1);
  auto replay = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.body == created.body);
  CHECK(calls_for(backend, tenant).size() == 3);
}

// The lease-expiry variant: attempt 1 resumes into an unknown outcome (its backend
// connection dies) and ends its lease at once, which is right for its own claim. With a
// token per row it ended the lease of the key's new claim instead, while that claim still
// ran, and the next duplicate took the running operation over and sent it to the backend
// a second time.
TEST_CASE("lease-expiry variant: a stale owner cannot end the lease of the key's new claim") {
  TestBackend backend;
  Db db(database_url());
  const auto tenant = unique("tenant");
  const auto key = unique("key");
  const auto stale_hold = unique("hold");
  const auto new_hold = unique("hold");
  Sidecar stale(crash_options(backend));
  Sidecar fresh(crash_options(backend));
  HttpClient client(fresh.port());

  auto stale_answer = std::async(std::launch::async, [&] {
    HttpClient c(stale.port());
    return c.post("/orders", kOrder,
                  order_headers(tenant, key,
                                {{"X-Test-Hold", stale_hold}, {"X-Test-Close", "before-response"}}),
                  30s);
  });
  backend.wait_for_call([&](const BackendCall& c) { return c.header("X-Tenant-Id") == tenant; },
                        "attempt 1 to reach the backend");
  stale.signal(SIGSTOP);
  wait_for_lease_expiry(db, tenant, key);
  CHECK(client.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Status", "503"}})).status ==
        503);
  CHECK(count_rows(db, tenant) == 0);

  auto new_answer = std::async(std::launch::async, [&] {
    HttpClient c(fresh.port());
    return c.post("/orders", kOrder, order_headers(tenant, key, {{"X-Test-Hold", new_hold}}), 30s);
  });
  const auto running = backend.wait_for_call(
      [&](const BackendCall& c) {
        return c.header("X-Tenant-Id") == tenant && c.header("X-Test-Hold") == new_hold;
      },
      "the new claim to reach the backend");

  // Attempt 1 resumes; the backend resets its connection: outcome unknown, lease ended.
  stale.signal(SIGCONT);
  backend.release(stale_hold);
  const auto stale_res = stale_answer.get();
  CHECK(stale_res.status == 504);
  CHECK(problem_code(stale_res) == "upstream_timeout");
  auto row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "in_progress");
  CHECK_FALSE(row->lease_expired);  // the running claim keeps its lease
  CHECK(std::to_string(row->fence) == running.header("X-Idempotency-Fencing-Token"));
  CHECK(stale.log().find("lease expiry fenced") != std::string::npos);

  // A duplicate now waits for the running claim instead of taking it over.
  auto dup = client.post("/orders", kOrder, order_headers(tenant, key));
  CHECK(dup.status == 409);
  CHECK(problem_code(dup) == "idempotency_in_progress");
  CHECK(calls_for(backend, tenant).size() == 3);  // attempt 1, the 503, the new claim

  backend.release(new_hold);
  const auto created = new_answer.get();
  CHECK(created.status == 201);
  row = read_row(db, tenant, key);
  REQUIRE(row);
  CHECK(row->state == "completed");
  CHECK(row->body == created.body);
  CHECK(calls_for(backend, tenant).size() == 3);
}
