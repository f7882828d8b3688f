// One conformance suite for the Store interface, run against MemoryStore (fake clock) and
// PgStore (real PostgreSQL). Every case states the semantics of store.hpp; an
// implementation passes only if it behaves identically. Time moves only by advance().
#include <doctest/doctest.h>

#include <future>
#include <type_traits>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>

#include "store/harness.hpp"

using namespace idem;
using namespace std::chrono_literals;
using store::ClaimRequest;
using store::RecordId;
using store::State;
using store::StoredResponse;

namespace {

RecordId rid(std::string key = "key-1", std::string tenant = "tenant-a",
             std::string endpoint = "POST /orders") {
  return {std::move(tenant), std::move(endpoint), std::move(key)};
}

ClaimRequest claim_req(RecordId id, std::string fingerprint = "fp-1", Millis lease = 30s,
                       Millis retention = 1h, std::string principal = "") {
  ClaimRequest r;
  r.id = std::move(id);
  r.fingerprint = std::move(fingerprint);
  r.principal = std::move(principal);
  r.lease = lease;
  r.retention = retention;
  return r;
}

std::string all_bytes() {
  std::string b;
  for (int i = 0; i < 256; ++i) b.push_back(static_cast<char>(i));
  b += std::string("\0\0end\0", 6);
  return b;
}

StoredResponse sample_response() {
  StoredResponse r;
  r.status = 201;
  r.headers = {
      {"Content-Type", "application/json"},
      {"Set-Cookie", "a=1"},
      {"Location", "/orders/42"},
      {"Set-Cookie", "b=2"},                       // a repeat, after another header
      {"X-Unicode", "caf\xc3\xa9 \xe2\x9c\x93"},   // valid UTF-8
      {"X-Obs-Text", "caf\xe9"},                   // Latin-1 byte: not UTF-8
      {"X-Escapes", "q=\"x\" \\ tab\there"},
  };
  r.body = all_bytes();
  r.resource_id = "42";
  return r;
}

constexpr std::int64_t us(Millis d) { return d.count() * 1000; }

// Claims and returns the winner's ownership (fencing tokens come from a sequence shared by
// every key, so a test never knows a token's value in advance, only how tokens compare).
// The fencing token of the claim that holds the record now.
template <class H>
std::int64_t fence_of(H& h, const RecordId& id) {
  auto r = h.run(h.store().read(id));
  REQUIRE(r.has_value());
  REQUIRE(r->has_value());
  return (*r)->fence;
}

template <class H>
store::Ownership claim_won(H& h, const ClaimRequest& req) {
  auto r = h.run(h.store().claim(req));
  REQUIRE(r.has_value());
  REQUIRE(r->won);
  return r->owner;
}

template <class H>
constexpr bool is_pg = std::is_same_v<H, test::PgHarness>;

// Runs n store calls at once on the harness's io_context and returns their results.
template <class H, class MakeCall>
auto run_concurrently(H& h, int n, MakeCall make_call) {
  using Awaitable = decltype(make_call(0));
  using T = typename Awaitable::value_type;
  std::vector<std::future<T>> futures;
  for (int i = 0; i < n; ++i) {
    futures.push_back(asio::co_spawn(h.ctx(), make_call(i), asio::use_future));
  }
  h.ctx().restart();
  h.ctx().run();
  std::vector<T> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

}  // namespace

#define STORES test::MemoryHarness, test::PgHarness, test::PgBatchedHarness

TEST_CASE_TEMPLATE("claim: the first wins with attempt 1, later claims lose", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid());
  auto first = h.run(s.claim(req));
  REQUIRE(first.has_value());
  CHECK(first->won);
  CHECK(first->owner.attempt == 1);
  CHECK(first->owner.fence > 0);
  const std::string before = h.snapshot(req.id);

  auto other = claim_req(rid(), "fp-other", 99s, 2h, "someone");
  auto second = h.run(s.claim(other));
  REQUIRE(second.has_value());
  CHECK_FALSE(second->won);
  CHECK(h.snapshot(req.id) == before);  // the loser changed nothing
  CHECK(h.row_count() == 1);
}

TEST_CASE_TEMPLATE("read: a claimed row as the loser sees it", H, STORES) {
  H h;
  auto& s = h.store();
  auto none = h.run(s.read(rid()));
  REQUIRE(none.has_value());
  CHECK_FALSE(none->has_value());

  const auto req = claim_req(rid(), "fp-1", 30s, 1h, "principal-hash");
  const auto owner = claim_won(h, req);
  auto r = h.run(s.read(req.id));
  REQUIRE(r.has_value());
  REQUIRE(r->has_value());
  const store::Record& rec = **r;
  CHECK(rec.fingerprint == "fp-1");
  CHECK(rec.principal == "principal-hash");
  CHECK(rec.state == State::in_progress);
  CHECK(rec.attempt == 1);
  CHECK(rec.fence == owner.fence);
  CHECK_FALSE(rec.lease_expired);
  CHECK_FALSE(rec.expired);
  CHECK(rec.lease_remaining > 29s);
  CHECK(rec.lease_remaining <= 30s);
  CHECK_FALSE(rec.response.has_value());
  CHECK(rec.created_at_us > 0);
  CHECK(rec.completed_at_us == 0);
  CHECK(rec.lease_expires_at_us - rec.created_at_us == us(30s));
  CHECK(rec.expires_at_us - rec.created_at_us == us(1h));
}

