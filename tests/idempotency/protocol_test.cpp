// The request protocol as step sequences: each case resumes the state machine with the
// events a store, a wait or the upstream would produce, and checks every action it asks
// for. No timers, no sockets, no store: time is a value the test moves.
#include <doctest/doctest.h>

#include <ostream>

#include "idempotency/protocol.hpp"

namespace idem::idempotency {
// Printed by doctest when a check fails.
inline std::ostream& operator<<(std::ostream& os, Step s) { return os << to_string(s); }
inline std::ostream& operator<<(std::ostream& os, Answer a) { return os << to_string(a); }
}  // namespace idem::idempotency

namespace {

using namespace idem;
using namespace idem::idempotency;
using namespace std::chrono_literals;
using store::Completion;
using store::Ownership;

constexpr std::string_view kFp = "fp-mine";
constexpr std::string_view kOtherFp = "fp-other";

ProtocolOptions test_options(Millis wait = 1000ms) {
  ProtocolOptions o;
  o.fingerprint = kFp;
  o.principal = "";
  o.check_principal = false;
  o.wait = wait;
  return o;
}

// A running machine with a clock the test moves.
struct Run {
  explicit Run(ProtocolOptions o = test_options()) : protocol(o) {}
  static ProtocolOptions options(Millis wait = 1000ms) { return test_options(wait); }

  Action operator()(const Event& e) { return protocol.resume(e, now); }

  Protocol protocol;
  SteadyClock::time_point now{std::chrono::seconds(1000)};
};

RowView completed(std::string_view fp = kFp, std::int64_t fence = 7) {
  RowView r;
  r.fingerprint = fp;
  r.completed = true;
  r.attempt = 1;
  r.fence = fence;
  return r;
}

RowView running(Millis lease_left = 10s, std::int64_t fence = 7, std::string_view fp = kFp) {
  RowView r;
  r.fingerprint = fp;
  r.attempt = 1;
  r.fence = fence;
  r.lease_remaining = lease_left;
  r.lease_expired = lease_left <= 0ms;
  return r;
}

Claimed won(std::int64_t attempt = 1, std::int64_t fence = 41) {
  return Claimed{Ownership{attempt, fence}};
}

Claimed lost() { return Claimed{}; }

Claimed lost_with(std::optional<RowView> row) {
  Claimed c;
  c.row_read = true;
  c.row = row;
  return c;
}

void check_answer(const Action& a, Answer expected, Fenced fenced = Fenced::no,
                  bool from_record = false) {
  CHECK(a.step == Step::answer);
  CHECK(a.answer == expected);
  CHECK(a.fenced == fenced);
  CHECK(a.from_record == from_record);
}

// Claims, wins and forwards: the first three steps of every owner.
Run owner_forwarding(std::int64_t fence = 41) {
  Run r;
  REQUIRE(r(Begin{}).step == Step::claim);
  const auto fwd = r(won(1, fence));
  REQUIRE(fwd.step == Step::forward);
  REQUIRE(fwd.owner == Ownership{1, fence});
  return r;
}

}  // namespace

// ---- The owner ------------------------------------------------------------------------------

TEST_CASE("owner: claim, forward, complete under its fence, answer the recorded response") {
  Run r = owner_forwarding(41);
  const auto complete = r(Forwarded{UpstreamResult::answered, true});
  CHECK(complete.step == Step::complete);
  CHECK(complete.fence == 41);
  check_answer(r(Completed{Completion::recorded}), Answer::recorded);
  CHECK(r.protocol.owner() == Ownership{1, 41});
}

TEST_CASE("owner: a completion that had already committed is a success, not a fence") {
  Run r = owner_forwarding();
  REQUIRE(r(Forwarded{UpstreamResult::answered, true}).step == Step::complete);
  check_answer(r(Completed{Completion::already_recorded}), Answer::recorded);
}

TEST_CASE("owner: a completion is retried once; then 503, never the unrecorded answer") {
  Run r = owner_forwarding(41);
  REQUIRE(r(Forwarded{UpstreamResult::answered, true}).step == Step::complete);
  const auto again = r(StoreFailed{});
  CHECK(again.step == Step::complete);
  CHECK(again.fence == 41);
  SUBCASE("the retry records it") { check_answer(r(Completed{Completion::recorded}), Answer::recorded); }
  SUBCASE("the retry fails too") { check_answer(r(StoreFailed{}), Answer::unrecorded); }
}

