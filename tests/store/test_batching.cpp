// Group commit in PgStore (database.batching): real concurrent calls that leave as one
// batch, and what each member gets. Every case checks the rows in PostgreSQL, not only
// the answers, and that the calls really shared a statement (PgStore::batch_stats()).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <future>
#include <map>
#include <set>
#include <thread>

#include <boost/asio/co_spawn.hpp>
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
  auto completed_with = [&](const RecordId& id, std::int64_t fence, const store::StoredResponse& r) {
    return count_rows(h.sql(),
                      "tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3"
                      " AND fencing_token = $4::bigint AND state = 'completed'"
                      " AND response_status = $5::integer AND response_body = convert_to($6, 'UTF8')"
                      " AND resource_id = $6 AND lease_expires_at IS NULL",
                      {id.tenant, id.endpoint, id.key, std::to_string(fence),
                       std::to_string(r.status), r.body});
  };
  CHECK(completed_with(a, fa, ra) == 1);
  CHECK(completed_with(c, fc, rc) == 1);
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
