// PgStore beyond the conformance suite: real concurrency across connections and threads,
// the stored column formats, and how database failures surface as store errors.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <future>
#include <regex>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_future.hpp>

#include <libpq-fe.h>
#include <poll.h>

#include "idempotency/fingerprint.hpp"
#include "store/harness.hpp"

using namespace idem;
using namespace std::chrono_literals;

namespace {

// The fencing token of the claim that holds the record now (owner writes name it).
std::int64_t fence_of(test::PgHarness& h, const store::RecordId& id) {
  return std::stoll(h.sql()
                        .scalar("SELECT fencing_token FROM idempotency_requests WHERE tenant_id = $1"
                                " AND endpoint = $2 AND idempotency_key = $3",
                                {id.tenant, id.endpoint, id.key})
                        .value());
}

store::ClaimRequest claim_req(std::string key, std::string fingerprint = "fp") {
  store::ClaimRequest r;
  r.id = {"tenant-a", "POST /orders", std::move(key)};
  r.fingerprint = std::move(fingerprint);
  r.lease = 30s;
  r.retention = 1h;
  return r;
}

// n claims of the same key at once on one pool; returns how many won.
int claim_burst(asio::io_context& ctx, store::Store& s, const store::ClaimRequest& req, int n) {
  std::vector<std::future<result<store::ClaimResult>>> calls;
  for (int i = 0; i < n; ++i) calls.push_back(asio::co_spawn(ctx, s.claim(req), asio::use_future));
  ctx.restart();
  ctx.run();
  int won = 0;
  for (auto& c : calls) {
    auto r = c.get();
    REQUIRE(r.has_value());
    if (r->won) {
      ++won;
      CHECK(r->owner.attempt == 1);
    }
  }
  return won;
}

}  // namespace

TEST_CASE("PgStore: 100 concurrent claims from two pools on two threads, one winner") {
  test::PgHarness h;
  const auto req = claim_req("contended");

  // A second, independent pool on its own thread and io_context, like a second worker
  // or replica.
  asio::io_context other_ctx;
  auto other_pool = pg::Pool::create(other_ctx.get_executor(), test::store_pool_options(8));
  store::PgStore other(other_pool);

  std::promise<void> go;
  auto start = go.get_future().share();
  auto other_won = std::async(std::launch::async, [&] {
    start.wait();
    return claim_burst(other_ctx, other, req, 50);
  });
  go.set_value();
  const int here_won = claim_burst(h.ctx(), h.store(), req, 50);
  const int there_won = other_won.get();

  CHECK(here_won + there_won == 1);
  CHECK(h.row_count() == 1);
  CHECK(h.sql().scalar("SELECT attempt_token FROM idempotency_requests") == "1");
}