TEST_CASE("owner: a transient answer releases the key and passes the answer on") {
  Run r = owner_forwarding(41);
  const auto release = r(Forwarded{UpstreamResult::answered, false});
  CHECK(release.step == Step::release);
  CHECK(release.fence == 41);
  SUBCASE("released") { check_answer(r(Written{true}), Answer::released); }
  SUBCASE("the release fails: the lease lapses; the answer still goes out") {
    check_answer(r(StoreFailed{}), Answer::released);
  }
}

TEST_CASE("owner: a refused connection releases the key and answers 502, fenced or not") {
  Run r = owner_forwarding(41);
  const auto release = r(Forwarded{UpstreamResult::not_sent, false});
  CHECK(release.step == Step::release);
  CHECK(release.fence == 41);
  SUBCASE("released") { check_answer(r(Written{true}), Answer::not_sent); }
  SUBCASE("fenced: still not sent, and said so") {
    check_answer(r(Written{false}), Answer::not_sent, Fenced::release);
  }
  SUBCASE("the store failed") { check_answer(r(StoreFailed{}), Answer::not_sent); }
}

TEST_CASE("owner: an unknown outcome ends the lease at once and answers 504 or 502") {
  Run r = owner_forwarding(41);
  SUBCASE("timeout") {
    const auto expire = r(Forwarded{UpstreamResult::unknown, false});
    CHECK(expire.step == Step::expire_lease);
    CHECK(expire.fence == 41);
    check_answer(r(Written{true}), Answer::timed_out);
  }
  SUBCASE("invalid response") {
    REQUIRE(r(Forwarded{UpstreamResult::invalid, false}).step == Step::expire_lease);
    check_answer(r(Written{true}), Answer::invalid_response);
  }
  SUBCASE("fenced: nothing to hide, the answer stays, the fence is reported") {
    REQUIRE(r(Forwarded{UpstreamResult::unknown, false}).step == Step::expire_lease);
    check_answer(r(Written{false}), Answer::timed_out, Fenced::lease_expiry);
  }
  SUBCASE("the store failed: the lease lapses by itself") {
    REQUIRE(r(Forwarded{UpstreamResult::unknown, false}).step == Step::expire_lease);
    check_answer(r(StoreFailed{}), Answer::timed_out);
  }
}

// ---- A fenced owner ---------------------------------------------------------------------------

TEST_CASE("fenced completion: the owner answers from the record, never its own answer") {
  Run r = owner_forwarding(41);
  REQUIRE(r(Forwarded{UpstreamResult::answered, true}).step == Step::complete);
  CHECK(r(Completed{Completion::fenced}).step == Step::read);

  SUBCASE("completed by the newer claim: its replay") {
    check_answer(r(RowRead{completed(kFp, 50)}), Answer::replay, Fenced::completion, true);
  }
  SUBCASE("the key was released and claimed by another request: key reused") {
    check_answer(r(RowRead{completed(kOtherFp, 50)}), Answer::mismatch, Fenced::completion, true);
  }
  SUBCASE("gone: 503 to retry; it never claims again itself") {
    check_answer(r(RowRead{std::nullopt}), Answer::fenced_unrecorded, Fenced::completion, true);
  }
  SUBCASE("the newer owner's lease lapsed: 503 to retry; no takeover") {
    check_answer(r(RowRead{running(0ms, 50)}), Answer::fenced_unrecorded, Fenced::completion, true);
  }
  SUBCASE("the newer claim still runs: watch, read, wait, then the replay") {
    CHECK(r(RowRead{running(10s, 50)}).step == Step::watch);
    CHECK(r(Watching{}).step == Step::read);
    const auto wait = r(RowRead{running(10s, 50)});
    CHECK(wait.step == Step::wait);
    r.now += 20ms;
    CHECK(r(Waited{}).step == Step::read);
    check_answer(r(RowRead{completed(kFp, 50)}), Answer::replay, Fenced::completion, true);
  }
  SUBCASE("the newer claim outlasts `wait`: in progress") {
    CHECK(r(RowRead{running(10s, 50)}).step == Step::watch);
    CHECK(r(Watching{}).step == Step::read);
    r.now += 2s;  // past wait (1 s) from the fence
    check_answer(r(RowRead{running(10s, 50)}), Answer::in_progress, Fenced::completion, true);
  }
  SUBCASE("the store fails on the read") {
    check_answer(r(StoreFailed{}), Answer::store_unavailable, Fenced::completion, true);
  }
}