TEST_CASE_TEMPLATE("complete then read: the stored response round-trips exactly", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid());
  const auto owner = claim_won(h, req);
  const StoredResponse resp = sample_response();
  auto done = h.run(s.complete(req.id, owner.fence, resp, 2h));
  REQUIRE(done.has_value());
  CHECK(*done == store::Completion::recorded);

  auto r = h.run(s.read(req.id));
  REQUIRE(r.has_value());
  REQUIRE(r->has_value());
  const store::Record& rec = **r;
  CHECK(rec.state == State::completed);
  CHECK(rec.attempt == 1);
  CHECK(rec.fence == owner.fence);  // the completed record names the claim that completed it
  CHECK_FALSE(rec.lease_expired);
  CHECK_FALSE(rec.expired);
  CHECK(rec.lease_remaining == 0ms);
  CHECK(rec.lease_expires_at_us == 0);
  CHECK(rec.completed_at_us >= rec.created_at_us);
  CHECK(rec.expires_at_us - rec.completed_at_us == us(2h));
  REQUIRE(rec.response.has_value());
  const StoredResponse& got = *rec.response;
  CHECK(got.status == 201);
  CHECK(got.body == resp.body);  // all 256 byte values and NULs
  CHECK(got.body.size() == 262);
  CHECK_FALSE(got.body_omitted);
  CHECK(got.resource_id == "42");
  REQUIRE(got.headers.size() == resp.headers.size());
  for (std::size_t i = 0; i < resp.headers.size(); ++i) {
    CAPTURE(i);
    CHECK(got.headers[i].name == resp.headers[i].name);    // order and repeats kept
    CHECK(got.headers[i].value == resp.headers[i].value);  // bytes kept
  }
}

TEST_CASE_TEMPLATE("complete: an omitted body, no headers and no resource id", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid());
  const auto owner = claim_won(h, req);
  StoredResponse resp;
  resp.status = 200;
  resp.body_omitted = true;
  auto done = h.run(s.complete(req.id, owner.fence, resp, 1h));
  REQUIRE(done.has_value());
  CHECK(*done == store::Completion::recorded);
  // Retried with the same answer (an omitted body compares as stored): already recorded.
  CHECK(h.run(s.complete(req.id, owner.fence, resp, 1h)).value() ==
        store::Completion::already_recorded);
  auto r = h.run(s.read(req.id));
  REQUIRE(r.has_value());
  REQUIRE(r->has_value());
  REQUIRE((*r)->response.has_value());
  const auto& got = *(*r)->response;
  CHECK(got.status == 200);
  CHECK(got.body_omitted);
  CHECK(got.body.empty());
  CHECK(got.headers.empty());
  CHECK(got.resource_id.empty());
}

TEST_CASE_TEMPLATE("fenced writes with a stale token change nothing", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid());
  const auto first = claim_won(h, req);
  auto expired = h.run(s.expire_lease(req.id, first.fence));
  REQUIRE(expired.has_value());
  REQUIRE(*expired);
  auto taken = h.run(s.take_over(req.id, first.fence, 30s));
  REQUIRE(taken.has_value());
  REQUIRE(taken->has_value());
  const auto second = **taken;
  CHECK(second.attempt == 2);
  CHECK(second.fence > first.fence);
  const std::string owned_by_2 = h.snapshot(req.id);

  // The first owner comes back late: every write is fenced.
  auto c = h.run(s.complete(req.id, first.fence, sample_response(), 1h));
  auto rel = h.run(s.release(req.id, first.fence));
  auto ren = h.run(s.renew(req.id, first.fence, 30s));
  auto exp = h.run(s.expire_lease(req.id, first.fence));
  auto tk = h.run(s.take_over(req.id, first.fence, 30s));
  auto rep = h.run(s.replace_expired(claim_req(rid(), "fp-x"), first.fence));
  REQUIRE(c.has_value());
  REQUIRE(rel.has_value());
  REQUIRE(ren.has_value());
  REQUIRE(exp.has_value());
  REQUIRE(tk.has_value());
  REQUIRE(rep.has_value());
  CHECK(*c == store::Completion::fenced);
  CHECK_FALSE(*rel);
  CHECK_FALSE(*ren);
  CHECK_FALSE(*exp);
  CHECK_FALSE(tk->has_value());
  CHECK_FALSE(rep->has_value());
  CHECK(h.snapshot(req.id) == owned_by_2);  // every column unchanged

  // Once completed, even the right token cannot write again.
  auto c2 = h.run(s.complete(req.id, second.fence, sample_response(), 1h));
  REQUIRE(c2.has_value());
  REQUIRE(*c2 == store::Completion::recorded);
  const std::string completed = h.snapshot(req.id);
  StoredResponse other;
  other.status = 500;
  CHECK(h.run(s.complete(req.id, second.fence, other, 1h)).value() == store::Completion::fenced);
  // The same fence with the same answer: a retry of a completion that had committed. It is
  // told apart from a fence, and writes nothing either.
  CHECK(h.run(s.complete(req.id, second.fence, sample_response(), 1h)).value() ==
        store::Completion::already_recorded);
  // A different header, a different body byte: not this completion's answer.
  auto almost = sample_response();
  almost.headers.back().value += "!";
  CHECK(h.run(s.complete(req.id, second.fence, almost, 1h)).value() == store::Completion::fenced);
  almost = sample_response();
  almost.body.back() = 'x';
  CHECK(h.run(s.complete(req.id, second.fence, almost, 1h)).value() == store::Completion::fenced);
  // An earlier claim's fence with this claim's answer is still fenced.
  CHECK(h.run(s.complete(req.id, first.fence, sample_response(), 1h)).value() ==
        store::Completion::fenced);
  CHECK_FALSE(h.run(s.release(req.id, second.fence)).value());
  CHECK_FALSE(h.run(s.renew(req.id, second.fence, 30s)).value());
  CHECK_FALSE(h.run(s.expire_lease(req.id, second.fence)).value());
  CHECK_FALSE(h.run(s.take_over(req.id, second.fence, 30s)).value().has_value());
  CHECK(h.snapshot(req.id) == completed);

  // And on a row that does not exist, nothing happens either.
  const auto ghost = rid("ghost");
  CHECK(h.run(s.complete(ghost, first.fence, other, 1h)).value() == store::Completion::fenced);
  CHECK_FALSE(h.run(s.release(ghost, first.fence)).value());
  CHECK_FALSE(h.run(s.renew(ghost, first.fence, 30s)).value());
  CHECK_FALSE(h.run(s.expire_lease(ghost, first.fence)).value());
  CHECK_FALSE(h.run(s.take_over(ghost, first.fence, 30s)).value().has_value());
  CHECK(h.row_count() == 1);
}