TEST_CASE("PgStore: the stored formats operators and other tools see") {
  test::PgHarness h;
  auto& s = h.store();
  const auto req = claim_req("formats");
  REQUIRE(h.run(s.claim(req)).value().won);
  store::StoredResponse resp;
  resp.status = 201;
  resp.headers = {{"Content-Type", "application/json"},
                  {"Set-Cookie", "a=1"},
                  {"Set-Cookie", "b=2"},
                  {"X-Bin", std::string("\xff\x00", 2)}};
  resp.body = std::string("{\"id\":1}\0\xff", 10);
  REQUIRE(h.run(s.complete(req.id, fence_of(h, req.id), resp, 1h)).value() == store::Completion::recorded);

  auto row = h.sql().query(
      "SELECT state, response_status, response_headers::text, encode(response_body, 'hex'),"
      " resource_id IS NULL, response_body_omitted, lease_expires_at IS NULL,"
      " expires_at - completed_at >= interval '1 hour'"
      "   AND expires_at - completed_at <= interval '1 hour' + interval '30 seconds'"
      " FROM idempotency_requests WHERE idempotency_key = 'formats'");
  REQUIRE(row.size() == 1);
  CHECK(row[0][0] == "completed");
  CHECK(row[0][1] == "201");
  // An array of [name, value] pairs in order; a non-UTF-8 pair is hex-tagged.
  CHECK(row[0][2] ==
        "[[\"Content-Type\", \"application/json\"], [\"Set-Cookie\", \"a=1\"], "
        "[\"Set-Cookie\", \"b=2\"], [\"582d42696e\", \"ff00\", \"hex\"]]");
  CHECK(row[0][3] == "7b226964223a317d00ff");
  CHECK(row[0][4] == "t");  // empty resource id stored as NULL
  CHECK(row[0][5] == "f");
  CHECK(row[0][6] == "t");
  CHECK(row[0][7] == "t");  // retention after the completion, at most one lease (30 s) more

  // An omitted body is NULL, not an empty bytea.
  const auto big = claim_req("omitted");
  REQUIRE(h.run(s.claim(big)).value().won);
  store::StoredResponse omitted;
  omitted.status = 200;
  omitted.body_omitted = true;
  omitted.resource_id = "r-1";
  REQUIRE(h.run(s.complete(big.id, fence_of(h, big.id), omitted, 1h)).value() == store::Completion::recorded);
  CHECK(h.sql().query("SELECT response_body IS NULL, response_body_omitted, resource_id"
                     " FROM idempotency_requests WHERE idempotency_key = 'omitted'")[0] ==
        test::Row{"t", "t", "r-1"});
}

TEST_CASE("PgStore: an expired row under a live lease is neither replaced nor cleaned") {
  // The API keeps expires_at beyond any live lease, so only SQL can build this row; the
  // statements must still refuse to touch it (defence in depth).
  test::PgHarness h;
  auto& s = h.store();
  const auto req = claim_req("leased");
  REQUIRE(h.run(s.claim(req)).value().won);
  h.sql().exec("UPDATE idempotency_requests SET expires_at = now() - interval '1 second'");
  auto rec = h.run(s.read(req.id)).value();
  REQUIRE(rec.has_value());
  CHECK(rec->expired);
  CHECK_FALSE(rec->lease_expired);
  CHECK(h.run(s.delete_expired(100)).value() == 0);
  CHECK_FALSE(h.run(s.replace_expired(claim_req("leased", "fp-2"), fence_of(h, req.id)))
                  .value()
                  .has_value());
  CHECK(h.row_count() == 1);
}

// The retention cleanup finds each row it locked by a TID probe: a batch costs in
// proportion to its size. An earlier form matched the locked (tableoid, ctid) pairs with a
// semi-join that, without the hash join the store's sessions never take, compared every
// deleted row with every locked one (999 000 comparisons for a batch of 1 000, 15 times
// the time). Checked in the plan PostgreSQL ran, in a session set up as the store's.
TEST_CASE("PgStore: a cleanup batch probes each locked row, never every pair") {
  test::PgHarness h;
  h.sql().exec(
      "INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, "
      "request_fingerprint, state, attempt_token, created_at, expires_at, fencing_token, "
      "response_status, completed_at) SELECT 'clean-' || (g % 8), 'POST /orders', 'k' || g, "
      "'fp', 'completed', 1, now(), now() - interval '1 s', nextval('idempotency_fencing_tokens'), "
      "201, now() FROM generate_series(1, 3000) g");
  std::string sql;
  for (const auto& st : store::pg_store_statements()) {
    if (st.name == "idem_delete_expired") sql = st.sql;
  }
  REQUIRE(!sql.empty());
  test::Db db(test::store_database().url());
  for (const auto& setting : store::pg_store_session_settings()) {
    db.exec("SELECT set_config($1, $2, false)", {setting.name, setting.value});
  }
  db.exec("BEGIN");
  std::string plan;
  for (const auto& row : db.query("EXPLAIN (ANALYZE, COSTS OFF) " + sql, {"1000"})) {
    plan += row.at(0).value_or("") + "\n";
  }
  db.exec("ROLLBACK");
  INFO(plan);
  const std::regex removed(R"(Rows Removed by Join Filter: ([0-9]+))");
  for (auto it = std::sregex_iterator(plan.begin(), plan.end(), removed);
       it != std::sregex_iterator(); ++it) {
    CHECK(std::stoll((*it)[1].str()) <= 1000);
  }
  CHECK(plan.find("Tid Scan") != std::string::npos);
  // And it deletes exactly a batch, then the rest.
  CHECK(h.run(h.store().delete_expired(1000)).value() == 1000);
  CHECK(h.row_count() == 2000);
  CHECK(h.run(h.store().delete_expired(5000)).value() == 2000);
  CHECK(h.row_count() == 0);
}

