#pragma once
// The idempotency decision as a pure function: what a request that did not win the
// claim must do, given the row it read. The request protocol (protocol.hpp) asks it on
// every row it reads and turns its answer into the next store call, wait or answer.
#include <cstdint>
#include <optional>
#include <string_view>

#include "common/types.hpp"

namespace idem::idempotency {

struct RowView {
  std::string_view fingerprint;
  std::string_view principal;  // empty = none recorded
  bool completed = false;
  std::int64_t attempt = 0;
  bool lease_expired = false;  // meaningful for in_progress rows
  bool expired = false;        // retention passed
  std::int64_t fence = 0;      // the fencing token of the claim that holds it
  Millis lease_remaining{0};   // > 0 while a live lease runs (the database's clock)
  bool has_resource = false;   // completed with a resource id (a Location) to re-fetch
};

struct Situation {
  std::optional<RowView> row;  // nullopt: the row vanished (released or purged)
  std::string_view fingerprint;
  std::string_view principal;   // hash of this request's principal ("" = none)
  bool check_principal = false;  // route/tenant config sets principal_header
  bool wait_budget_left = false;  // time remains within the route's `wait`
};

enum class Decision {
  claim_again,         // no row: try the INSERT again
  replace_expired,     // retention passed and no live lease: replace as a new operation
  reject_mismatch,     // same scope and key, other fingerprint: mismatch_status
  forbid,              // another principal's record: 403
  replay,              // completed: answer the stored response
  take_over,           // in_progress, lease expired: CAS to attempt + 1 and forward
  wait,                // in_progress, live lease, time left: wait for a change, read again
  answer_in_progress,  // in_progress, live lease, wait used up: 409 + Retry-After
};

Decision decide(const Situation& s);

std::string_view to_string(Decision d);

}  // namespace idem::idempotency
