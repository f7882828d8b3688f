#pragma once
// The request protocol as a sans-io state machine: one protected request, from its claim
// to its answer. It performs nothing. It is resumed with an event (what the last action
// produced) and the current time, and returns the next action; the gateway performs the
// action (a store call, a wait, the upstream exchange) and resumes it with the outcome,
// until the action is an answer. No I/O, no clock, no Asio: every path is testable as a
// sequence of steps (tests/idempotency/protocol_test.cpp).
//
//   claim ──won──▶ [note payload] ──▶ forward ──answered, storable──▶ complete ──▶ answer
//     │  (same_payload_new_key routes: a detection under reject releases, answers 409)
//     │               │ └─answered, transient / not sent──▶ release ──▶ answer
//     │               └─unknown outcome──▶ expire lease ──▶ answer (504/502)
//     lost                                   fenced (completion, release)
//     ▼                                          ▼
//   settle: decide() on the row ◀──────────── settle as a fenced owner (never owns again)
//     ├─ replay / mismatch / forbidden / in progress ──▶ answer
//     ├─ claim again / take over / replace ──won──▶ forward ...
//     └─ wait ──▶ watch (once), read again ──▶ wait until ... ──▶ read ──▶ decide ...
//
// The order of the decisions on a row is decide()'s (decision.hpp); this machine adds what
// happens around them: which store call comes next, how long a duplicate waits, what an
// owner does with the upstream's outcome, and how a fenced owner answers.
#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>

#include "common/types.hpp"
#include "idempotency/decision.hpp"
#include "store/record.hpp"

namespace idem::idempotency {

// ---- Events: the outcome of the action the machine asked for last ---------------------
// Views (RowView's strings) must stay valid until the driver performs the next claim or
// read: a row that came with a lost claim is decided on one step later.

struct Begin {};  // the first resume, before any action

struct Claimed {  // claim
  std::optional<store::Ownership> owner;  // set: the claim was won
  bool row_read = false;                  // lost, with the row read along (row: nullopt = gone)
  std::optional<RowView> row;
};
struct RowRead {  // read
  std::optional<RowView> row;  // nullopt: there is no row
};
struct Acquired {  // take over, replace
  std::optional<store::Ownership> owner;  // nullopt: the compare-and-swap lost
};
struct Watching {};  // watch: the wake-up for this key is registered
struct Waited {};    // wait: woken by the owner, or the time ran out

enum class UpstreamResult {
  answered,  // a complete response; `storable` says whether the route records its status
  not_sent,  // the connection was refused: nothing reached the backend
  unknown,   // timeout or reset after sending: the backend may have acted
  invalid,   // malformed or too large a response: the backend may have acted
};
// On a route with `completion: backend`, what the backend said of its own record.
enum class BackendRecord {
  none,       // it did not record the answer: the sidecar completes as usual
  confirmed,  // it recorded this very answer (the digest it sent back matches)
  differs,    // it says it recorded, but the digest is not this answer's
};
struct Forwarded {  // forward
  UpstreamResult result = UpstreamResult::answered;
  bool storable = false;  // the route's `store` lists, or the backend's directive
  BackendRecord backend = BackendRecord::none;
};
struct Written {  // release, expire lease
  bool written = false;  // false: fenced, another claim owns the record
};
struct Completed {  // complete
  store::Completion completion = store::Completion::recorded;
};
struct StoreFailed {};  // any store action: the store did not answer

// refetch: the resource of a completed record, fetched with the retrying client's own
// credentials (routes with replay.mode: refetch).
enum class RefetchResult {
  fetched,  // 2xx: its current representation answers the replay
  refused,  // 4xx: the backend refuses this client; its answer goes out as is
  failed,   // a 5xx or no answer: a problem, never the stored body
};
struct Refetched {
  RefetchResult result = RefetchResult::failed;
};

// reconcile: whether the operation happened, asked of the backend before a takeover
// forwards again (routes with on_unknown_outcome: reconcile).
enum class ReconcileResult {
  found,      // 2xx: the operation's answer, to record as if the upstream had just sent it
  not_found,  // 404: it did not happen; forward
  failed,     // anything else, or no answer: not known; nothing is forwarded
};
struct Reconciled {
  ReconcileResult result = ReconcileResult::failed;
};

// note_payload: whether a recent request of the same payload had another key (routes
// with same_payload_new_key).
struct PayloadNoted {
  bool detected = false;
};

using Event =
    std::variant<Begin, Claimed, RowRead, Acquired, Watching, Waited, Forwarded, Written,
                 Completed, StoreFailed, Refetched, Reconciled, PayloadNoted>;

// ---- Actions -----------------------------------------------------------------------------

enum class Step {
  claim,         // store.claim(the request's claim)
  read,          // store.read(the record)
  take_over,     // store.take_over(record, fence, lease)
  replace,       // store.replace_expired(the request's claim, fence)
  watch,         // register for the in-process wake-up of this key (no store call)
  wait,          // wait for that wake-up, or until `until`
  forward,       // send the request upstream as `owner` (and keep its lease alive)
  release,       // store.release(record, fence)
  expire_lease,  // store.expire_lease(record, fence)
  complete,      // store.complete(record, fence, the upstream's answer as recorded)
  refetch,       // GET the resource of the row last read, as the retrying client
  reconcile,     // ask the backend about the operation, as `owner` (before any forward)
  note_payload,  // store.note_payload(this claim's payload), right after a won claim
  answer,        // done: answer the client with `answer`
};

enum class Answer {
  none,
  replay,             // the row last read: its stored response
  recorded,           // the upstream's response, now recorded (outcome created)
  backend_recorded,   // the record the backend wrote, which is not the answer it sent: the
                      // record wins (the row last read holds it)
  released,           // the upstream's response, not recorded: the key was released
  not_sent,           // 502: the upstream refused the connection; the key was released
  timed_out,          // 504: outcome unknown; the lease was ended so a retry takes over
  invalid_response,   // 502: outcome unknown, likewise
  mismatch,           // same key, another request
  forbidden,          // another principal's record
  in_progress,        // 409 + Retry-After: the owner still runs
  store_unavailable,  // 503: the store did not answer
  unrecorded,         // 503: the upstream answered, the store did not take the answer
  fenced_unrecorded,  // 503: fenced, and the record holds nothing this request may replay
  refetched,          // the stored status with the resource's current representation
  refetch_refused,    // the backend's refusal of this client's re-fetch, as it sent it
  refetch_failed,     // 502: the re-fetch failed; nothing of the record goes out
  reconcile_failed,   // 503: whether the operation happened is not known; nothing was
                      // forwarded and the next retry asks again
  payload_reused,     // 409: same_payload_new_key: reject — a recent request of this payload
                      // had another key; this claim was released, nothing was forwarded
};

// Which write of this request's own claim was refused because another claim owns the key.
enum class Fenced { no, completion, release, lease_expiry };

struct Action {
  Step step = Step::answer;
  std::int64_t fence = 0;    // take_over, replace: the fence seen; release, expire, complete: ours
  store::Ownership owner;    // forward
  SteadyClock::time_point until{};  // wait
  Answer answer = Answer::none;     // answer
  Fenced fenced = Fenced::no;       // answer: an owner write of this request was fenced
  bool from_record = false;  // answer: a fenced owner's answer, taken from the record
};

struct ProtocolOptions {
  std::string_view fingerprint;  // this request's
  std::string_view principal;    // hash of this request's principal ("" = none)
  bool check_principal = false;
  Millis wait{5000};       // how long a duplicate (or a fenced owner) waits for the owner
  bool refetch = false;    // replay.mode: refetch — a replay re-fetches the record's resource
  bool reconcile = false;  // on_unknown_outcome: reconcile — a takeover asks first
  // same_payload_new_key: a won claim (a new key) notes its payload before it forwards;
  // with reject_same_payload a detection releases the claim and answers payload_reused.
  bool note_payload = false;
  bool reject_same_payload = false;
  Millis first_poll{20};   // the first re-read of a running record; doubled per round
  Millis max_poll{500};
  // A request never needs more than a handful of rounds; the bound only stops a
  // pathological livelock (rows appearing and vanishing) from spinning forever.
  int max_rounds = 256;
};

class Protocol {
 public:
  explicit Protocol(const ProtocolOptions& options) : options_(options) {}