TEST_CASE("PgStore: a row lock held past statement_timeout is a store timeout") {
  test::PgHarness h;
  auto& s = h.store();
  const auto req = claim_req("locked");
  const auto owner = h.run(s.claim(req)).value();
  REQUIRE(owner.won);

  asio::io_context ctx;
  auto opts = test::store_pool_options(1);
  opts.statement_timeout = 300ms;
  auto pool = pg::Pool::create(ctx.get_executor(), opts);
  store::PgStore impatient(pool);

  test::Db locker(test::store_database().url());
  locker.exec("BEGIN");
  locker.exec("SELECT 1 FROM idempotency_requests WHERE idempotency_key = 'locked' FOR UPDATE");
  const auto start = SteadyClock::now();
  auto r = test::run(ctx, impatient.renew(req.id, owner.owner.fence, 30s));
  const auto took = test::elapsed_since(start);
  locker.exec("ROLLBACK");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error() == errc::store_timeout);
  CHECK(took < 2000ms);
  // The renew did not happen, and works once the lock is gone.
  CHECK(test::run(ctx, impatient.renew(req.id, owner.owner.fence, 30s)).value());
}

TEST_CASE("PgStore: an unreachable database is store_unavailable, at once") {
  asio::io_context ctx;
  std::uint16_t port = 0;
  {
    asio::ip::tcp::acceptor a(
        ctx, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }
  pg::PoolOptions opts = test::store_pool_options(2);
  opts.conninfo = "host=127.0.0.1 port=" + std::to_string(port) + " user=postgres dbname=x";
  store::PgStore s(pg::Pool::create(ctx.get_executor(), opts));
  const auto start = SteadyClock::now();
  auto r = test::run(ctx, s.claim(claim_req("k")));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error() == errc::store_unavailable);
  auto again = test::run(ctx, s.read({"tenant-a", "POST /orders", "k"}));
  REQUIRE_FALSE(again.has_value());
  CHECK(again.error() == errc::store_unavailable);
  CHECK(test::elapsed_since(start) < 1000ms);
}

TEST_CASE("PgStore: every statement is prepared on connect") {
  test::PgHarness h;
  REQUIRE(h.run(h.store().read({"t", "e", "k"})).has_value());  // opens a connection
  auto names = test::run(h.ctx(), h.pool()->query(
      "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'idem\\_%'"));
  REQUIRE(names);
  CHECK(names->int64(0, 0) == static_cast<std::int64_t>(store::pg_store_statements().size()));
}