// The defect of per-row tokens: a release deletes the row, the next claim of the key
// starts again at attempt 1, and an owner of the released claim would match it. The
// fencing token is new for every claim, however the earlier one ended.
TEST_CASE_TEMPLATE("fencing: a claim after a release, purge or cleanup never shares a token", H,
                   STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid(), "fp-1", 30s, 1h);
  const auto released = claim_won(h, req);
  REQUIRE(h.run(s.release(req.id, released.fence)).value());

  const auto second = claim_won(h, req);
  CHECK(second.attempt == 1);  // what backends see starts over for the new claim ...
  CHECK(second.fence != released.fence);  // ... but the fence does not
  CHECK(second.fence > released.fence);
  const std::string owned_by_second = h.snapshot(req.id);

  // The owner of the released claim resumes: none of its writes reaches the new claim.
  CHECK(h.run(s.complete(req.id, released.fence, sample_response(), 1h)).value() == store::Completion::fenced);
  CHECK_FALSE(h.run(s.release(req.id, released.fence)).value());
  CHECK_FALSE(h.run(s.renew(req.id, released.fence, 30s)).value());
  CHECK_FALSE(h.run(s.expire_lease(req.id, released.fence)).value());
  CHECK(h.snapshot(req.id) == owned_by_second);

  // A takeover of the new claim must not be won on the strength of a read of the old one:
  // the CAS names the fence the reader saw.
  REQUIRE(h.run(s.expire_lease(req.id, second.fence)).value());
  CHECK_FALSE(h.run(s.take_over(req.id, released.fence, 30s)).value().has_value());

  // Purged, then claimed again: a new token again.
  REQUIRE(h.run(s.purge(req.id)).value());
  const auto after_purge = claim_won(h, req);
  CHECK(after_purge.attempt == 1);
  CHECK(after_purge.fence > second.fence);
  CHECK(h.run(s.complete(req.id, second.fence, sample_response(), 1h)).value() == store::Completion::fenced);

  // Completed, expired, deleted by retention, claimed again: a new token again.
  REQUIRE(h.run(s.complete(req.id, after_purge.fence, sample_response(), 1h)).value() == store::Completion::recorded);
  h.advance(2h);
  REQUIRE(h.run(s.delete_expired(10)).value() == 1);
  const auto after_cleanup = claim_won(h, req);
  CHECK(after_cleanup.fence > after_purge.fence);
  CHECK_FALSE(h.run(s.release(req.id, after_purge.fence)).value());
  CHECK(h.run(s.read(req.id)).value()->fence == after_cleanup.fence);
}

TEST_CASE_TEMPLATE("fencing: a lost claim owns nothing; a later claim gets a new token", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid());
  const auto owner = claim_won(h, req);
  auto lost = h.run(s.claim(req));
  REQUIRE(lost.has_value());
  CHECK_FALSE(lost->won);
  CHECK(lost->owner == store::Ownership{});  // a loser owns nothing
  REQUIRE(h.run(s.release(req.id, owner.fence)).value());
  const auto next = claim_won(h, req);
  CHECK(next.fence > owner.fence);
}

