#include "idempotency/decision.hpp"

namespace idem::idempotency {

// The order of the checks is the contract; each step says why it sits where it does.
Decision decide(const Situation& s) {
  // The owner released its claim (or cleanup purged it) between our INSERT and read.
  if (!s.row) return Decision::claim_again;
  const RowView& row = *s.row;

  // Retention ended: the old operation is over, so this is a new one and its
  // fingerprint and principal are irrelevant. An in_progress row whose lease is still
  // live is NOT over, however old: its owner may be about to complete it, and replacing
  // it would run the operation twice.
  if (row.expired && (row.completed || row.lease_expired)) return Decision::replace_expired;

  // Before the principal: a mismatch says nothing about the stored response, and the
  // client must learn it reused a key, whoever it is.
  if (s.fingerprint != row.fingerprint) return Decision::reject_mismatch;

  // Before replay AND before take-over: another principal must neither read the stored
  // response nor become the owner of its operation.
  if (s.check_principal && s.principal != row.principal) return Decision::forbid;

  if (row.completed) return Decision::replay;
  if (row.lease_expired) return Decision::take_over;
  return s.wait_budget_left ? Decision::wait : Decision::answer_in_progress;
}

std::string_view to_string(Decision a) {
  switch (a) {
    case Decision::claim_again: return "claim_again";
    case Decision::replace_expired: return "replace_expired";
    case Decision::reject_mismatch: return "reject_mismatch";
    case Decision::forbid: return "forbid";
    case Decision::replay: return "replay";
    case Decision::take_over: return "take_over";
    case Decision::wait: return "wait";
    case Decision::answer_in_progress: return "answer_in_progress";
  }
  return "unknown";
}

}  // namespace idem::idempotency