TEST_CASE("fenced release: an answer to a superseded attempt is not the key's") {
  Run r = owner_forwarding(41);
  REQUIRE(r(Forwarded{UpstreamResult::answered, false}).step == Step::release);
  CHECK(r(Written{false}).step == Step::read);
  check_answer(r(RowRead{completed(kFp, 50)}), Answer::replay, Fenced::release, true);
}

TEST_CASE("a fenced owner's wait starts when it is fenced, not when it claimed") {
  Run r = owner_forwarding(41);
  r.now += 5s;  // a long upstream call, far past `wait` from the claim
  REQUIRE(r(Forwarded{UpstreamResult::answered, true}).step == Step::complete);
  REQUIRE(r(Completed{Completion::fenced}).step == Step::read);
  CHECK(r(RowRead{running(10s, 50)}).step == Step::watch);  // budget left: it waits
}

// ---- Duplicates -------------------------------------------------------------------------------

TEST_CASE("duplicate: a lost claim reads the row and replays a completed record") {
  Run r;
  REQUIRE(r(Begin{}).step == Step::claim);
  CHECK(r(lost()).step == Step::read);
  check_answer(r(RowRead{completed()}), Answer::replay);
}

TEST_CASE("duplicate: a row read along with the claim is decided on at once, no read") {
  Run r;
  REQUIRE(r(Begin{}).step == Step::claim);
  check_answer(r(lost_with(completed())), Answer::replay);
}

TEST_CASE("duplicate: another request under the key is refused; another principal forbidden") {
  SUBCASE("mismatch") {
    Run r;
    r(Begin{});
    check_answer(r(lost_with(completed(kOtherFp))), Answer::mismatch);
  }
  SUBCASE("forbidden") {
    auto o = Run::options();
    o.check_principal = true;
    o.principal = "bob";
    Run r(o);
    r(Begin{});
    RowView row = completed();
    row.principal = "alice";
    check_answer(r(lost_with(row)), Answer::forbidden);
  }
}

TEST_CASE("duplicate: a running owner is waited for, woken, and replayed") {
  Run r;
  r(Begin{});
  // The row came with the claim, before any wake-up was registered: register, read again.
  CHECK(r(lost_with(running(10s))).step == Step::watch);
  CHECK(r(Watching{}).step == Step::read);
  const auto wait = r(RowRead{running(10s)});
  CHECK(wait.step == Step::wait);
  CHECK(wait.until == r.now + 20ms);  // the first poll
  r.now += 3ms;  // woken early by the owner's completion
  CHECK(r(Waited{}).step == Step::read);
  check_answer(r(RowRead{completed()}), Answer::replay);
}

TEST_CASE("duplicate: polls back off, never past `wait` or the owner's lease") {
  auto o = Run::options(1000ms);
  o.first_poll = 20ms;
  o.max_poll = 100ms;
  Run r(o);
  const auto start = r.now;
  r(Begin{});
  REQUIRE(r(lost()).step == Step::read);
  REQUIRE(r(RowRead{running(10s)}).step == Step::watch);
  REQUIRE(r(Watching{}).step == Step::read);
  std::vector<Millis> polls;
  for (int i = 0; i < 5; ++i) {
    const auto wait = r(RowRead{running(10s)});
    REQUIRE(wait.step == Step::wait);
    polls.push_back(std::chrono::duration_cast<Millis>(wait.until - r.now));
    r.now = wait.until;
    REQUIRE(r(Waited{}).step == Step::read);
  }
  CHECK(polls == std::vector<Millis>{20ms, 40ms, 80ms, 100ms, 100ms});
  // A lease about to end shortens the wait, to take over without a full poll.
  const auto short_wait = r(RowRead{running(7ms)});
  REQUIRE(short_wait.step == Step::wait);
  CHECK(short_wait.until == r.now + 12ms);  // lease + 5 ms
  r.now = start + 990ms;
  REQUIRE(r(Waited{}).step == Step::read);
  const auto last = r(RowRead{running(10s)});
  REQUIRE(last.step == Step::wait);
  CHECK(last.until == start + 1000ms);  // never past the deadline
  r.now = last.until;
  REQUIRE(r(Waited{}).step == Step::read);
  check_answer(r(RowRead{running(10s)}), Answer::in_progress);
}