TEST_CASE_TEMPLATE("take_over: only an expired lease, only with the token seen", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid(), "fp-1", 10s);
  const auto first = claim_won(h, req);

  CHECK_FALSE(h.run(s.take_over(req.id, first.fence, 30s)).value().has_value());  // lease live
  h.advance(9s);
  CHECK_FALSE(h.run(s.take_over(req.id, first.fence, 30s)).value().has_value());  // still live
  h.advance(2s);
  auto rec = h.run(s.read(req.id)).value();
  REQUIRE(rec.has_value());
  CHECK(rec->lease_expired);
  CHECK(rec->lease_remaining == 0ms);
  const auto created = rec->created_at_us;

  CHECK_FALSE(h.run(s.take_over(req.id, first.fence + 1, 20s)).value().has_value());  // wrong
  auto won = h.run(s.take_over(req.id, first.fence, 20s));
  REQUIRE(won.has_value());
  REQUIRE(won->has_value());
  const auto second = **won;
  CHECK(second.attempt == 2);
  CHECK(second.fence > first.fence);
  CHECK_FALSE(h.run(s.take_over(req.id, first.fence, 20s)).value().has_value());  // CAS spent
  CHECK_FALSE(h.run(s.take_over(req.id, second.fence, 20s)).value().has_value());  // live lease

  rec = h.run(s.read(req.id)).value();
  REQUIRE(rec.has_value());
  CHECK(rec->attempt == 2);
  CHECK(rec->fence == second.fence);
  CHECK(rec->state == State::in_progress);
  CHECK_FALSE(rec->lease_expired);
  CHECK(rec->lease_remaining > 19s);
  CHECK(rec->lease_remaining <= 20s);
  CHECK(rec->fingerprint == "fp-1");
  CHECK(rec->created_at_us == created);  // the operation is the same one
}

TEST_CASE_TEMPLATE("take_over: never on a completed row", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid(), "fp-1", 1s);
  const auto owner = claim_won(h, req);
  REQUIRE(h.run(s.complete(req.id, owner.fence, sample_response(), 1h)).value() == store::Completion::recorded);
  h.advance(10s);
  CHECK_FALSE(h.run(s.take_over(req.id, owner.fence, 30s)).value().has_value());
}

TEST_CASE_TEMPLATE("take_over: of many concurrent duplicates exactly one wins", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid(), "fp-1", 1s);
  const auto first = claim_won(h, req);
  h.advance(2s);
  auto results = run_concurrently(h, 20, [&](int) { return s.take_over(req.id, first.fence, 30s); });
  int winners = 0;
  std::int64_t winning_fence = 0;
  for (auto& r : results) {
    REQUIRE(r.has_value());
    if (r->has_value()) {
      ++winners;
      CHECK((*r)->attempt == 2);
      winning_fence = (*r)->fence;
    }
  }
  CHECK(winners == 1);
  const auto rec = h.run(s.read(req.id)).value();
  CHECK(rec->attempt == 2);
  CHECK(rec->fence == winning_fence);
}

TEST_CASE_TEMPLATE("expire_lease: the next duplicate can take over at once", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid(), "fp-1", 1h);
  const auto owner = claim_won(h, req);
  REQUIRE(h.run(s.expire_lease(req.id, owner.fence)).value());
  auto rec = h.run(s.read(req.id)).value();
  REQUIRE(rec.has_value());
  CHECK(rec->lease_expired);
  CHECK(rec->lease_remaining == 0ms);
  CHECK(rec->state == State::in_progress);
  const auto taken = h.run(s.take_over(req.id, owner.fence, 30s)).value();
  REQUIRE(taken.has_value());
  CHECK(taken->attempt == 2);
}

TEST_CASE_TEMPLATE("renew: extends the lease and keeps expires_at beyond it", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid(), "fp-1", 10s, 1h);
  const auto owner = claim_won(h, req);
  h.advance(8s);
  REQUIRE(h.run(s.renew(req.id, owner.fence, 10s)).value());
  auto rec = h.run(s.read(req.id)).value();
  REQUIRE(rec.has_value());
  CHECK(rec->lease_remaining > 9s);
  CHECK(rec->lease_remaining <= 10s);
  h.advance(8s);  // 16 s after the claim: the original lease would have expired
  rec = h.run(s.read(req.id)).value();
  CHECK_FALSE(rec->lease_expired);
  CHECK_FALSE(h.run(s.take_over(req.id, owner.fence, 30s)).value().has_value());
  h.advance(3s);
  rec = h.run(s.read(req.id)).value();
  CHECK(rec->lease_expired);

  // A lease renewed past the retention pushes expires_at along: a row never expires
  // under a live lease.
  const auto short_req = claim_req(rid("short"), "fp-1", 1s, 2s);
  const auto short_owner = claim_won(h, short_req);
  REQUIRE(h.run(s.renew(short_req.id, short_owner.fence, 60s)).value());
  auto short_rec = h.run(s.read(short_req.id)).value();
  REQUIRE(short_rec.has_value());
  CHECK(short_rec->expires_at_us >= short_rec->lease_expires_at_us);
  h.advance(30s);
  CHECK_FALSE(h.run(s.read(short_req.id)).value()->expired);
}

