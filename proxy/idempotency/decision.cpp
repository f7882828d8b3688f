#include "idempotency/decision.hpp"

namespace idem::idempotency {

// The order of the checks is the contract; each step says why it sits where it does.
Action decide(const Situation& s) {
  // The owner released its claim (or cleanup purged it) between our INSERT and read.
  if (!s.row) return Action::claim_again;
  const RowView& row = *s.row;

  // Retention ended: the old operation is over, so this is a new one and its
  // fingerprint and principal are irrelevant. An in_progress row whose lease is still
  // live is NOT over, however old: its owner may be about to complete it, and replacing
  // it would run the operation twice.
  if (row.expired && (row.completed || row.lease_expired)) return Action::replace_expired;

  // Before the principal: a mismatch says nothing about the stored response, and the
  // client must learn it reused a key, whoever it is.
  if (s.fingerprint != row.fingerprint) return Action::reject_mismatch;

  // Before replay AND before take-over: another principal must neither read the stored
  // response nor become the owner of its operation.
  if (s.check_principal && s.principal != row.principal) return Action::forbid;

  if (row.completed) return Action::replay;
  if (row.lease_expired) return Action::take_over;
  return s.wait_budget_left ? Action::wait : Action::answer_in_progress;
}

std::string_view to_string(Action a) {
  switch (a) {
    case Action::claim_again: return "claim_again";
    case Action::replace_expired: return "replace_expired";
    case Action::reject_mismatch: return "reject_mismatch";
    case Action::forbid: return "forbid";
    case Action::replay: return "replay";
    case Action::take_over: return "take_over";
    case Action::wait: return "wait";
    case Action::answer_in_progress: return "answer_in_progress";
  }
  return "unknown";
}

}  // namespace idem::idempotency