TEST_CASE("duplicate: a vanished row is claimed again; won, the duplicate becomes the owner") {
  Run r;
  r(Begin{});
  CHECK(r(lost_with(std::nullopt)).step == Step::claim);
  const auto fwd = r(won(1, 99));
  CHECK(fwd.step == Step::forward);
  CHECK(fwd.owner.fence == 99);
  REQUIRE(r(Forwarded{UpstreamResult::answered, true}).step == Step::complete);
  check_answer(r(Completed{Completion::recorded}), Answer::recorded);
}

TEST_CASE("duplicate: a claim lost again is read again (or decided on its row)") {
  Run r;
  r(Begin{});
  REQUIRE(r(lost_with(std::nullopt)).step == Step::claim);
  SUBCASE("without a row") {
    CHECK(r(lost()).step == Step::read);
    check_answer(r(RowRead{completed()}), Answer::replay);
  }
  SUBCASE("with a row") { check_answer(r(lost_with(completed())), Answer::replay); }
}

TEST_CASE("duplicate: an expired lease is taken over with the fence it saw") {
  Run r;
  r(Begin{});
  REQUIRE(r(lost()).step == Step::read);
  const auto take = r(RowRead{running(0ms, 17)});
  CHECK(take.step == Step::take_over);
  CHECK(take.fence == 17);
  SUBCASE("won: forwards as attempt 2") {
    const auto fwd = r(Acquired{Ownership{2, 18}});
    CHECK(fwd.step == Step::forward);
    CHECK(fwd.owner == Ownership{2, 18});
  }
  SUBCASE("lost the CAS: looks again") {
    CHECK(r(Acquired{std::nullopt}).step == Step::read);
    check_answer(r(RowRead{completed()}), Answer::replay);
  }
}

TEST_CASE("duplicate: a record past its retention is replaced with the fence it saw") {
  Run r;
  r(Begin{});
  RowView old = completed(kOtherFp, 23);
  old.expired = true;
  const auto replace = r(lost_with(old));
  CHECK(replace.step == Step::replace);
  CHECK(replace.fence == 23);
  CHECK(r(Acquired{Ownership{2, 30}}).step == Step::forward);
}

TEST_CASE("store failures before anything was forwarded fail closed") {
  SUBCASE("claim") {
    Run r;
    r(Begin{});
    check_answer(r(StoreFailed{}), Answer::store_unavailable);
  }
  SUBCASE("read") {
    Run r;
    r(Begin{});
    r(lost());
    check_answer(r(StoreFailed{}), Answer::store_unavailable);
  }
  SUBCASE("take over") {
    Run r;
    r(Begin{});
    REQUIRE(r(lost_with(running(0ms))).step == Step::take_over);
    check_answer(r(StoreFailed{}), Answer::store_unavailable);
  }
}

TEST_CASE("a livelock of rows that keep vanishing ends in progress after max_rounds") {
  auto o = Run::options();
  o.max_rounds = 5;
  Run r(o);
  r(Begin{});
  for (int i = 0; i < 5; ++i) REQUIRE(r(lost_with(std::nullopt)).step == Step::claim);
  check_answer(r(lost_with(std::nullopt)), Answer::in_progress);
}

// ---- Misuse -----------------------------------------------------------------------------------