TEST_CASE("PgStore: a lost claim can bring the row along, read after the claim") {
  test::PgHarness h;  // empty table, migrated database
  asio::io_context ctx;
  auto pool = pg::Pool::create(ctx.get_executor(), test::store_pool_options(2));
  const auto req = claim_req("along", "fp-1");

  SUBCASE("always: the loser gets the winner's committed row, as read() shows it") {
    store::PgStore s(pool, store::PgStore::ClaimRead::always);
    auto won = test::run(ctx, s.claim(req));
    REQUIRE(won.has_value());
    CHECK(won->won);
    CHECK_FALSE(won->row_read);  // a winner never carries a row
    CHECK_FALSE(won->row.has_value());

    auto lost = test::run(ctx, s.claim(claim_req("along", "fp-other")));
    REQUIRE(lost.has_value());
    CHECK_FALSE(lost->won);
    REQUIRE(lost->row_read);
    REQUIRE(lost->row.has_value());
    auto read = test::run(ctx, s.read(req.id));
    REQUIRE(read.has_value());
    REQUIRE(read->has_value());
    CHECK(lost->row->fingerprint == "fp-1");
    CHECK(lost->row->fingerprint == (*read)->fingerprint);
    CHECK(lost->row->state == store::State::in_progress);
    CHECK(lost->row->attempt == 1);
    CHECK(lost->row->fence == won->owner.fence);
    CHECK(lost->row->created_at_us == (*read)->created_at_us);
    CHECK(lost->row->lease_expires_at_us == (*read)->lease_expires_at_us);
    CHECK(h.row_count() == 1);

    // Completed: the stored response comes along too.
    store::StoredResponse resp;
    resp.status = 201;
    resp.body = "{\"id\":1}";
    resp.headers = {{"Content-Type", "application/json"}};
    REQUIRE(test::run(ctx, s.complete(req.id, won->owner.fence, resp, 1h)).value() == store::Completion::recorded);
    auto replay = test::run(ctx, s.claim(req));
    REQUIRE(replay.has_value());
    REQUIRE(replay->row.has_value());
    CHECK(replay->row->state == store::State::completed);
    REQUIRE(replay->row->response.has_value());
    CHECK(replay->row->response->body == "{\"id\":1}");
    CHECK(replay->row->response->headers.size() == 1);
  }

  SUBCASE("never: the caller reads") {
    store::PgStore s(pool, store::PgStore::ClaimRead::never);
    REQUIRE(test::run(ctx, s.claim(req)).value().won);
    auto lost = test::run(ctx, s.claim(req));
    REQUIRE(lost.has_value());
    CHECK_FALSE(lost->won);
    CHECK_FALSE(lost->row_read);
  }

  SUBCASE("adaptive: reads along only while lost claims are common") {
    store::PgStore s(pool);
    for (int i = 0; i < 20; ++i) {
      REQUIRE(test::run(ctx, s.claim(claim_req("fresh-" + std::to_string(i)))).value().won);
    }
    REQUIRE(test::run(ctx, s.claim(req)).value().won);
    auto first_loss = test::run(ctx, s.claim(req));
    REQUIRE(first_loss.has_value());
    CHECK_FALSE(first_loss->row_read);  // after a run of new keys: one round trip each
    bool switched = false;
    for (int i = 0; i < 10 && !switched; ++i) {
      auto lost = test::run(ctx, s.claim(req));
      REQUIRE(lost.has_value());
      CHECK_FALSE(lost->won);
      switched = lost->row_read;
      if (switched) CHECK(lost->row.has_value());
    }
    CHECK(switched);  // a burst of duplicates: the read comes along
    for (int i = 0; i < 200; ++i) {
      REQUIRE(test::run(ctx, s.claim(claim_req("later-" + std::to_string(i)))).value().won);
    }
    CHECK_FALSE(test::run(ctx, s.claim(req)).value().row_read);  // and stops again
  }
}

namespace {

// A session of its own that LISTENs on the replay cache's channel (blocking libpq: a test).
class ChangeListener {
 public:
  ChangeListener() : conn_(PQconnectdb(test::store_database().url().c_str())) {
    REQUIRE(PQstatus(conn_) == CONNECTION_OK);
    PQclear(PQexec(conn_, "LISTEN idemproxy_records"));
  }
  ~ChangeListener() { PQfinish(conn_); }

  // Everything announced before `marker`, which the caller sends last: notifications
  // arrive in commit order, so the marker proves nothing earlier is still on its way.
  std::vector<std::string> until(const std::string& marker) {
    std::vector<std::string> out;
    const auto deadline = SteadyClock::now() + 10s;
    for (;;) {
      while (PGnotify* n = PQnotifies(conn_)) {
        std::string payload = n->extra;
        PQfreemem(n);
        if (payload == marker) return out;
        out.push_back(std::move(payload));
      }
      REQUIRE(SteadyClock::now() < deadline);
      pollfd pfd{PQsocket(conn_), POLLIN, 0};
      ::poll(&pfd, 1, 100);
      REQUIRE(PQconsumeInput(conn_) == 1);
    }
  }