TEST_CASE_TEMPLATE("release: deletes the claim so the key can be claimed again", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid());
  const auto owner = claim_won(h, req);
  CHECK(h.run(s.release(req.id, owner.fence)).value());
  CHECK_FALSE(h.run(s.read(req.id)).value().has_value());
  CHECK(h.row_count() == 0);
  CHECK_FALSE(h.run(s.release(req.id, owner.fence)).value());
  auto again = h.run(s.claim(req));
  REQUIRE(again.has_value());
  CHECK(again->won);
  CHECK(again->owner.attempt == 1);
  CHECK(again->owner.fence != owner.fence);
}

TEST_CASE_TEMPLATE("replace_expired: only after retention, only with the token seen", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid(), "fp-1", 30s, 60s, "p-1");
  const auto first = claim_won(h, req);
  REQUIRE(h.run(s.complete(req.id, first.fence, sample_response(), 60s)).value() == store::Completion::recorded);
  const auto replacement = claim_req(rid(), "fp-2", 15s, 2h, "p-2");

  CHECK_FALSE(h.run(s.replace_expired(replacement, first.fence)).value().has_value());  // live
  h.advance(61s);
  auto old = h.run(s.read(req.id)).value();
  REQUIRE(old.has_value());
  CHECK(old->expired);
  CHECK(old->state == State::completed);

  CHECK_FALSE(h.run(s.replace_expired(replacement, first.fence + 1)).value().has_value());
  auto replaced = h.run(s.replace_expired(replacement, first.fence));
  REQUIRE(replaced.has_value());
  REQUIRE(replaced->has_value());
  CHECK((*replaced)->attempt == 2);  // attempts of the key keep counting up
  CHECK((*replaced)->fence > first.fence);
  CHECK_FALSE(h.run(s.replace_expired(replacement, first.fence)).value().has_value());
  // A straggler of the expired operation can no longer write.
  CHECK(h.run(s.complete(req.id, first.fence, sample_response(), 1h)).value() == store::Completion::fenced);

  auto rec = h.run(s.read(req.id)).value();
  REQUIRE(rec.has_value());
  CHECK(rec->state == State::in_progress);
  CHECK(rec->attempt == 2);
  CHECK(rec->fence == (*replaced)->fence);
  CHECK(rec->fingerprint == "fp-2");
  CHECK(rec->principal == "p-2");
  CHECK_FALSE(rec->expired);
  CHECK_FALSE(rec->lease_expired);
  CHECK_FALSE(rec->response.has_value());
  CHECK(rec->completed_at_us == 0);
  CHECK(rec->created_at_us > old->created_at_us);
  CHECK(rec->lease_expires_at_us - rec->created_at_us == us(15s));
  CHECK(rec->expires_at_us - rec->created_at_us == us(2h));
  if constexpr (is_pg<H>) {
    // Nothing of the old answer survives in the row itself.
    auto cols = h.sql().query(
        "SELECT response_status IS NULL, response_headers IS NULL, response_body IS NULL,"
        " resource_id IS NULL, response_body_omitted, completed_at IS NULL"
        " FROM idempotency_requests WHERE tenant_id = $1 AND endpoint = $2"
        " AND idempotency_key = $3",
        {req.id.tenant, req.id.endpoint, req.id.key});
    REQUIRE(cols.size() == 1);
    CHECK(cols[0] == test::Row{"t", "t", "t", "t", "f", "t"});
  }
}

TEST_CASE_TEMPLATE("replace_expired: an in_progress row needs its lease gone too", H, STORES) {
  H h;
  auto& s = h.store();
  const auto req = claim_req(rid(), "fp-1", 5s, 10s);
  const auto first = claim_won(h, req);
  const auto replacement = claim_req(rid(), "fp-2");
  h.advance(3s);
  CHECK_FALSE(h.run(s.replace_expired(replacement, first.fence)).value().has_value());
  h.advance(10s);  // lease and retention both passed: an abandoned claim
  const auto replaced = h.run(s.replace_expired(replacement, first.fence)).value();
  REQUIRE(replaced.has_value());
  CHECK(replaced->attempt == 2);
}

TEST_CASE_TEMPLATE("purge: deletes in any state", H, STORES) {
  H h;
  auto& s = h.store();
  const auto done = claim_req(rid("done"));
  const auto running = claim_req(rid("running"));
  REQUIRE(h.run(s.claim(done)).has_value());
  REQUIRE(h.run(s.claim(running)).has_value());
  REQUIRE(h.run(s.complete(done.id, fence_of(h, done.id), sample_response(), 1h)).value() == store::Completion::recorded);
  CHECK(h.run(s.purge(done.id)).value());
  CHECK(h.run(s.purge(running.id)).value());
  CHECK_FALSE(h.run(s.purge(done.id)).value());
  CHECK(h.row_count() == 0);
}