  // `now` is the caller's monotonic clock: waits are computed from it, never read here.
  Action resume(const Event& event, SteadyClock::time_point now);

  // Who holds the record for this request, once it won (attempt 0 before).
  const store::Ownership& owner() const noexcept { return owner_; }

 private:
  enum class Phase {
    start, claiming, reading, acquiring, watching, waiting, forwarding, checking, releasing,
    expiring, completing, refetching, reconciling, noting, done
  };
  enum class Role { duplicate, fenced_owner };

  Action on(const Begin&, SteadyClock::time_point now);
  Action on(const Claimed& e, SteadyClock::time_point now);
  Action on(const RowRead& e, SteadyClock::time_point now);
  Action on(const Acquired& e, SteadyClock::time_point now);
  Action on(const Watching&, SteadyClock::time_point now);
  Action on(const Waited&, SteadyClock::time_point now);
  Action on(const Forwarded& e, SteadyClock::time_point now);
  Action on(const Written& e, SteadyClock::time_point now);
  Action on(const Completed& e, SteadyClock::time_point now);
  Action on(const StoreFailed&, SteadyClock::time_point now);
  Action on(const Refetched& e, SteadyClock::time_point now);
  Action on(const Reconciled& e, SteadyClock::time_point now);
  Action on(const PayloadNoted& e, SteadyClock::time_point now);

  Action decide_on(const std::optional<RowView>& row, SteadyClock::time_point now);
  Action check_backend_record(const std::optional<RowView>& row);
  Action record_or_release(bool storable);
  Action own(const store::Ownership& owner);
  Action acquired(const store::Ownership& owner, bool takeover);
  Action proceed_as_owner();
  Action settle_fenced(Fenced what, SteadyClock::time_point now);
  Action step(Phase next, Step what, std::int64_t fence = 0);
  Action finish(Answer answer);
  Action unexpected();

  ProtocolOptions options_;
  Phase phase_ = Phase::start;
  Role role_ = Role::duplicate;
  store::Ownership owner_;
  bool settling_ = false;  // a claim was lost (or a write fenced): rows are being decided on
  bool watching_ = false;  // the wake-up is registered
  SteadyClock::time_point wait_deadline_{};
  Millis poll_{0};
  int rounds_ = 0;
  int completion_failures_ = 0;
  Answer pending_ = Answer::none;  // the answer a release or lease expiry leads to
  bool storable_ = false;          // while checking a backend's record: the route's choice
  bool taking_over_ = false;       // the acquire in flight is a takeover (not a replacement)
  bool noted_takeover_ = false;    // this request owns the record by a takeover
  Fenced fenced_ = Fenced::no;
};

std::string_view to_string(Step s);
std::string_view to_string(Answer a);

}  // namespace idem::idempotency