TEST_CASE("an event the last action cannot produce ends the request without another step") {
  SUBCASE("a row before any claim") {
    Run r;
    check_answer(r(RowRead{completed()}), Answer::store_unavailable);
  }
  SUBCASE("an upstream outcome while reading") {
    Run r;
    r(Begin{});
    r(lost());
    check_answer(r(Forwarded{}), Answer::store_unavailable);
  }
  SUBCASE("anything after the answer") {
    Run r = owner_forwarding();
    r(Forwarded{UpstreamResult::answered, true});
    REQUIRE(r(Completed{Completion::recorded}).step == Step::answer);
    check_answer(r(Completed{Completion::recorded}), Answer::store_unavailable);
  }
}

// ---- The decision table, seen through the machine ---------------------------------------------

// For each of decide()'s outcomes, the step a duplicate and a fenced owner take next:
// written out independently of protocol.cpp, so a change to either shows here.
TEST_CASE("every decision on a read row leads to its step, for both roles") {
  struct Case {
    const char* name;
    std::optional<RowView> row;
    Step duplicate;
    Answer duplicate_answer;
    Answer fenced_answer;  // a fenced owner's answer (every one of its steps here is an answer
                           // except the wait, marked Answer::none)
  };
  RowView expired_done = completed();
  expired_done.expired = true;
  const Case cases[] = {
      {"vanished", std::nullopt, Step::claim, Answer::none, Answer::fenced_unrecorded},
      {"expired", expired_done, Step::replace, Answer::none, Answer::fenced_unrecorded},
      {"mismatch", completed(kOtherFp), Step::answer, Answer::mismatch, Answer::mismatch},
      {"completed", completed(), Step::answer, Answer::replay, Answer::replay},
      {"lease lapsed", running(0ms), Step::take_over, Answer::none, Answer::fenced_unrecorded},
      {"running", running(10s), Step::watch, Answer::none, Answer::none},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    Run dup;
    dup(Begin{});
    const auto d = dup(lost_with(c.row));
    CHECK(d.step == c.duplicate);
    if (d.step == Step::answer) CHECK(d.answer == c.duplicate_answer);

    Run fenced = owner_forwarding();
    fenced(Forwarded{UpstreamResult::answered, true});
    REQUIRE(fenced(Completed{Completion::fenced}).step == Step::read);
    const auto f = fenced(RowRead{c.row});
    if (c.fenced_answer == Answer::none) {
      CHECK(f.step == Step::watch);
    } else {
      CHECK(f.step == Step::answer);
      CHECK(f.answer == c.fenced_answer);
      CHECK(f.from_record);
    }
  }
}

// ---- completion: backend ------------------------------------------------------------------

TEST_CASE("backend completion: a confirmed record needs no store call") {
  Run r = owner_forwarding(41);
  Forwarded f{UpstreamResult::answered, true, BackendRecord::confirmed};
  check_answer(r(f), Answer::recorded);
}

TEST_CASE("backend completion: a confirmed record stands even for a status the route would not store") {
  Run r = owner_forwarding(41);
  Forwarded f{UpstreamResult::answered, false, BackendRecord::confirmed};
  check_answer(r(f), Answer::recorded);
}

TEST_CASE("backend completion: a record other than the answer sent is read, and the record wins") {
  Run r = owner_forwarding(41);
  CHECK(r(Forwarded{UpstreamResult::answered, true, BackendRecord::differs}).step == Step::read);
  SUBCASE("completed under this claim's fence: the record is the answer") {
    check_answer(r(RowRead{completed(kFp, 41)}), Answer::backend_recorded);
  }
  SUBCASE("still in progress (nothing recorded after all): the sidecar completes") {
    const auto complete = r(RowRead{running(10s, 41)});
    CHECK(complete.step == Step::complete);
    CHECK(complete.fence == 41);
    check_answer(r(Completed{Completion::recorded}), Answer::recorded);
  }
  SUBCASE("not storable and not recorded: released as usual") {
    Run t = owner_forwarding(41);
    REQUIRE(t(Forwarded{UpstreamResult::answered, false, BackendRecord::differs}).step == Step::read);
    CHECK(t(RowRead{running(10s, 41)}).step == Step::release);
  }
  SUBCASE("completed by another claim: the sidecar's completion is fenced, then replays") {
    REQUIRE(r(RowRead{completed(kFp, 50)}).step == Step::complete);
    REQUIRE(r(Completed{Completion::fenced}).step == Step::read);
    check_answer(r(RowRead{completed(kFp, 50)}), Answer::replay, Fenced::completion, true);
  }
  SUBCASE("the store does not answer: 503, no answer that a retry might not replay") {
    check_answer(r(StoreFailed{}), Answer::unrecorded);
  }
}

