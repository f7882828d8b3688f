// Group commit in PgStore (database.batching): real concurrent calls that leave as one
// batch, and what each member gets. Every case checks the rows in PostgreSQL, not only
// the answers, and that the calls really shared a statement (PgStore::batch_stats()).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/use_future.hpp>

#include "store/harness.hpp"

using namespace idem;
using namespace std::chrono_literals;
using store::ClaimRequest;
using store::ClaimResult;
using store::Completed;
using store::Completion;
using store::RecordId;

namespace {

ClaimRequest claim_req(std::string tenant, std::string endpoint, std::string key,
                       std::string fingerprint) {
  ClaimRequest r;
  r.id = {std::move(tenant), std::move(endpoint), std::move(key)};
  r.fingerprint = std::move(fingerprint);
  r.lease = 30s;
  r.retention = 1h;
  return r;
}

// Starts every call in one pass of the event loop and runs them all to completion. The
// first call starts a batch, which takes the queue one pass later: by then every other
// call has queued, so they all leave together (up to the batch cap).
template <class T>
std::vector<result<T>> all_at_once(asio::io_context& ctx,
                                   std::vector<asio::awaitable<result<T>>> calls) {
  std::vector<std::future<result<T>>> futures;
  for (auto& c : calls) futures.push_back(asio::co_spawn(ctx, std::move(c), asio::use_future));
  ctx.restart();
  ctx.run();
  std::vector<result<T>> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

std::int64_t count_rows(test::Db& db, std::string_view where, const test::SqlParams& params) {
  return db.scalar_int("SELECT count(*) FROM idempotency_requests WHERE " + std::string(where),
                       params);
}

// Rows of `id` completed under fence `f` with `r`'s body, lease cleared.
std::int64_t completed_with(test::Db& db, const RecordId& id, std::int64_t f,
                            const store::StoredResponse& r) {
  return count_rows(db,
                    "tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3"
                    " AND fencing_token = $4::bigint AND state = 'completed'"
                    " AND response_body = convert_to($5, 'UTF8') AND lease_expires_at IS NULL",
                    {id.tenant, id.endpoint, id.key, std::to_string(f), r.body});
}

store::StoredResponse response(int status, std::string body) {
  store::StoredResponse r;
  r.status = status;
  r.headers = {{"Content-Type", "application/json"}, {"Location", "/orders/" + body}};
  r.body = std::move(body);
  r.resource_id = r.body;
  return r;
}

}  // namespace

TEST_CASE("batching: a winner and a loser of one key, other tenants and scopes, in one batch") {
  test::PgHarness h;
  test::Db other(test::store_database().url());  // a session of its own: sees commits only
  // A record already completed before the batch: its claim in the batch loses.
  {
    store::PgStore single(h.pool(), store::PgStore::ClaimRead::never, {false});
    const auto done = claim_req("tenant-a", "POST /orders", "done", "fp-done");
    auto won = h.run(single.claim(done));
    REQUIRE(won.has_value());
    REQUIRE(won->won);
    REQUIRE(h.run(single.complete(done.id, won->owner.fence, response(201, "7"), 1h)).value() ==
            Completion::recorded);
  }

  for (const auto read_mode : {store::PgStore::ClaimRead::always, store::PgStore::ClaimRead::never}) {
  CAPTURE(static_cast<int>(read_mode));
  h.sql().exec("DELETE FROM idempotency_requests WHERE idempotency_key <> 'done'");
  store::PgStore s(h.pool(), read_mode);

  const std::vector<ClaimRequest> reqs = {
      claim_req("tenant-a", "POST /orders", "k1", "fp-first"),   // 0: wins k1 (first queued)
      claim_req("tenant-a", "POST /orders", "k1", "fp-second"),  // 1: loses k1 to 0
      claim_req("tenant-b", "POST /orders", "k1", "fp-b"),       // 2: same key, other tenant
      claim_req("tenant-a", "POST /refunds", "k1", "fp-r"),      // 3: same key, other scope
      claim_req("tenant-a", "POST /orders", "k2", "fp-k2"),      // 4: another key
      claim_req("tenant-a", "POST /orders", "done", "fp-done"),  // 5: loses to the record
  };
  // Each winner looks from another session as soon as its claim returns: the claim must
  // be committed before the caller could forward anything.
  std::vector<std::int64_t> visible(reqs.size(), -1);
  auto claim_and_look = [&](std::size_t i) -> asio::awaitable<result<ClaimResult>> {
    auto r = co_await s.claim(reqs[i]);
    if (r && r->won) {
      visible[i] = count_rows(other, "fencing_token = $1::bigint AND state = 'in_progress'",
                              {std::to_string(r->owner.fence)});
    }
    co_return r;
  };
  std::vector<asio::awaitable<result<ClaimResult>>> calls;
  for (std::size_t i = 0; i < reqs.size(); ++i) calls.push_back(claim_and_look(i));
  auto out = all_at_once(h.ctx(), std::move(calls));

  // They shared one statement and one commit.
  CHECK(s.batch_stats().claim_batches == 1);
  CHECK(s.batch_stats().claims_batched == reqs.size());
  for (auto& r : out) REQUIRE(r.has_value());

  std::set<std::int64_t> fences;
  for (std::size_t i : {0u, 2u, 3u, 4u}) {
    CAPTURE(i);
    CHECK(out[i]->won);
    CHECK(out[i]->owner.attempt == 1);
    CHECK(visible[i] == 1);
    fences.insert(out[i]->owner.fence);
    // The row holds this member's fingerprint and fencing token.
    CHECK(count_rows(h.sql(),
                     "tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3"
                     " AND request_fingerprint = $4 AND fencing_token = $5::bigint"
                     " AND attempt_token = 1 AND state = 'in_progress'",
                     {reqs[i].id.tenant, reqs[i].id.endpoint, reqs[i].id.key, reqs[i].fingerprint,
                      std::to_string(out[i]->owner.fence)}) == 1);
  }
  CHECK(fences.size() == 4);  // every winner its own token

  // The loser of k1 sees the winner's row, in progress, as a claim right after it would.
  CHECK_FALSE(out[1]->won);
  REQUIRE(out[1]->row_read);
  REQUIRE(out[1]->row.has_value());
  CHECK(out[1]->row->fingerprint == "fp-first");
  CHECK(out[1]->row->fence == out[0]->owner.fence);
  CHECK(out[1]->row->state == store::State::in_progress);

  // The loser to the completed record: with read-along it carries the stored answer.
  CHECK_FALSE(out[5]->won);
  if (read_mode == store::PgStore::ClaimRead::always) {
    REQUIRE(out[5]->row_read);
    REQUIRE(out[5]->row.has_value());
    CHECK(out[5]->row->state == store::State::completed);
    REQUIRE(out[5]->row->response.has_value());
    CHECK(out[5]->row->response->body == "7");
  } else {
    CHECK_FALSE(out[5]->row_read);
  }

  CHECK(h.row_count() == 5);  // four claims and the record; no loser wrote anything
  CHECK(count_rows(h.sql(), "idempotency_key = 'done' AND state = 'completed'", {}) == 1);
  }
}

TEST_CASE("batching: completions in one batch each learn whether their own write matched") {
  test::PgHarness h;
  store::PgStore single(h.pool(), store::PgStore::ClaimRead::never, {false});
  auto claim = [&](const std::string& key) {
    auto r = h.run(single.claim(claim_req("tenant-a", "POST /orders", key, "fp-" + key)));
    REQUIRE(r.has_value());
    REQUIRE(r->won);
    return r->owner.fence;
  };
  const RecordId a{"tenant-a", "POST /orders", "a"}, b{"tenant-a", "POST /orders", "b"},
      c{"tenant-a", "POST /orders", "c"}, d{"tenant-a", "POST /orders", "d"};
  const auto fa = claim("a"), fc = claim("c"), fd = claim("d");
  // b: its first owner is stale (released, and the key claimed again since).
  const auto fb_stale = claim("b");
  REQUIRE(h.run(single.release(b, fb_stale)).value());
  const auto fb = claim("b");
  REQUIRE(fb != fb_stale);
  // d: completed already; the batch carries a retry of that very completion.
  const auto rd = response(201, "4");
  REQUIRE(h.run(single.complete(d, fd, rd, 1h)).value() == Completion::recorded);
  const auto b_before = h.snapshot(b);
  const auto d_before = h.snapshot(d);

  store::PgStore s(h.pool());
  const auto ra = response(201, "1"), rb = response(201, "2"), rc = response(409, "3");
  std::vector<asio::awaitable<result<Completed>>> calls;
  calls.push_back(s.complete(a, fa, ra, 1h));
  calls.push_back(s.complete(b, fb_stale, rb, 1h));  // fenced
  calls.push_back(s.complete(c, fc, rc, 1h));
  calls.push_back(s.complete(d, fd, rd, 1h));  // its own answer, already recorded
  auto out = all_at_once(h.ctx(), std::move(calls));

  CHECK(s.batch_stats().completion_batches == 1);
  CHECK(s.batch_stats().completions_batched == 4);
  for (auto& r : out) REQUIRE(r.has_value());
  CHECK(out[0]->outcome == Completion::recorded);
  CHECK(out[1]->outcome == Completion::fenced);
  CHECK(out[2]->outcome == Completion::recorded);
  CHECK(out[3]->outcome == Completion::already_recorded);
  CHECK(out[0]->expires_at_us > 0);
  CHECK(out[3]->expires_at_us > 0);

  // Each written row holds its own member's answer, under its own fence.
  auto recorded_with = [&](const RecordId& id, std::int64_t fence, const store::StoredResponse& r) {
    return count_rows(h.sql(),
                      "tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3"
                      " AND fencing_token = $4::bigint AND state = 'completed'"
                      " AND response_status = $5::integer AND response_body = convert_to($6, 'UTF8')"
                      " AND resource_id = $6 AND lease_expires_at IS NULL",
                      {id.tenant, id.endpoint, id.key, std::to_string(fence),
                       std::to_string(r.status), r.body});
  };
  CHECK(recorded_with(a, fa, ra) == 1);
  CHECK(recorded_with(c, fc, rc) == 1);
  // The stale owner changed nothing; the retried completion changed nothing.
  CHECK(h.snapshot(b) == b_before);
  CHECK(count_rows(h.sql(), "idempotency_key = 'b' AND state = 'in_progress' AND fencing_token = $1::bigint",
                   {std::to_string(fb)}) == 1);
  CHECK(h.snapshot(d) == d_before);
  CHECK(h.row_count() == 4);
}

TEST_CASE("batching: releases and renewals in one batch each answer whether their own fence matched") {
  test::PgHarness h;
  store::PgStore single(h.pool(), store::PgStore::ClaimRead::never, {false});
  auto claim = [&](const std::string& key, std::chrono::milliseconds lease = 30s) {
    auto req = claim_req("tenant-a", "POST /orders", key, "fp-" + key);
    req.lease = lease;
    auto r = h.run(single.claim(req));
    REQUIRE(r.has_value());
    REQUIRE(r->won);
    return r->owner.fence;
  };
  // Named: the calls are coroutines that hold their id by reference until they run.
  std::map<std::string, RecordId> ids;
  for (const char* k : {"a", "b", "c", "d", "r", "s"}) ids[k] = RecordId{"tenant-a", "POST /orders", k};
  auto id = [&](const std::string& key) -> const RecordId& { return ids.at(key); };
  const auto fa = claim("a"), fb = claim("b"), fd = claim("d");
  // c: its first owner is stale (released, and the key claimed again since).
  const auto fc_stale = claim("c");
  REQUIRE(h.run(single.release(id("c"), fc_stale)).value());
  const auto fc = claim("c");
  // d: completed, so final even for its own fence.
  REQUIRE(h.run(single.complete(id("d"), fd, response(201, "4"), 1h)).value() == Completion::recorded);
  // Short leases on the renewals' rows, so a renewal visibly moves them.
  const auto fr = claim("r", 1s), fs = claim("s", 1s);
  const auto fs_stale = fs - 1000;  // never handed out for this key
  const auto c_before = h.snapshot(id("c"));
  const auto d_before = h.snapshot(id("d"));
  const auto s_before = h.snapshot(id("s"));

  store::PgStore s(h.pool());
  std::vector<asio::awaitable<result<bool>>> calls;
  calls.push_back(s.release(id("a"), fa));
  calls.push_back(s.release(id("b"), fb));
  calls.push_back(s.release(id("c"), fc_stale));  // fenced
  calls.push_back(s.release(id("d"), fd));        // completed
  calls.push_back(s.renew(id("r"), fr, 1h));
  calls.push_back(s.renew(id("s"), fs_stale, 1h));  // fenced
  calls.push_back(s.renew(id("d"), fd, 1h));         // completed
  auto out = all_at_once(h.ctx(), std::move(calls));

  CHECK(s.batch_stats().release_batches == 1);
  CHECK(s.batch_stats().releases_batched == 4);
  CHECK(s.batch_stats().renewal_batches == 1);
  CHECK(s.batch_stats().renewals_batched == 3);
  for (auto& r : out) REQUIRE(r.has_value());
  CHECK(*out[0]);
  CHECK(*out[1]);
  CHECK_FALSE(*out[2]);
  CHECK_FALSE(*out[3]);
  CHECK(*out[4]);
  CHECK_FALSE(*out[5]);
  CHECK_FALSE(*out[6]);

  // The rows: a and b gone, c (its current owner's) untouched, d final and untouched.
  CHECK(count_rows(h.sql(), "idempotency_key IN ('a', 'b')", {}) == 0);
  CHECK(h.snapshot(id("c")) == c_before);
  CHECK(count_rows(h.sql(), "idempotency_key = 'c' AND fencing_token = $1::bigint", {std::to_string(fc)}) == 1);
  CHECK(h.snapshot(id("d")) == d_before);
  // r's lease now runs about an hour (it was one second); s, fenced, unchanged.
  CHECK(count_rows(h.sql(),
                   "idempotency_key = 'r' AND state = 'in_progress'"
                   " AND lease_expires_at > now() + interval '50 minutes'"
                   " AND expires_at >= lease_expires_at",
                   {}) == 1);
  CHECK(h.snapshot(id("s")) == s_before);
  CHECK(h.row_count() == 4);
}

TEST_CASE("batching: a member the server refuses fails alone; the others keep their outcome") {
  test::PgHarness h;
  store::PgStore s(h.pool());
  // Not UTF-8: PostgreSQL refuses the value (SQLSTATE 22021), and with it the whole batch
  // statement; nothing of it is committed.
  const std::vector<ClaimRequest> reqs = {
      claim_req("tenant-a", "POST /orders", "good-1", "fp"),
      claim_req("tenant-a", "POST /orders", "bad-\xff\xfe", "fp"),
      claim_req("tenant-b", "POST /orders", "good-2", "fp"),
  };
  std::vector<asio::awaitable<result<ClaimResult>>> calls;
  for (const auto& r : reqs) calls.push_back(s.claim(r));
  auto out = all_at_once(h.ctx(), std::move(calls));

  CHECK(s.batch_stats().claim_batches == 1);
  CHECK(s.batch_stats().batches_refused == 1);
  REQUIRE(out[0].has_value());
  CHECK(out[0]->won);
  REQUIRE(out[2].has_value());
  CHECK(out[2]->won);
  // The refused member fails exactly as its own claim fails.
  REQUIRE_FALSE(out[1].has_value());
  CHECK(out[1].error() == errc::store_protocol);
  CHECK(h.row_count() == 2);
  CHECK(count_rows(h.sql(), "idempotency_key IN ('good-1', 'good-2') AND state = 'in_progress'", {}) == 2);
}

// Starts claims and completions in one pass of the event loop (all_at_once, for two kinds).
struct Cycle {
  std::vector<result<ClaimResult>> claims;
  std::vector<result<Completed>> completions;
};
Cycle cycle_at_once(asio::io_context& ctx, std::vector<asio::awaitable<result<Completed>>> completions,
                    std::vector<asio::awaitable<result<ClaimResult>>> claims) {
  std::vector<std::future<result<Completed>>> done;
  std::vector<std::future<result<ClaimResult>>> claimed;
  for (auto& c : completions) done.push_back(asio::co_spawn(ctx, std::move(c), asio::use_future));
  for (auto& c : claims) claimed.push_back(asio::co_spawn(ctx, std::move(c), asio::use_future));
  ctx.restart();
  ctx.run();
  Cycle out;
  for (auto& f : claimed) out.claims.push_back(f.get());
  for (auto& f : done) out.completions.push_back(f.get());
  return out;
}

// The transactions that last wrote the rows of these keys: rows written by one
// transaction carry its id (xmin), so one id is one commit.
std::int64_t writers(test::Db& db, const std::vector<std::string>& keys) {
  std::string list;
  for (const auto& k : keys) list += (list.empty() ? "'" : ", '") + k + "'";
  return db.scalar_int("SELECT count(DISTINCT xmin::text) FROM idempotency_requests"
                       " WHERE idempotency_key IN (" + list + ")");
}

TEST_CASE("batching: claims and completions ready at the same moment share one transaction") {
  test::PgHarness h;
  store::PgStore single(h.pool(), store::PgStore::ClaimRead::never, {false});
  auto claim = [&](const std::string& tenant, const std::string& key) {
    return h.run(single.claim(claim_req(tenant, "POST /orders", key, "fp-" + key))).value().owner.fence;
  };
  const RecordId a{"tenant-a", "POST /orders", "a"}, b{"tenant-b", "POST /orders", "b"};
  const auto fa = claim("tenant-a", "a");
  const auto fb = claim("tenant-b", "b");
  const auto stale = claim("tenant-a", "s");
  REQUIRE(h.run(single.release({"tenant-a", "POST /orders", "s"}, stale)).value());
  const auto fs = claim("tenant-a", "s");

  store::PgStore s(h.pool(), store::PgStore::ClaimRead::always);
  // The calls take their arguments by reference: they live until the calls are done.
  const auto ra = response(201, "1"), rb = response(201, "2");
  const RecordId sid{"tenant-a", "POST /orders", "s"};
  std::vector<asio::awaitable<result<Completed>>> completions;
  completions.push_back(s.complete(a, fa, ra, 1h));
  completions.push_back(s.complete(b, fb, rb, 1h));
  completions.push_back(s.complete(sid, stale, rb, 1h));  // fenced
  const std::vector<ClaimRequest> reqs = {
      claim_req("tenant-a", "POST /orders", "c", "fp-c"),
      claim_req("tenant-b", "POST /orders", "d", "fp-d"),
      claim_req("tenant-a", "POST /orders", "a", "fp-a"),  // a retry of a
  };
  std::vector<asio::awaitable<result<ClaimResult>>> claims;
  for (const auto& r : reqs) claims.push_back(s.claim(r));
  auto out = cycle_at_once(h.ctx(), std::move(completions), std::move(claims));

  CHECK(s.batch_stats().combined_cycles == 1);
  CHECK(s.batch_stats().claim_batches == 1);
  CHECK(s.batch_stats().completion_batches == 1);
  for (auto& r : out.completions) REQUIRE(r.has_value());
  for (auto& r : out.claims) REQUIRE(r.has_value());
  CHECK(out.completions[0]->outcome == Completion::recorded);
  CHECK(out.completions[1]->outcome == Completion::recorded);
  CHECK(out.completions[2]->outcome == Completion::fenced);
  CHECK(out.claims[0]->won);
  CHECK(out.claims[1]->won);
  // The retry of a reads a completed in this very cycle: the completions go first.
  CHECK_FALSE(out.claims[2]->won);
  REQUIRE(out.claims[2]->row.has_value());
  CHECK(out.claims[2]->row->state == store::State::completed);
  REQUIRE(out.claims[2]->row->response.has_value());
  CHECK(out.claims[2]->row->response->body == "1");
  // One transaction wrote both completions and both claims; the fenced one wrote nothing.
  CHECK(writers(h.sql(), {"a", "b", "c", "d"}) == 1);
  CHECK(count_rows(h.sql(), "idempotency_key IN ('a', 'b') AND state = 'completed'", {}) == 2);
  CHECK(count_rows(h.sql(), "idempotency_key IN ('c', 'd') AND state = 'in_progress'", {}) == 2);
  CHECK(count_rows(h.sql(), "idempotency_key = 's' AND state = 'in_progress' AND fencing_token = $1::bigint",
                   {std::to_string(fs)}) == 1);
  CHECK(h.row_count() == 5);
}

TEST_CASE("batching: a cycle the server refuses runs every member alone; each keeps its own outcome") {
  test::PgHarness h;
  store::PgStore single(h.pool(), store::PgStore::ClaimRead::never, {false});
  const RecordId a{"tenant-a", "POST /orders", "a"};
  const auto fa = h.run(single.claim(claim_req("tenant-a", "POST /orders", "a", "fp-a"))).value().owner.fence;

  store::PgStore s(h.pool());
  const auto ra = response(201, "1");
  std::vector<asio::awaitable<result<Completed>>> completions;
  completions.push_back(s.complete(a, fa, ra, 1h));
  const std::vector<ClaimRequest> reqs = {
      claim_req("tenant-a", "POST /orders", "good-1", "fp"),
      // Not UTF-8: PostgreSQL refuses it (22021), and with it the cycle's transaction.
      claim_req("tenant-a", "POST /orders", "bad-\xff\xfe", "fp"),
  };
  std::vector<asio::awaitable<result<ClaimResult>>> claims;
  for (const auto& r : reqs) claims.push_back(s.claim(r));
  auto out = cycle_at_once(h.ctx(), std::move(completions), std::move(claims));

  CHECK(s.batch_stats().combined_cycles == 1);
  CHECK(s.batch_stats().batches_refused == 2);  // the cycle's claims and its completions
  REQUIRE(out.completions[0].has_value());
  CHECK(out.completions[0]->outcome == Completion::recorded);
  REQUIRE(out.claims[0].has_value());
  CHECK(out.claims[0]->won);
  REQUIRE_FALSE(out.claims[1].has_value());
  CHECK(out.claims[1].error() == errc::store_protocol);
  CHECK(count_rows(h.sql(), "idempotency_key = 'a' AND state = 'completed'", {}) == 1);
  CHECK(count_rows(h.sql(), "idempotency_key = 'good-1' AND state = 'in_progress'", {}) == 1);
  CHECK(h.row_count() == 2);
  // Each went again on its own: two transactions.
  CHECK(writers(h.sql(), {"a", "good-1"}) == 2);
}

// Runs the handlers that are ready now (and those they make ready), without waiting.
void poll_ready(asio::io_context& ctx) {
  if (ctx.stopped()) ctx.restart();
  ctx.poll();
}

TEST_CASE("batching: one write cycle at a time: a completion that arrives while a claim cycle runs leaves with the next one") {
  test::PgHarness h;
  store::PgStore single(h.pool(), store::PgStore::ClaimRead::never, {false});
  const RecordId a{"tenant-a", "POST /orders", "a"};
  const auto fa = h.run(single.claim(claim_req("tenant-a", "POST /orders", "a", "fp-a"))).value().owner.fence;

  // Another session inserts key x and keeps its transaction open: a claim of x waits in
  // PostgreSQL for it, and so keeps the store's write cycle in flight as long as the test
  // wants.
  test::Db blocker(test::store_database().url());
  blocker.exec("BEGIN");
  blocker.exec(
      "INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint,"
      " state, attempt_token, lease_expires_at, created_at, expires_at)"
      " VALUES ('tenant-a', 'POST /orders', 'x', 'fp-other', 'in_progress', 1,"
      " now() + interval '30 seconds', now(), now() + interval '1 hour')");

  store::PgStore s(h.pool());
  auto& ctx = h.ctx();
  const auto rx = claim_req("tenant-a", "POST /orders", "x", "fp-x");
  auto x = asio::co_spawn(ctx, s.claim(rx), asio::use_future);
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  // This test's database only: the partitioned run of this binary may share the server.
  while (h.sql().scalar_int("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                            " AND application_name = 'idem-store-test' AND wait_event_type = 'Lock'") == 0) {
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "the claim of x never waited for the blocker");
    poll_ready(ctx);
  }
  // The cycle of x is in flight. A completion arrives (with a lane per kind it would start
  // a cycle of its own at once, here), then a claim of another key.
  const auto ra = response(201, "1");
  auto done = asio::co_spawn(ctx, s.complete(a, fa, ra, 1h), asio::use_future);
  poll_ready(ctx);
  const auto ry = claim_req("tenant-a", "POST /orders", "y", "fp-y");
  auto y = asio::co_spawn(ctx, s.claim(ry), asio::use_future);
  poll_ready(ctx);

  blocker.exec("ROLLBACK");  // x's cycle goes on: it wins x and commits
  ctx.restart();
  ctx.run();
  const auto rx_out = x.get(), ry_out = y.get();
  const auto done_out = done.get();
  REQUIRE(rx_out.has_value());
  REQUIRE(ry_out.has_value());
  REQUIRE(done_out.has_value());
  CHECK(rx_out->won);
  CHECK(ry_out->won);
  CHECK(done_out->outcome == Completion::recorded);
  // The completion and the later claim left together, as the next cycle: one transaction.
  CHECK(writers(h.sql(), {"a", "y"}) == 1);
  CHECK(writers(h.sql(), {"a", "x", "y"}) == 2);
  CHECK(s.batch_stats().combined_cycles == 1);
  CHECK(count_rows(h.sql(), "idempotency_key = 'a' AND state = 'completed'", {}) == 1);
  CHECK(count_rows(h.sql(), "idempotency_key IN ('x', 'y') AND state = 'in_progress'", {}) == 2);
  CHECK(h.row_count() == 3);
}

TEST_CASE("batching: two replicas' batches over the same keys in opposite orders: no deadlock, one winner per key") {
  test::PgHarness h;
  store::PgStore here(h.pool());
  asio::io_context there_ctx;
  auto there_pool = pg::Pool::create(there_ctx.get_executor(), test::store_pool_options(4));
  store::PgStore there(there_pool);

  constexpr int kKeys = 128;  // four batches of 32 on each side
  constexpr int kRounds = 4;
  for (int round = 0; round < kRounds; ++round) {
    CAPTURE(round);
    // Here in ascending order; there each block of 32 reversed, so that the two sides'
    // concurrent batches hold the same keys in opposite orders: unless both take the
    // keys' locks in one order, they wait on each other.
    std::vector<ClaimRequest> up, down;
    for (int i = 0; i < kKeys; ++i) {
      char key[32];
      std::snprintf(key, sizeof key, "r%d-key-%03d", round, i);
      up.push_back(claim_req("tenant-a", "POST /orders", key, "fp-here"));
    }
    for (int block = 0; block < kKeys; block += 32) {
      for (int i = block + 31; i >= block; --i) {
        down.push_back(claim_req("tenant-a", "POST /orders", up[i].id.key, "fp-there"));
      }
    }
    std::promise<void> go;
    auto start = go.get_future().share();
    auto there_out = std::async(std::launch::async, [&] {
      std::vector<asio::awaitable<result<ClaimResult>>> calls;
      for (const auto& r : down) calls.push_back(there.claim(r));
      start.wait();
      return all_at_once(there_ctx, std::move(calls));
    });
    std::vector<asio::awaitable<result<ClaimResult>>> calls;
    for (const auto& r : up) calls.push_back(here.claim(r));
    go.set_value();
    auto here_out = all_at_once(h.ctx(), std::move(calls));
    auto there_res = there_out.get();

    std::map<std::string, int> winners;
    for (int i = 0; i < kKeys; ++i) {
      REQUIRE(here_out[i].has_value());
      REQUIRE(there_res[i].has_value());
      if (here_out[i]->won) ++winners[up[i].id.key];
      if (there_res[i]->won) ++winners[down[i].id.key];
    }
    CHECK(winners.size() == static_cast<std::size_t>(kKeys));
    for (const auto& [key, n] : winners) CHECK_MESSAGE(n == 1, key);
    CHECK(count_rows(h.sql(), "idempotency_key LIKE $1", {"r" + std::to_string(round) + "-key-%"}) ==
          kKeys);
  }
  // Both sides batched, and no batch was refused (a deadlock victim's would have been).
  CHECK(here.batch_stats().claim_batches >= static_cast<std::uint64_t>(kRounds * kKeys / 32));
  CHECK(there.batch_stats().claim_batches >= static_cast<std::uint64_t>(kRounds * kKeys / 32));
  CHECK(here.batch_stats().batches_refused == 0);
  CHECK(there.batch_stats().batches_refused == 0);
}

TEST_CASE("batching off: one statement per call") {
  test::PgHarness h;
  store::PgStore s(h.pool(), store::PgStore::ClaimRead::adaptive, {false});
  std::vector<ClaimRequest> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(claim_req("t", "e", "k" + std::to_string(i), "fp"));
  std::vector<asio::awaitable<result<ClaimResult>>> calls;
  for (const auto& r : reqs) calls.push_back(s.claim(r));
  auto out = all_at_once(h.ctx(), std::move(calls));
  for (auto& r : out) CHECK((r.has_value() && r->won));
  CHECK(s.batch_stats().claim_batches == 0);
  CHECK(h.row_count() == 8);
}

namespace {

// The text of one of the store's prepared statements.
std::string statement_sql(const std::string& name) {
  for (const auto& s : store::pg_store_statements()) {
    if (s.name == name) return s.sql;
  }
  FAIL("no statement " << name);
  return {};
}

// What one statement read of the record table (every partition, every index), from the
// transaction's own statistics.
struct Reads {
  std::int64_t index_entries = 0;  // entries read from its indexes
  std::int64_t heap_rows = 0;      // seq_tup_read: rows of sequential scans
  std::size_t tables = 0;          // tables (partitions) scanned at all
  std::int64_t returned = 0;       // the statement's RETURNING rows
};

Reads reads_of(test::Db& db, const std::string& sql, const test::SqlParams& params) {
  const std::string rel = "relname LIKE 'idempotency\\_requests%'";
  db.exec("SELECT pg_stat_force_next_flush()");  // earlier transactions' counters out of the view
  db.exec("BEGIN");
  Reads r;
  r.returned = static_cast<std::int64_t>(db.query(sql, params).size());
  // Index entries read (pg_stat_user_indexes.idx_tup_read, for this transaction only:
  // there is no pg_stat_xact_ view of indexes).
  r.index_entries = db.scalar_int(
      "SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0) FROM pg_index i "
      "JOIN pg_class c ON c.oid = i.indrelid WHERE c." + rel);
  r.heap_rows =
      db.scalar_int("SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables WHERE " + rel);
  r.tables = static_cast<std::size_t>(db.scalar_int(
      "SELECT count(*) FROM pg_stat_xact_user_tables WHERE " + rel +
      " AND seq_scan + coalesce(idx_scan, 0) > 0"));
  db.exec("ROLLBACK");
  return r;
}

std::string array_of(const std::vector<std::string>& items) {
  std::string out = "{";
  for (const auto& i : items) out += (out.size() > 1 ? ",\"" : "\"") + i + "\"";
  return out + "}";
}

}  // namespace

// The batched writes reach rows only by joining the members to the table, which the
// planner costs, and the sidecar runs them as prepared statements, which keep a generic
// plan once they have run often enough. Two traps seen under the benchmark: on a table
// with no statistics yet, or whose statistics say few rows are in progress while the
// in-progress index still holds a dead entry for every row completed since the last
// vacuum, an earlier form scanned that index whole and hashed the members; and a plan
// cached while the table held a few rows (the first seconds after the migrations) scanned
// the table, and kept scanning it as it grew. Either way a batch read thousands of rows
// and new keys fell by two thirds. Each member must instead probe its own key: a few index
// entries per member, no sequential scan, whatever the statistics, the plan mode and the
// table's size when the plan was made. A database of its own: its table has never been
// analyzed, as after the migrations; the session is set up as the store's are.
TEST_CASE("batching: the batched writes probe each member's key, whatever the statistics") {
  test::ScratchDatabase scratch("idem_batch_plans");
  store::apply_migrations(scratch.url(), Millis{5000});
  if (auto parts = test::env("IDEM_TEST_STORE_PARTITIONS"); parts && !parts->empty()) {
    test::partition_store(scratch.url(), *parts);
  }
  test::Db db(scratch.url());
  for (const auto& setting : store::pg_store_session_settings()) {
    db.exec("SELECT set_config($1, $2, false)", {setting.name, setting.value});
  }
  // No autovacuum: it would analyze the table or clean the index while the case runs.
  for (const auto& row :
       db.query("SELECT c.oid::regclass::text FROM pg_class c WHERE c.relname LIKE "
                "'idempotency\\_requests%' AND c.relkind = 'r'")) {
    db.exec("ALTER TABLE " + row.at(0).value() + " SET (autovacuum_enabled = false)");
  }
  const bool partitioned =
      db.scalar("SELECT relkind::text FROM pg_class WHERE oid = 'idempotency_requests'::regclass") ==
      "p";
  // Records of 16 tenants, claimed (in progress) and, with `complete`, then completed (each
  // completion leaves a dead entry in the in-progress index).
  auto add_rows = [&](const std::string& prefix, int n, bool complete) {
    db.exec("INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, "
            "request_fingerprint, state, attempt_token, lease_expires_at, created_at, "
            "expires_at, fencing_token) "
            "SELECT 'plan-' || (g % 16), 'POST /orders', $1 || lpad(g::text, 6, '0'), 'fp', "
            "'in_progress', 1, now() + interval '30 s', now(), now() + interval '1 day', "
            "nextval('idempotency_fencing_tokens') FROM generate_series(1, $2::int) g",
            {prefix, n});
    if (complete) {
      db.exec("UPDATE idempotency_requests SET state = 'completed', completed_at = now(), "
              "lease_expires_at = NULL, response_status = 201 WHERE idempotency_key LIKE $1 || '%'",
              {prefix});
    }
  };
  // 8 members of tenant plan-0, in key order: 4 in progress under their own fence (their
  // writes match), 2 in progress under a wrong fence, 2 completed records.
  auto members = [&](const std::string& open, const std::string& done) {
    std::vector<std::string> keys, fences;
    for (const auto& row : db.query(
             "(SELECT idempotency_key, fencing_token FROM idempotency_requests WHERE tenant_id "
             "= 'plan-0' AND idempotency_key LIKE $1 || '%' ORDER BY idempotency_key LIMIT 6) "
             "UNION ALL (SELECT idempotency_key, fencing_token FROM idempotency_requests WHERE "
             "tenant_id = 'plan-0' AND idempotency_key LIKE $2 || '%' ORDER BY "
             "idempotency_key LIMIT 2)",
             {open, done})) {
      keys.push_back(row.at(0).value());
      fences.push_back(keys.size() <= 4 ? row.at(1).value() : "1");
    }
    REQUIRE(keys.size() == 8);
    return std::pair{array_of(keys), array_of(fences)};
  };
  auto filled = [](const std::string& v) { return array_of(std::vector<std::string>(8, v)); };
  auto quoted = [](const std::string& v) {
    std::string out = "'";
    for (char c : v) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
  };
  // The four writes as the store sends them: prepared once, then executed.
  const std::string by_row = "idem_complete_by_row_batch";
  const std::vector<std::string> names = {"idem_complete_batch", by_row, "idem_release_batch",
                                          "idem_renew_batch"};
  for (const auto& name : names) db.exec("PREPARE " + name + " AS " + statement_sql(name));
  // The members' row addresses, as their claims returned them (kCompleteByRowBatchSql).
  auto addresses = [&](const std::string& keys) {
    return db.scalar("SELECT array_agg(r.ctid::text ORDER BY u.n) FROM unnest($1::text[]) "
                     "WITH ORDINALITY AS u(k, n) LEFT JOIN idempotency_requests r ON r.tenant_id = "
                     "'plan-0' AND r.endpoint = 'POST /orders' AND r.idempotency_key = u.k",
                     {keys}).value();
  };
  auto execute = [&](const std::string& name, const std::pair<std::string, std::string>& m) {
    std::vector<std::string> args = {filled("plan-0"), filled("POST /orders"), m.first, m.second};
    if (name == "idem_complete_batch" || name == by_row) {
      for (const auto& v : {filled("201"), filled("[]"), filled(""), filled("false"), filled(""),
                            filled("3600000"), filled("")}) {
        args.push_back(v);
      }
      if (name == by_row) args.push_back(addresses(m.first));
    } else if (name == "idem_renew_batch") {
      args.push_back(filled("30000"));
    }
    std::string sql = "EXECUTE " + name + "(";
    for (std::size_t i = 0; i < args.size(); ++i) sql += (i ? ", " : "") + quoted(args[i]);
    return sql + ")";
  };
  // A young table: 48 rows. Each write runs ten times (rolled back), so that the plan cache
  // makes and keeps its generic plan here, as the sidecar's sessions do in their first
  // seconds.
  add_rows("young-", 48, false);
  std::vector<std::string> young_keys;
  for (int i = 0; i < 8; ++i) young_keys.push_back("young-00000" + std::to_string(i));
  const std::pair young{array_of(young_keys), filled("1")};
  for (int i = 0; i < 10; ++i) {
    for (const auto& name : names) {
      db.exec("BEGIN");
      db.query(execute(name, young));
      db.exec("ROLLBACK");
    }
  }
  // Then the table grows: 6 000 completed records, and 16 of plan-0 in progress.
  add_rows("done-", 6000, true);
  add_rows("open-", 256, false);
  const auto grown = members("open-", "done-");
  auto check_all = [&](const std::string& stats, bool analyzed) {
    for (const char* mode : {"auto", "force_custom_plan", "force_generic_plan"}) {
      db.exec("SELECT set_config('plan_cache_mode', $1, false)", {std::string(mode)});
      for (const auto& name : names) {
        INFO(name << ", plan_cache_mode " << std::string(mode) << ", " << stats);
        const Reads r = reads_of(db, execute(name, grown), {});
        CHECK(r.returned == 4);           // each member its own answer
        CHECK(r.heap_rows == 0);          // no sequential scan
        CHECK(r.index_entries <= 8 * 3);  // a probe per member (a dead version at most)
        if (name == by_row) {
          // Straight to each row's address (a TID scan, which the statistics count as
          // neither an index nor a sequential scan), once the table has statistics: a
          // generic plan made on the never-analyzed young table probes the primary key
          // instead (correct, only not faster), until an analyze replans it.
          if (analyzed) CHECK(r.index_entries == 0);
          if (partitioned) CHECK(r.tables <= 1);
        } else if (partitioned) {
          CHECK(r.tables == 1);  // plan-0's partition only
        }
      }
    }
    db.exec("SELECT set_config('plan_cache_mode', 'auto', false)");
  };
  check_all("never analyzed, plans made on 48 rows", false);
  db.exec("ANALYZE idempotency_requests");
  // Statistics now say few rows are in progress; 3 000 more completions leave their dead
  // entries in the in-progress index, as between two vacuums.
  add_rows("later-", 3000, true);
  check_all("analyzed before 3 000 more completions", true);

  // The completion alone at its row's address (kCompleteByRowSql): a TID scan, no index
  // entry read, in either plan mode; at a wrong address (the row moved), nothing written.
  db.exec("PREPARE idem_complete_by_row AS " + statement_sql("idem_complete_by_row"));
  const auto open_row = db.query("SELECT idempotency_key, fencing_token::text, ctid::text FROM "
                                 "idempotency_requests WHERE tenant_id = 'plan-0' AND "
                                 "idempotency_key LIKE 'open-%' ORDER BY idempotency_key LIMIT 1");
  REQUIRE(open_row.size() == 1);
  auto execute_one = [&](const std::string& address) {
    std::string sql = "EXECUTE idem_complete_by_row('plan-0', 'POST /orders', " +
                      quoted(open_row[0].at(0).value()) + ", " + open_row[0].at(1).value() +
                      ", 201, '[]', '', false, '', 3600000, '', " + quoted(address) + ")";
    return sql;
  };
  for (const char* mode : {"force_custom_plan", "force_generic_plan"}) {
    db.exec("SELECT set_config('plan_cache_mode', $1, false)", {std::string(mode)});
    INFO("idem_complete_by_row, plan_cache_mode " << std::string(mode));
    const Reads at = reads_of(db, execute_one(open_row[0].at(2).value()), {});
    CHECK(at.returned == 1);
    CHECK(at.heap_rows == 0);
    CHECK(at.index_entries == 0);
    if (partitioned) CHECK(at.tables <= 1);
    const Reads elsewhere = reads_of(db, execute_one("(0,1)"), {});
    CHECK(elsewhere.returned == 0);
    CHECK(elsewhere.index_entries == 0);
  }
  db.exec("SELECT set_config('plan_cache_mode', 'auto', false)");
}

// The batched statements walk their arrays in step in a subquery's select list (a
// ProjectSet), never as `unnest($1, $2, ...)` in FROM, whose function scan fills a
// tuplestore per array before its first row: 4–5 % of PostgreSQL's instructions per
// write cycle (docs/performance.md, "The batches' arrays in step"). Each statement's
// generic plan, for a batch of one.
TEST_CASE("batching: the batched statements unnest their arrays without a function scan") {
  test::ScratchDatabase scratch("idem_batch_unnest");
  store::apply_migrations(scratch.url(), Millis{5000});
  test::Db db(scratch.url());
  for (const auto& setting : store::pg_store_session_settings()) {
    db.exec("SELECT set_config($1, $2, false)", {setting.name, setting.value});
  }
  static const std::regex param(R"(\$([0-9]+)::(\w+)\[\])");
  std::size_t batched = 0;
  for (const auto& statement : store::pg_store_statements()) {
    if (statement.sql.find("unnest(") == std::string::npos) continue;
    ++batched;
    std::map<int, std::string> args;  // $n -> a one-element array literal of its type
    for (auto it = std::sregex_iterator(statement.sql.begin(), statement.sql.end(), param);
         it != std::sregex_iterator(); ++it) {
      args[std::stoi((*it)[1].str())] = (*it)[2].str() == "tid" ? "'{\"(0,1)\"}'" : "'{1}'";
    }
    REQUIRE(!args.empty());
    REQUIRE(args.rbegin()->first == static_cast<int>(args.size()));  // every $n an array
    std::string execute = "EXPLAIN (COSTS OFF) EXECUTE " + statement.name + "(";
    for (const auto& [n, literal] : args) execute += (n > 1 ? ", " : "") + literal;
    db.exec("PREPARE " + statement.name + " AS " + statement.sql);
    std::string plan;
    db.exec("BEGIN");
    for (const auto& row : db.query(execute + ")")) plan += row.at(0).value_or("") + "\n";
    db.exec("ROLLBACK");
    INFO(statement.name << ":\n" << plan);
    CHECK(plan.find("ProjectSet") != std::string::npos);
    CHECK(plan.find("Function Scan") == std::string::npos);
  }
  CHECK(batched == 6);  // claim, read, completion by key and by row, release, renewal
}

namespace {

// The home loop of a shared set of batchers, on a thread of its own, held at a barrier
// while the test queues work on both loops: released, it finds every call already posted,
// so they all leave in one batch.
class HeldHome {
 public:
  explicit HeldHome(asio::io_context& ctx) : ctx_(ctx), guard_(asio::make_work_guard(ctx)) {
    ctx_.restart();
    thread_ = std::thread([this] { ctx_.run(); });
    std::promise<void> entered;
    auto held = entered.get_future();
    asio::post(ctx_, [&entered, release = release_.get_future()]() mutable {
      entered.set_value();
      release.wait();
    });
    held.wait();
  }
  void release() { release_.set_value(); }
  ~HeldHome() {
    guard_.reset();
    thread_.join();
  }

