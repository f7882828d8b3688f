#pragma once
// The checker of a fault-injection run: the history (what every client saw) against the
// rows left in PostgreSQL once every operation settled. Pure: it reads values, never a
// socket or a database, so each rule is unit-tested with hand-made histories.
//
// The rules, per operation (tenant, key):
//   no_definite_answer        every entry ends with a definite answer
//   unexpected_answer         a definite answer is 201, 409 idempotency_key_reused or the
//                             API's 422 operation_id_reused; nothing else
//   divergent_answers         every result (definite, not a key_reused refusal) is the same
//                             status and the same bytes
//   two_bodies_succeeded      results come from one body only
//   same_body_refused         once a result was delivered, key_reused refuses the other
//                             body only (before, the other body may hold the key)
//   no_result                 some body got a result
//   answer_for_other_request  a 201 describes the order its request asked for
//   foreign_order             a 201 names an order of this tenant and this key (customer),
//                             never another tenant's or another key's
//   second_first_answer       at most one result is a first answer (not replayed); a second
//                             one is an owner that answered with its own unrecorded result
//   executed_after_answer     once a result was delivered, every later request (sent after
//   in_progress_after_answer  it arrived) is a replay or a key_reused refusal: never a
//   forwarded_after_answer    first answer, never in progress, never forwarded again
//   lost_record               a result delivered to a client is held by a completed record
//   record_differs            ... with that status and those bytes
// and over the whole run:
//   stuck_in_progress         no record is still in progress
//   duplicate_order           at most one order per operation (tenant and customer, which
//                             names the key) and per tenant and checkout
//   fencing_token_reused      no two requests that reached the backend for one operation
//                             carried the same fencing token (the sidecar forwards once
//                             per claim: two claims of the key shared a token)
//   forwarded_without_claim   every request that reached the backend carried the fencing
//                             token of a claim the store still holds the trace of (a
//                             witness row written in the claim's own transaction): nothing
//                             was forwarded on a claim that was not durable, e.g. one a
//                             failover lost. Checked when the run witnessed claims.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "history.hpp"
#include "workload.hpp"

namespace idem::chaos {

struct OrderRow {
  std::string order_id;
  std::string tenant;
  std::string customer_id;
  std::int64_t amount = 0;
  std::optional<std::string> checkout_id;
  std::optional<std::string> operation_id;
};

struct RecordRow {
  std::string tenant;
  std::string key;
  std::string state;  // in_progress | completed
  std::optional<int> status;
  std::optional<std::string> body;
  std::int64_t attempt_token = 0;
};

// One request that reached the order API (demo_orders.arrivals, --record-arrivals).
struct ArrivalRow {
  std::string tenant;
  std::string operation_id;
  std::int64_t attempt = 0;
  std::optional<std::int64_t> fencing_token;  // nullopt: the sidecar sent none
};

// One claim, takeover or replacement the store committed (chaos_claims, written by a
// trigger in the same transaction as the write that drew the token).
struct ClaimRow {
  std::string tenant;
  std::string operation_id;  // idemproxy_operation_id(tenant, endpoint, key)
  std::int64_t fencing_token = 0;
};

struct Snapshot {
  std::vector<OrderRow> orders;
  std::vector<RecordRow> records;  // the run's route (endpoint) only
  std::vector<ArrivalRow> arrivals;
  std::vector<ClaimRow> claims;
  bool claims_witnessed = false;  // the witness trigger was installed for the whole run
};

struct Violation {
  std::string rule;
  std::string detail;  // names the operation, the entries and times involved
};

struct CheckResult {
  std::vector<Violation> violations;
  std::array<std::size_t, kAnswerClasses> answers{};  // requests by class
  std::size_t requests = 0;
  std::size_t entries = 0;  // entries run (checked)
  std::size_t entries_settled = 0;
  std::size_t operations = 0;           // operations some entry reached
  std::size_t operations_with_order = 0;
  std::size_t orders_without_result = 0;  // orders no client was told about (allowed)
  std::size_t max_attempts = 0;         // of one entry
  std::size_t arrivals = 0;             // requests that reached the backend
  std::size_t arrivals_with_token = 0;
  std::size_t arrivals_with_claim = 0;  // ... whose token a witnessed claim carried
  std::map<std::string, std::size_t> violations_by_rule;
};

// `entries`: how many entries of the plan were run (a prefix of plan.entries).
CheckResult check(const Plan& plan, std::size_t entries, const std::vector<Attempt>& history,
                  const Snapshot& snapshot);

}  // namespace idem::chaos