// ---- Long operations: re-fetch replays, reconciliation of unknown outcomes ------------------

TEST_CASE("refetch: a replay of a record with a resource re-fetches it, and answers by the fetch") {
  ProtocolOptions o = test_options();
  o.refetch = true;
  Run r(o);
  r(Begin{});
  RowView row = completed();
  row.has_resource = true;
  REQUIRE(r(lost_with(row)).step == Step::refetch);
  SUBCASE("fetched") { check_answer(r(Refetched{RefetchResult::fetched}), Answer::refetched); }
  SUBCASE("refused") {
    check_answer(r(Refetched{RefetchResult::refused}), Answer::refetch_refused);
  }
  SUBCASE("failed") { check_answer(r(Refetched{RefetchResult::failed}), Answer::refetch_failed); }
}

TEST_CASE("refetch: a record without a resource, or a route in stored mode, replays the bytes") {
  RowView row = completed();
  SUBCASE("no resource on a refetch route") {
    ProtocolOptions o = test_options();
    o.refetch = true;
    Run r(o);
    r(Begin{});
    check_answer(r(lost_with(row)), Answer::replay);
  }
  SUBCASE("a resource on a stored route") {
    Run r;
    r(Begin{});
    row.has_resource = true;
    check_answer(r(lost_with(row)), Answer::replay);
  }
}

TEST_CASE("refetch: a mismatch or another principal is refused before anything is fetched") {
  ProtocolOptions o = test_options();
  o.refetch = true;
  Run r(o);
  r(Begin{});
  RowView row = completed(kOtherFp);
  row.has_resource = true;
  check_answer(r(lost_with(row)), Answer::mismatch);
}

// A takeover that won, on a reconcile route.
Run reconciling(std::int64_t fence = 18) {
  ProtocolOptions o = test_options();
  o.reconcile = true;
  Run r(o);
  r(Begin{});
  REQUIRE(r(lost_with(running(0ms, 17))).step == Step::take_over);
  const auto ask = r(Acquired{Ownership{2, fence}});
  REQUIRE(ask.step == Step::reconcile);
  REQUIRE(ask.owner == Ownership{2, fence});
  return r;
}

TEST_CASE("reconcile: found, the lookup's answer is recorded under the new fence; no forward") {
  Run r = reconciling(18);
  const auto complete = r(Reconciled{ReconcileResult::found});
  CHECK(complete.step == Step::complete);
  CHECK(complete.fence == 18);
  check_answer(r(Completed{Completion::recorded}), Answer::recorded);
}

TEST_CASE("reconcile: not found, the request is forwarded as the new attempt") {
  Run r = reconciling(18);
  const auto fwd = r(Reconciled{ReconcileResult::not_found});
  CHECK(fwd.step == Step::forward);
  CHECK(fwd.owner == Ownership{2, 18});
}

TEST_CASE("reconcile: not known, nothing is forwarded; the lease ends so the next retry asks") {
  Run r = reconciling(18);
  const auto expire = r(Reconciled{ReconcileResult::failed});
  CHECK(expire.step == Step::expire_lease);
  CHECK(expire.fence == 18);
  check_answer(r(Written{true}), Answer::reconcile_failed);
}

TEST_CASE("reconcile: a found answer whose completion is fenced answers from the record") {
  Run r = reconciling(18);
  REQUIRE(r(Reconciled{ReconcileResult::found}).step == Step::complete);
  CHECK(r(Completed{Completion::fenced}).step == Step::read);
  check_answer(r(RowRead{completed(kFp, 19)}), Answer::replay, Fenced::completion, true);
}