TEST_CASE_TEMPLATE("delete_expired: exactly the expired rows, in batches", H, STORES) {
  H h;
  auto& s = h.store();
  // a: completed, retention 10 s                 -> expired after 20 s
  // b: completed, retention 1 h                  -> live
  // c: in_progress, lease 5 s, retention 10 s    -> abandoned: expired
  // d: in_progress, lease 1 h, retention 10 s    -> the live lease keeps it
  // e: in_progress, lease 30 s, retention 1 h    -> live
  const auto a = claim_req(rid("a"), "fp", 1s, 10s);
  const auto b = claim_req(rid("b"), "fp", 1s, 1h);
  const auto c = claim_req(rid("c"), "fp", 5s, 10s);
  const auto d = claim_req(rid("d"), "fp", 1h, 10s);
  const auto e = claim_req(rid("e"), "fp", 30s, 1h);
  for (const auto* r : {&a, &b, &c, &d, &e}) REQUIRE(h.run(s.claim(*r)).value().won);
  REQUIRE(h.run(s.complete(a.id, fence_of(h, a.id), sample_response(), 10s)).value() == store::Completion::recorded);
  REQUIRE(h.run(s.complete(b.id, fence_of(h, b.id), sample_response(), 1h)).value() == store::Completion::recorded);

  CHECK(h.run(s.delete_expired(100)).value() == 0);  // nothing expired yet
  h.advance(20s);
  CHECK(h.run(s.delete_expired(1)).value() == 1);
  CHECK(h.run(s.delete_expired(1)).value() == 1);
  CHECK(h.run(s.delete_expired(1)).value() == 0);
  CHECK(h.run(s.delete_expired(0)).value() == 0);
  CHECK(h.row_count() == 3);
  CHECK_FALSE(h.run(s.read(a.id)).value().has_value());
  CHECK_FALSE(h.run(s.read(c.id)).value().has_value());
  CHECK(h.run(s.read(b.id)).value().has_value());
  CHECK(h.run(s.read(d.id)).value().has_value());
  CHECK(h.run(s.read(e.id)).value().has_value());

  for (int i = 0; i < 5; ++i) {
    const auto f = claim_req(rid("f" + std::to_string(i)), "fp", 1s, 1s);
    REQUIRE(h.run(s.claim(f)).value().won);
    REQUIRE(h.run(s.complete(f.id, fence_of(h, f.id), sample_response(), 1s)).value() == store::Completion::recorded);
  }
  h.advance(2s);
  CHECK(h.run(s.delete_expired(2)).value() == 2);
  CHECK(h.run(s.delete_expired(2)).value() == 2);
  CHECK(h.run(s.delete_expired(2)).value() == 1);
  CHECK(h.run(s.delete_expired(2)).value() == 0);
  CHECK(h.row_count() == 3);
}

// Across tenants, which a table partitioned by tenant keeps in different partitions
// (migrations/optional/partition_by_tenant.sql): a batch is still exactly its size.
TEST_CASE_TEMPLATE("delete_expired: batches hold across tenants", H, STORES) {
  H h;
  auto& s = h.store();
  for (int t = 0; t < 8; ++t) {
    for (int k = 0; k < 3; ++k) {
      const auto r = claim_req(rid("k" + std::to_string(k), "tenant-" + std::to_string(t)), "fp",
                               1s, 1s);
      REQUIRE(h.run(s.claim(r)).value().won);
      REQUIRE(h.run(s.complete(r.id, fence_of(h, r.id), sample_response(), 1s)).value() ==
              store::Completion::recorded);
    }
  }
  const auto live = claim_req(rid("live", "tenant-3"), "fp", 1h, 1h);
  REQUIRE(h.run(s.claim(live)).value().won);
  h.advance(2s);
  std::size_t total = 0;
  for (int batch = 0; batch < 7; ++batch) {
    const auto n = h.run(s.delete_expired(4)).value();
    CHECK(n <= 4);
    total += n;
  }
  CHECK(total == 24);
  CHECK(h.run(s.delete_expired(4)).value() == 0);
  CHECK(h.row_count() == 1);
  CHECK(h.run(s.read(live.id)).value().has_value());
}

TEST_CASE_TEMPLATE("scope: the same key in other tenants and endpoints is another record", H,
                   STORES) {
  H h;
  auto& s = h.store();
  const auto a = claim_req(rid("k", "tenant-a", "POST /orders"), "fp-a");
  const auto b = claim_req(rid("k", "tenant-b", "POST /orders"), "fp-b");
  const auto c = claim_req(rid("k", "tenant-a", "POST /refunds"), "fp-c");
  for (const auto* r : {&a, &b, &c}) {
    auto won = h.run(s.claim(*r));
    REQUIRE(won.has_value());
    CHECK(won->won);
    CHECK(won->owner.attempt == 1);
  }
  CHECK(h.row_count() == 3);
  REQUIRE(h.run(s.complete(a.id, fence_of(h, a.id), sample_response(), 1h)).value() == store::Completion::recorded);
  CHECK(h.run(s.read(b.id)).value()->state == State::in_progress);
  CHECK(h.run(s.read(b.id)).value()->fingerprint == "fp-b");
  CHECK(h.run(s.read(c.id)).value()->fingerprint == "fp-c");
  CHECK(h.run(s.purge(a.id)).value());
  CHECK(h.run(s.read(b.id)).value().has_value());
  CHECK(h.run(s.read(c.id)).value().has_value());
  CHECK(h.row_count() == 2);
}