 private:
  asio::io_context& ctx_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::promise<void> release_;
  std::thread thread_;
};

store::PgBatching every_call_batched() {
  store::PgBatching b;
  b.lone_calls_batched = true;  // so that batch_stats() counts every call
  return b;
}

// A home store on the harness's loop and a store on a second loop sharing its batchers
// (as worker 0 and worker 1 of one process).
struct TwoLoops {
  TwoLoops(store::PgStore::ClaimRead read, store::PgBatching batching)
      : home(h.pool(), read, std::move(batching)),
        there_pool(pg::Pool::create(there_ctx.get_executor(), test::store_pool_options(2))),
        remote(there_pool, read, home) {}
  test::PgHarness h;
  store::PgStore home;
  asio::io_context there_ctx;
  std::shared_ptr<pg::Pool> there_pool;
  store::PgStore remote;
};

}  // namespace

TEST_CASE("batching: the calls of two event loops share one batch (one set of batchers per process)") {
  TwoLoops loops(store::PgStore::ClaimRead::always, every_call_batched());
  auto& [h, home, there_ctx, there_pool, remote] = loops;

  // Keys 0-7 claimed on both loops (home's queued first: home wins them), 8-15 only here,
  // 16-23 only there.
  std::vector<ClaimRequest> here_reqs, there_reqs;
  auto key = [](int i) { return "loop-key-" + std::to_string(i); };
  for (int i = 0; i < 16; ++i) here_reqs.push_back(claim_req("tenant-a", "POST /orders", key(i), "fp-here"));
  for (int i : {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}) {
    there_reqs.push_back(claim_req("tenant-a", "POST /orders", key(i), "fp-there"));
  }
  std::vector<std::future<result<ClaimResult>>> here_out, there_out;
  {
    HeldHome held(h.ctx());
    for (const auto& r : here_reqs) {
      here_out.push_back(asio::co_spawn(h.ctx(), home.claim(r), asio::use_future));
    }
    for (const auto& r : there_reqs) {
      there_out.push_back(asio::co_spawn(there_ctx, remote.claim(r), asio::use_future));
    }
    there_ctx.poll();  // every remote call has posted its slot to the (held) home loop
    held.release();
    there_ctx.restart();
    there_ctx.run();  // until the home loop has woken every remote caller
    for (auto& f : here_out) f.wait();
  }

  // One statement and one commit for the calls of both loops; none on the remote side.
  CHECK(home.batch_stats().claim_batches == 1);
  CHECK(home.batch_stats().claims_batched == 32);
  CHECK(remote.batch_stats().claim_batches == 0);

  std::map<std::string, std::vector<std::string>> winners;  // key -> fingerprints that won
  for (std::size_t i = 0; i < here_out.size(); ++i) {
    auto r = here_out[i].get();
    REQUIRE(r.has_value());
    CHECK(r->won);
    winners[here_reqs[i].id.key].push_back("fp-here");
  }
  for (std::size_t i = 0; i < there_out.size(); ++i) {
    CAPTURE(i);
    auto r = there_out[i].get();
    REQUIRE(r.has_value());
    if (i < 8) {
      // Lost to home's claim of the same key, with home's row read along.
      CHECK_FALSE(r->won);
      REQUIRE(r->row.has_value());
      CHECK(r->row->fingerprint == "fp-here");
    } else {
      CHECK(r->won);
      winners[there_reqs[i].id.key].push_back("fp-there");
    }
  }
  CHECK(winners.size() == 24);
  for (const auto& [k, fps] : winners) CHECK_MESSAGE(fps.size() == 1, k);
  CHECK(h.row_count() == 24);
  CHECK(count_rows(h.sql(), "request_fingerprint = 'fp-there'", {}) == 8);
  CHECK(count_rows(h.sql(), "request_fingerprint = 'fp-here'", {}) == 16);
}

TEST_CASE("batching: a remote caller cancelled while queued leaves the batch; the others are answered") {
  TwoLoops loops(store::PgStore::ClaimRead::never, every_call_batched());
  auto& [h, home, there_ctx, there_pool, remote] = loops;

  const auto kept = claim_req("tenant-a", "POST /orders", "kept", "fp");
  const auto gone = claim_req("tenant-a", "POST /orders", "gone", "fp");
  asio::cancellation_signal cancel;
  std::future<result<ClaimResult>> kept_out, gone_out;
  {
    HeldHome held(h.ctx());
    kept_out = asio::co_spawn(there_ctx, remote.claim(kept), asio::use_future);
    gone_out = asio::co_spawn(there_ctx, remote.claim(gone),
                              asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
    there_ctx.poll();  // both slots posted to the held home loop
    cancel.emit(asio::cancellation_type::terminal);
    there_ctx.poll();  // the cancelled caller returns and posts its slot's removal
    REQUIRE(gone_out.wait_for(0s) == std::future_status::ready);
    held.release();
    there_ctx.restart();
    there_ctx.run();
  }
  auto g = gone_out.get();
  REQUIRE_FALSE(g.has_value());
  // What a call cancelled in flight gets (pg::to_store_errc folds `cancelled` into it).
  CHECK(g.error() == make_error_code(errc::store_timeout));
  auto k = kept_out.get();
  REQUIRE(k.has_value());
  CHECK(k->won);
  // The batch carried only the call still waiting: no row for the cancelled one.
  CHECK(home.batch_stats().claims_batched == 1);
  CHECK(count_rows(h.sql(), "idempotency_key = 'gone'", {}) == 0);
  CHECK(count_rows(h.sql(), "idempotency_key = 'kept'", {}) == 1);
}

TEST_CASE("batching: completions and releases from another loop are answered by their own write") {
  TwoLoops loops(store::PgStore::ClaimRead::never, every_call_batched());
  auto& [h, home, there_ctx, there_pool, remote] = loops;

  // Three records claimed at home; completed and released from the remote loop while the
  // home loop runs on its own thread.
  std::vector<ClaimRequest> reqs;
  std::vector<std::int64_t> fences;
  for (const char* k : {"c1", "c2", "r1"}) {
    reqs.push_back(claim_req("tenant-a", "POST /orders", k, "fp"));
    auto won = h.run(home.claim(reqs.back()));
    REQUIRE(won.has_value());
    REQUIRE(won->won);
    fences.push_back(won->owner.fence);
  }
  const auto one = response(201, "1"), two = response(201, "2"), other = response(201, "x");
  std::future<result<Completed>> c1, c2, stale;
  std::future<result<bool>> r1;
  {
    HeldHome held(h.ctx());
    c1 = asio::co_spawn(there_ctx, remote.complete(reqs[0].id, fences[0], one, 1h),
                        asio::use_future);
    c2 = asio::co_spawn(there_ctx, remote.complete(reqs[1].id, fences[1], two, 1h),
                        asio::use_future);
    stale = asio::co_spawn(there_ctx, remote.complete(reqs[1].id, fences[1] + 1000, other, 1h),
                           asio::use_future);
    r1 = asio::co_spawn(there_ctx, remote.release(reqs[2].id, fences[2]), asio::use_future);
    there_ctx.poll();
    held.release();
    there_ctx.restart();
    there_ctx.run();
  }
  CHECK(c1.get().value().outcome == Completion::recorded);
  CHECK(c2.get().value().outcome == Completion::recorded);
  CHECK(stale.get().value().outcome != Completion::recorded);  // not its fence
  CHECK(r1.get().value());
  CHECK(home.batch_stats().completions_batched >= 2);
  CHECK(home.batch_stats().releases_batched == 1);
  CHECK(count_rows(h.sql(), "idempotency_key = 'c1' AND state = 'completed' AND response_body = '1'", {}) == 1);
  CHECK(count_rows(h.sql(), "idempotency_key = 'c2' AND state = 'completed' AND response_body = '2'", {}) == 1);
  CHECK(count_rows(h.sql(), "idempotency_key = 'r1'", {}) == 0);
}

TEST_CASE("batching: a remote call that finds the batcher idle runs alone on its own loop") {
  // The product's batching: a lone call keeps its statement.
  TwoLoops loops(store::PgStore::ClaimRead::adaptive, store::PgBatching{});
  auto& [h, home, there_ctx, there_pool, remote] = loops;

  // The home loop never runs here: a call that went through it would never be answered.
  // (run_for only bounds the wait of a broken build; a working one returns as soon as the
  // call is done.)
  auto on_there = [&](auto call) {
    auto f = asio::co_spawn(there_ctx, std::move(call), asio::use_future);
    there_ctx.restart();
    there_ctx.run_for(30s);
    REQUIRE(f.wait_for(0s) == std::future_status::ready);
    return f.get();
  };
  const auto req = claim_req("tenant-a", "POST /orders", "idle", "fp");
  auto won = on_there(remote.claim(req));
  REQUIRE(won.has_value());
  CHECK(won->won);
  const auto answer = response(201, "9");
  auto done = on_there(remote.complete(req.id, won->owner.fence, answer, 1h));
  CHECK(done.value().outcome == Completion::recorded);
  CHECK(count_rows(h.sql(), "idempotency_key = 'idle' AND state = 'completed'", {}) == 1);
  CHECK(home.batch_stats().claim_batches == 0);
}

TEST_CASE("batching: an answer over 256 KiB is completed by its own statement, byte for byte") {
  test::PgHarness h;
  store::PgStore s(h.pool(), store::PgStore::ClaimRead::never, every_call_batched());
  std::vector<ClaimRequest> reqs;
  std::vector<std::int64_t> fences;
  for (const char* k : {"small", "large"}) {
    reqs.push_back(claim_req("tenant-a", "POST /orders", k, "fp"));
    auto won = h.run(s.claim(reqs.back()));
    REQUIRE(won.has_value());
    REQUIRE(won->won);
    fences.push_back(won->owner.fence);
  }
  const auto small = response(201, "1");
  auto large = response(201, std::string((256u << 10) + 1, 'x'));
  large.body[1000] = '\0';  // bytes, not text
  std::vector<asio::awaitable<result<Completed>>> calls;
  calls.push_back(s.complete(reqs[0].id, fences[0], small, 1h));
  calls.push_back(s.complete(reqs[1].id, fences[1], large, 1h));
  auto out = all_at_once(h.ctx(), std::move(calls));
  CHECK(out[0].value().outcome == Completion::recorded);
  CHECK(out[1].value().outcome == Completion::recorded);
  // Only the small one went through the batch statement.
  CHECK(s.batch_stats().completions_batched == 1);
  CHECK(count_rows(h.sql(), "idempotency_key = 'large' AND state = 'completed' AND response_body = $1::bytea",
                   {"\\x" + [&] {
                      std::string hex;
                      for (unsigned char c : large.body) {
                        static const char* d = "0123456789abcdef";
                        hex += d[c >> 4];
                        hex += d[c & 15];
                      }
                      return hex;
                    }()}) == 1);
}

// The batched completion reaches each row at the address its batched claim returned
// (kCompleteByRowBatchSql) instead of descending the primary key. The address is only a
// hint: a row that moved since its claim (renewed through the store, or rewritten behind
// its back) is completed by its key, and one another owner took over stays fenced.
TEST_CASE("batching: completions go to their claims' row addresses; a moved row is completed by its key") {
  test::PgHarness h;
  store::PgStore s(h.pool(), store::PgStore::ClaimRead::never, every_call_batched());
  const std::vector<ClaimRequest> reqs = {
      claim_req("tenant-a", "POST /orders", "a", "fp-a"),
      claim_req("tenant-a", "POST /orders", "b", "fp-b"),
      claim_req("tenant-b", "POST /orders", "c", "fp-c"),
      claim_req("tenant-b", "POST /orders", "d", "fp-d"),
  };
  std::vector<asio::awaitable<result<ClaimResult>>> claims;
  for (const auto& r : reqs) claims.push_back(s.claim(r));
  auto won = all_at_once(h.ctx(), std::move(claims));
  REQUIRE(s.batch_stats().claim_batches == 1);
  std::vector<std::int64_t> fence;
  for (auto& w : won) {
    REQUIRE(w.has_value());
    REQUIRE(w->won);
    fence.push_back(w->owner.fence);
  }
  const RecordId& a = reqs[0].id;
  const RecordId& b = reqs[1].id;
  const RecordId& c = reqs[2].id;
  const RecordId& d = reqs[3].id;
  // b: renewed through the store, which then forgets its old address.
  REQUIRE(h.run(s.renew(b, fence[1], 30s)).value());
  // c: a new version of its row, written behind the store's back (what a table rewrite
  // or another session's update does): the store's address for it is stale.
  const auto ctid = [&](const RecordId& id) {
    return h.sql().scalar("SELECT ctid::text FROM idempotency_requests WHERE tenant_id = $1"
                          " AND endpoint = $2 AND idempotency_key = $3",
                          {id.tenant, id.endpoint, id.key});
  };
  const auto c_was = ctid(c);
  h.sql().exec("UPDATE idempotency_requests SET lease_expires_at = lease_expires_at + interval '1 ms'"
               " WHERE idempotency_key = 'c'");
  REQUIRE(ctid(c) != c_was);
  // d: taken over by another owner (a new fence), its row moved too.
  h.sql().exec("UPDATE idempotency_requests SET fencing_token = nextval('idempotency_fencing_tokens'),"
               " attempt_token = attempt_token + 1 WHERE idempotency_key = 'd'");
  const auto d_before = h.snapshot(d);

  const auto ra = response(201, "1"), rb = response(201, "2"), rc = response(201, "3"),
             rd = response(201, "4");
  std::vector<asio::awaitable<result<Completed>>> calls;
  calls.push_back(s.complete(a, fence[0], ra, 1h));
  calls.push_back(s.complete(b, fence[1], rb, 1h));
  calls.push_back(s.complete(c, fence[2], rc, 1h));
  calls.push_back(s.complete(d, fence[3], rd, 1h));
  auto out = all_at_once(h.ctx(), std::move(calls));

  CHECK(s.batch_stats().completion_batches == 1);
  CHECK(s.batch_stats().completions_batched == 4);
  CHECK(s.batch_stats().completions_by_row == 3);  // a, c, d; b's address was dropped
  CHECK(s.batch_stats().completions_moved == 2);   // c and d were not at their address
  // ... and then ran alone by their key, not to the address that missed once already.
  CHECK(s.batch_stats().completions_alone_by_row == 0);
  for (auto& r : out) REQUIRE(r.has_value());
  CHECK(out[0]->outcome == Completion::recorded);
  CHECK(out[1]->outcome == Completion::recorded);
  CHECK(out[2]->outcome == Completion::recorded);
  CHECK(out[3]->outcome == Completion::fenced);
  CHECK(completed_with(h.sql(), a, fence[0], ra) == 1);
  CHECK(completed_with(h.sql(), b, fence[1], rb) == 1);
  CHECK(completed_with(h.sql(), c, fence[2], rc) == 1);
  CHECK(h.snapshot(d) == d_before);  // the stale owner wrote nothing
  CHECK(h.row_count() == 4);
}

// A call that runs alone (one connection's traffic, or batching off) does the same: the
// single claim returns its row's address (kClaimSql) and the single completion goes there
// (kCompleteByRowSql). A row that moved since is completed by its key; one another owner
// took over stays fenced, and the address is forgotten once it missed.
TEST_CASE("batching: a completion alone goes to its claim's row address; a moved row by its key") {
  for (const bool batching : {true, false}) {
    for (const auto read : {store::PgStore::ClaimRead::never, store::PgStore::ClaimRead::always}) {
      INFO("batching " << batching << ", read along " << (read == store::PgStore::ClaimRead::always));
      test::PgHarness h;
      store::PgBatching config;
      config.enabled = batching;
      store::PgStore s(h.pool(), read, config);
      std::vector<RecordId> ids;
      std::vector<std::int64_t> fence;
      for (const char* key : {"a", "c", "d"}) {
        auto won = h.run(s.claim(claim_req("tenant-a", "POST /orders", key, "fp")));
        REQUIRE(won.has_value());
        REQUIRE(won->won);
        ids.push_back(RecordId{"tenant-a", "POST /orders", key});
        fence.push_back(won->owner.fence);
      }
      CHECK(s.batch_stats().claim_batches == 0);  // every claim alone
      // c: a new version of its row, written behind the store's back; d: taken over.
      h.sql().exec("UPDATE idempotency_requests SET lease_expires_at = lease_expires_at + "
                   "interval '1 ms' WHERE idempotency_key = 'c'");
      h.sql().exec("UPDATE idempotency_requests SET fencing_token = "
                   "nextval('idempotency_fencing_tokens'), attempt_token = attempt_token + 1 "
                   "WHERE idempotency_key = 'd'");
      const auto d_before = h.snapshot(ids[2]);

      const auto ra = response(201, "1"), rc = response(201, "3"), rd = response(201, "4");
      auto a = h.run(s.complete(ids[0], fence[0], ra, 1h));
      CHECK(s.batch_stats().completions_alone_by_row == 1);
      CHECK(s.batch_stats().completions_alone_moved == 0);
      auto c = h.run(s.complete(ids[1], fence[1], rc, 1h));
      CHECK(s.batch_stats().completions_alone_by_row == 2);
      CHECK(s.batch_stats().completions_alone_moved == 1);
      auto d = h.run(s.complete(ids[2], fence[2], rd, 1h));
      CHECK(s.batch_stats().completions_alone_by_row == 3);
      CHECK(s.batch_stats().completions_alone_moved == 2);
      CHECK(s.batch_stats().completion_batches == 0);
      REQUIRE(a.has_value());
      REQUIRE(c.has_value());
      REQUIRE(d.has_value());
      CHECK(a->outcome == Completion::recorded);
      CHECK(c->outcome == Completion::recorded);
      CHECK(d->outcome == Completion::fenced);
      CHECK(completed_with(h.sql(), ids[0], fence[0], ra) == 1);
      CHECK(completed_with(h.sql(), ids[1], fence[1], rc) == 1);
      CHECK(h.snapshot(ids[2]) == d_before);  // the stale owner wrote nothing
      CHECK(h.row_count() == 3);
      // Completing a again (a retry whose first try committed): recorded before. Its claim
      // is no longer held, so this goes by key.
      auto again = h.run(s.complete(ids[0], fence[0], ra, 1h));
      REQUIRE(again.has_value());
      CHECK(again->outcome == Completion::already_recorded);
      CHECK(s.batch_stats().completions_alone_by_row == 3);
    }
  }
}

// The store's sessions run every prepared statement on its generic plan. Left to choose,
// a session that first ran small batches keeps planning the batched completion anew in
// every write cycle (its custom plans look cheaper than a generic plan estimated for ten
// members), for as long as it lives: a seventh of PostgreSQL's CPU under load
// (pg_store_session_settings()). One session, small batches first, then larger ones: no
// statement made a custom plan.
TEST_CASE("batching: the store's sessions plan each statement once, whatever batches came first") {
  test::PgHarness h;
  auto pool = pg::Pool::create(h.ctx().get_executor(), test::store_pool_options(1));
  store::PgStore s(pool, store::PgStore::ClaimRead::never, every_call_batched());
  int next = 0;
  for (const std::size_t size : {2, 2, 3, 2, 2, 3, 2, 9, 9, 9, 9, 9}) {
    std::vector<ClaimRequest> reqs;
    for (std::size_t i = 0; i < size; ++i) {
      reqs.push_back(claim_req("tenant-p", "POST /orders", "p" + std::to_string(next++), "fp"));
    }
    std::vector<asio::awaitable<result<ClaimResult>>> claims;
    for (const auto& r : reqs) claims.push_back(s.claim(r));
    auto won = all_at_once(h.ctx(), std::move(claims));
    std::vector<asio::awaitable<result<Completed>>> completions;
    const auto answer = response(201, "x");
    for (std::size_t i = 0; i < size; ++i) {
      REQUIRE(won[i].has_value());
      REQUIRE(won[i]->won);
      completions.push_back(s.complete(reqs[i].id, won[i]->owner.fence, answer, 1h));
    }
    for (auto& c : all_at_once(h.ctx(), std::move(completions))) {
      REQUIRE(c.has_value());
      CHECK(c->outcome == Completion::recorded);
    }
  }
  CHECK(s.batch_stats().completions_by_row == static_cast<std::uint64_t>(next));
  auto plans = h.run(pool->query(
      "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
      "WHERE name IN ('idem_claim_batch', 'idem_complete_by_row_batch') ORDER BY name"));
  REQUIRE(plans.has_value());
  REQUIRE(plans->rows() == 2);
  for (int row = 0; row < plans->rows(); ++row) {
    INFO(plans->value(row, 0) << ": " << plans->value(row, 1) << " generic, "
                              << plans->value(row, 2) << " custom plans");
    CHECK(plans->int64(row, 1).value_or(0) == 12);  // one per cycle, all generic
    CHECK(plans->int64(row, 2).value_or(-1) == 0);
  }
}