 private:
  PGconn* conn_;
};

}  // namespace

TEST_CASE("PgStore: migration 0002 announces changes of completed, unexpired records by operation id") {
  test::PgHarness h;
  auto& s = h.store();
  ChangeListener listener;
  int markers = 0;
  auto announced = [&] {
    const std::string marker = "marker-" + std::to_string(++markers);
    h.sql().exec("SELECT pg_notify('idemproxy_records', $1)", {marker});
    return listener.until(marker);
  };
  auto op = [](const store::ClaimRequest& r) {
    return idempotency::operation_id(r.id.tenant, r.id.endpoint, r.id.key);
  };
  store::StoredResponse resp;
  resp.status = 201;

  // The protocol's own writes on live records stay silent: claim, completion, release,
  // lease expiry, and reads.
  const auto a = claim_req("announce-a");
  const auto b = claim_req("announce-b");
  REQUIRE(h.run(s.claim(a)).value().won);
  REQUIRE(h.run(s.claim(b)).value().won);
  REQUIRE(h.run(s.complete(a.id, fence_of(h, a.id), resp, 1h)).value() == store::Completion::recorded);
  REQUIRE(h.run(s.expire_lease(b.id, fence_of(h, b.id))).value());
  REQUIRE(h.run(s.read(a.id)).has_value());
  CHECK_FALSE(h.run(s.claim(a)).value().won);
  REQUIRE(h.run(s.release(b.id, fence_of(h, b.id))).value());
  CHECK(announced().empty());

  // Deleting a completed record, by purge or by hand, names it.
  REQUIRE(h.run(s.purge(a.id)).value());
  CHECK(announced() == std::vector<std::string>{op(a)});
  const auto c = claim_req("announce-c");
  REQUIRE(h.run(s.claim(c)).value().won);
  REQUIRE(h.run(s.complete(c.id, fence_of(h, c.id), resp, 1h)).value() == store::Completion::recorded);
  h.sql().exec("UPDATE idempotency_requests SET response_status = 200 WHERE idempotency_key = 'announce-c'");
  CHECK(announced() == std::vector<std::string>{op(c)});

  // Once retention has passed, replacing or cleaning the record says nothing (no cache
  // serves it any more). Moving the clock is itself an UPDATE of a live record: announced.
  h.advance(2h);
  CHECK(announced() == std::vector<std::string>{op(c)});
  REQUIRE(h.run(s.replace_expired(c, fence_of(h, c.id))).value().has_value());
  const auto d = claim_req("announce-d");
  REQUIRE(h.run(s.claim(d)).value().won);
  REQUIRE(h.run(s.complete(d.id, fence_of(h, d.id), resp, 1h)).value() == store::Completion::recorded);
  h.advance(2h);
  CHECK(announced() == std::vector<std::string>{op(d)});
  CHECK(h.run(s.delete_expired(100)).value() >= 1);
  CHECK(announced().empty());

  // TRUNCATE fires no row trigger: it announces everything.
  h.sql().exec("TRUNCATE idempotency_requests CASCADE");
  CHECK(announced() == std::vector<std::string>{"*"});
}

TEST_CASE("PgStore: the database computes the same operation id as the sidecar") {
  test::PgHarness h;
  const std::vector<std::array<std::string, 3>> cases = {
      {"acme", "POST /orders", "order-0001"},
      {"t", "POST /orders/{id}/refunds", "\"quoted\" key with spaces"},
      {"tenant-ü", "POST /café", "ключ-1"},  // lengths are counted in bytes on both sides
      {"a", "", "b"},
  };
  for (const auto& [tenant, endpoint, key] : cases) {
    const auto rows = h.sql().query("SELECT idemproxy_operation_id($1, $2, $3)", {tenant, endpoint, key});
    REQUIRE(rows.size() == 1);
    CHECK(rows[0][0] == idempotency::operation_id(tenant, endpoint, key));
  }
}