TEST_CASE_TEMPLATE("oldest_in_progress_age: the oldest running claim", H, STORES) {
  H h;
  auto& s = h.store();
  CHECK_FALSE(h.run(s.oldest_in_progress_age()).value().has_value());
  const auto x = claim_req(rid("x"));
  const auto y = claim_req(rid("y"));
  REQUIRE(h.run(s.claim(x)).value().won);
  h.advance(5s);
  REQUIRE(h.run(s.claim(y)).value().won);
  auto age = h.run(s.oldest_in_progress_age()).value();
  REQUIRE(age.has_value());
  CHECK(*age >= 5s);
  CHECK(*age < 6s);
  REQUIRE(h.run(s.complete(x.id, fence_of(h, x.id), sample_response(), 1h)).value() == store::Completion::recorded);
  age = h.run(s.oldest_in_progress_age()).value();
  REQUIRE(age.has_value());
  CHECK(*age < 1s);
  REQUIRE(h.run(s.release(y.id, fence_of(h, y.id))).value());
  CHECK_FALSE(h.run(s.oldest_in_progress_age()).value().has_value());
}

// The status resource of long operations: operation id -> record, within one tenant.
TEST_CASE_TEMPLATE("operations: registered ids find their record, only in their tenant", H,
                   STORES) {
  H h;
  auto& s = h.store();
  const auto a = claim_req(rid("k", "tenant-a"));
  const auto b = claim_req(rid("k", "tenant-b"));
  const std::string op_a = "op-of-a";
  // Nothing to register without a record; nothing found before registration.
  CHECK_FALSE(h.run(s.register_operation(a.id, op_a)).value());
  const auto owner = claim_won(h, a);
  REQUIRE(h.run(s.claim(b)).value().won);
  CHECK_FALSE(h.run(s.find_operation("tenant-a", op_a)).value().has_value());
  CHECK(h.run(s.register_operation(a.id, op_a)).value());
  CHECK(h.run(s.register_operation(a.id, op_a)).value());  // twice: still one entry
  auto found = h.run(s.find_operation("tenant-a", op_a)).value();
  REQUIRE(found.has_value());
  CHECK(found->id.tenant == "tenant-a");
  CHECK(found->id.endpoint == "POST /orders");
  CHECK(found->id.key == "k");
  CHECK(found->record.state == State::in_progress);
  CHECK(found->record.attempt == 1);
  CHECK(found->record.fence == owner.fence);
  // Another tenant's lookup of the same id finds nothing, although its own key is the same.
  CHECK_FALSE(h.run(s.find_operation("tenant-b", op_a)).value().has_value());
  CHECK_FALSE(h.run(s.find_operation("tenant-a", "op-unknown")).value().has_value());
  // It follows the record: completed, then gone with it on release or purge.
  REQUIRE(h.run(s.complete(a.id, owner.fence, sample_response(), 1h)).value() ==
          store::Completion::recorded);
  found = h.run(s.find_operation("tenant-a", op_a)).value();
  REQUIRE(found.has_value());
  CHECK(found->record.state == State::completed);
  REQUIRE(found->record.response.has_value());
  CHECK(*found->record.response == sample_response());
  CHECK(h.run(s.purge(a.id)).value());
  CHECK_FALSE(h.run(s.find_operation("tenant-a", op_a)).value().has_value());
  // A new claim of the key is a new record: not found until it registers again.
  const auto again = claim_won(h, a);
  CHECK_FALSE(h.run(s.find_operation("tenant-a", op_a)).value().has_value());
  CHECK(h.run(s.register_operation(a.id, op_a)).value());
  CHECK(h.run(s.find_operation("tenant-a", op_a)).value().has_value());
  CHECK(h.run(s.release(a.id, again.fence)).value());
  CHECK_FALSE(h.run(s.find_operation("tenant-a", op_a)).value().has_value());
}

namespace {

store::PayloadNote note_of(std::string op, std::string fingerprint = "fp-1", bool keep_earlier = false,
                           std::string tenant = "tenant-a", std::string principal = "") {
  store::PayloadNote n;
  n.tenant = std::move(tenant);
  n.endpoint = "POST /orders";
  n.principal = std::move(principal);
  n.fingerprint = std::move(fingerprint);
  n.key_hash = "hash-" + op;
  n.operation_id = std::move(op);
  n.window = 10min;
  n.keep_earlier = keep_earlier;
  return n;
}

}  // namespace

TEST_CASE_TEMPLATE("note_payload: a new key for a recent payload is detected, naming the earlier key", H,
                   STORES) {
  H h;
  auto& s = h.store();
  CHECK_FALSE(h.run(s.note_payload(note_of("op-1"))).value().detected);  // the first
  CHECK_FALSE(h.run(s.note_payload(note_of("op-1"))).value().detected);  // the same key again
  h.advance(2min);
  const auto seen = h.run(s.note_payload(note_of("op-2"))).value();       // a new key
  CHECK(seen.detected);
  CHECK(seen.earlier_operation_id == "op-1");
  CHECK(seen.earlier_key_hash == "hash-op-1");
  CHECK(seen.age >= 2min);
  CHECK(seen.age < 3min);
  // count and warn: the latest key is the one a further new key is measured against.
  const auto third = h.run(s.note_payload(note_of("op-3"))).value();
  CHECK(third.detected);
  CHECK(third.earlier_operation_id == "op-2");
  CHECK(third.age < 1min);
  // Another fingerprint, tenant or principal is another payload.
  CHECK_FALSE(h.run(s.note_payload(note_of("op-4", "fp-2"))).value().detected);
  CHECK_FALSE(h.run(s.note_payload(note_of("op-5", "fp-1", false, "tenant-b"))).value().detected);
  CHECK_FALSE(h.run(s.note_payload(note_of("op-6", "fp-1", false, "tenant-a", "alice"))).value().detected);
  CHECK(h.note_count() == 4);
}