TEST_CASE("reconcile: a fresh claim, and a replacement after retention, forward without asking") {
  ProtocolOptions o = test_options();
  o.reconcile = true;
  SUBCASE("claim") {
    Run r(o);
    r(Begin{});
    CHECK(r(won(1, 5)).step == Step::forward);
  }
  SUBCASE("replacement") {
    Run r(o);
    r(Begin{});
    RowView old = completed(kOtherFp, 23);
    old.expired = true;
    REQUIRE(r(lost_with(old)).step == Step::replace);
    CHECK(r(Acquired{Ownership{2, 30}}).step == Step::forward);
  }
}

// ---- same_payload_new_key ------------------------------------------------------------------

namespace {

ProtocolOptions noting(bool reject) {
  ProtocolOptions o = test_options();
  o.note_payload = true;
  o.reject_same_payload = reject;
  return o;
}

}  // namespace

TEST_CASE("same payload: a won claim notes its payload before it forwards; no detection, it forwards") {
  for (const bool reject : {false, true}) {
    INFO("reject " << reject);
    Run r(noting(reject));
    r(Begin{});
    CHECK(r(won(1, 5)).step == Step::note_payload);
    const auto fwd = r(PayloadNoted{false});
    CHECK(fwd.step == Step::forward);
    CHECK(fwd.owner == Ownership{1, 5});
  }
}

TEST_CASE("same payload: detected, count and warn forward; reject releases and answers, forwarding nothing") {
  Run counting(noting(false));
  counting(Begin{});
  REQUIRE(counting(won(1, 5)).step == Step::note_payload);
  CHECK(counting(PayloadNoted{true}).step == Step::forward);

  Run rejecting(noting(true));
  rejecting(Begin{});
  REQUIRE(rejecting(won(1, 5)).step == Step::note_payload);
  const auto release = rejecting(PayloadNoted{true});
  CHECK(release.step == Step::release);
  CHECK(release.fence == 5);
  SUBCASE("released") { check_answer(rejecting(Written{true}), Answer::payload_reused); }
  // Fenced or not written, nothing was forwarded: the refusal stays the answer.
  SUBCASE("fenced") { check_answer(rejecting(Written{false}), Answer::payload_reused, Fenced::release); }
  SUBCASE("store failed") { check_answer(rejecting(StoreFailed{}), Answer::payload_reused); }
}

TEST_CASE("same payload: a failed note forwards under count, fails closed under reject") {
  Run counting(noting(false));
  counting(Begin{});
  REQUIRE(counting(won(1, 5)).step == Step::note_payload);
  CHECK(counting(StoreFailed{}).step == Step::forward);

  Run rejecting(noting(true));
  rejecting(Begin{});
  REQUIRE(rejecting(won(1, 5)).step == Step::note_payload);
  REQUIRE(rejecting(StoreFailed{}).step == Step::release);
  check_answer(rejecting(Written{true}), Answer::store_unavailable);
}

TEST_CASE("same payload: duplicates never note; a takeover and a replacement do, and a takeover still reconciles") {
  // A lost claim is a retry of a key seen before: replayed, or waiting, without a note.
  Run dup(noting(true));
  dup(Begin{});
  check_answer(dup(lost_with(completed())), Answer::replay);

  ProtocolOptions o = noting(true);
  o.reconcile = true;
  Run take(o);
  take(Begin{});
  REQUIRE(take(lost_with(running(0ms, 17))).step == Step::take_over);
  REQUIRE(take(Acquired{Ownership{2, 18}}).step == Step::note_payload);
  const auto ask = take(PayloadNoted{false});
  CHECK(ask.step == Step::reconcile);
  CHECK(ask.owner == Ownership{2, 18});

  Run replace(noting(true));
  replace(Begin{});
  RowView old = completed(kOtherFp, 23);
  old.expired = true;
  REQUIRE(replace(lost_with(old)).step == Step::replace);
  REQUIRE(replace(Acquired{Ownership{2, 30}}).step == Step::note_payload);
  // A takeover into a payload another key holds is refused like the claim was.
  REQUIRE(replace(PayloadNoted{true}).step == Step::release);
  check_answer(replace(Written{true}), Answer::payload_reused);
}

TEST_CASE("same payload: off, nothing is noted") {
  Run r;
  r(Begin{});
  CHECK(r(won(1, 5)).step == Step::forward);
}