TEST_CASE_TEMPLATE("note_payload: past its window a note counts for nothing, and cleanup removes it", H,
                   STORES) {
  H h;
  auto& s = h.store();
  REQUIRE_FALSE(h.run(s.note_payload(note_of("op-1"))).value().detected);
  REQUIRE_FALSE(h.run(s.note_payload(note_of("op-x", "fp-2"))).value().detected);
  h.advance(9min);
  REQUIRE_FALSE(h.run(s.note_payload(note_of("op-y", "fp-3"))).value().detected);
  CHECK(h.run(s.delete_expired(100)).value() == 0);
  CHECK(h.note_count() == 3);  // none expired yet
  h.advance(2min);  // fp-1 and fp-2 are 11 minutes old now, fp-3 two
  const auto late = h.run(s.note_payload(note_of("op-2"))).value();
  CHECK_FALSE(late.detected);
  // op-2 renewed fp-1; fp-2 is expired and goes, fp-3 stays.
  CHECK(h.run(s.delete_expired(100)).value() == 0);  // the count is of records
  CHECK(h.note_count() == 2);
  CHECK(h.run(s.note_payload(note_of("op-3"))).value().detected);  // fp-1's note, op-2's now
}

TEST_CASE_TEMPLATE("note_payload: keep_earlier (reject) keeps measuring every new key against the first", H,
                   STORES) {
  H h;
  auto& s = h.store();
  REQUIRE_FALSE(h.run(s.note_payload(note_of("op-1", "fp-1", true))).value().detected);
  for (const char* op : {"op-2", "op-3", "op-2"}) {
    INFO(op);
    const auto seen = h.run(s.note_payload(note_of(op, "fp-1", true))).value();
    CHECK(seen.detected);
    CHECK(seen.earlier_operation_id == "op-1");
  }
  // The earlier key itself is still fine, and refreshes its note.
  CHECK_FALSE(h.run(s.note_payload(note_of("op-1", "fp-1", true))).value().detected);
  // Past the window, a new key starts its own.
  h.advance(11min);
  CHECK_FALSE(h.run(s.note_payload(note_of("op-4", "fp-1", true))).value().detected);
  CHECK(h.run(s.note_payload(note_of("op-5", "fp-1", true))).value().earlier_operation_id == "op-4");
}

TEST_CASE_TEMPLATE("note_payload: of concurrent new keys for one payload, all but one are detected", H,
                   STORES) {
  H h;
  auto& s = h.store();
  constexpr int n = 8;
  // The notes outlive the calls: a coroutine keeps a reference to its argument.
  std::vector<store::PayloadNote> notes;
  for (int i = 0; i < n; ++i) notes.push_back(note_of("op-" + std::to_string(i)));
  std::vector<std::future<result<store::PayloadSeen>>> calls;
  for (const auto& note : notes) calls.push_back(asio::co_spawn(h.ctx(), s.note_payload(note), asio::use_future));
  h.ctx().restart();
  h.ctx().run();
  int detected = 0;
  for (auto& c : calls) detected += c.get().value().detected ? 1 : 0;
  CHECK(detected == n - 1);
  CHECK(h.note_count() == 1);
}

TEST_CASE("MemoryStore: set_unavailable fails every call with store_unavailable") {
  test::MemoryHarness h;
  auto& s = h.memory();
  const auto req = claim_req(rid());
  REQUIRE(h.run(s.claim(req)).value().won);
  s.set_unavailable(true);
  const error_code down = make_error_code(errc::store_unavailable);
  CHECK(h.run(s.claim(req)).error() == down);
  CHECK(h.run(s.read(req.id)).error() == down);
  CHECK(h.run(s.take_over(req.id, 1, 1s)).error() == down);
  CHECK(h.run(s.replace_expired(req, 1)).error() == down);
  CHECK(h.run(s.complete(req.id, 1, sample_response(), 1h)).error() == down);
  CHECK(h.run(s.release(req.id, 1)).error() == down);
  CHECK(h.run(s.renew(req.id, 1, 1s)).error() == down);
  CHECK(h.run(s.expire_lease(req.id, 1)).error() == down);
  CHECK(h.run(s.purge(req.id)).error() == down);
  CHECK(h.run(s.delete_expired(10)).error() == down);
  CHECK(h.run(s.oldest_in_progress_age()).error() == down);
  s.set_unavailable(false);
  CHECK(h.run(s.read(req.id)).value().has_value());
  CHECK(s.size() == 1);
}
