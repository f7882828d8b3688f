#include "idempotency/protocol.hpp"

#include <algorithm>

namespace idem::idempotency {

// One handler per event. Each first checks that the event answers the action asked for
// last (the phase); anything else is a driver defect, which ends the request without
// another store call (unexpected()).

Action Protocol::resume(const Event& event, SteadyClock::time_point now) {
  if (phase_ == Phase::done) return unexpected();
  return std::visit([&](const auto& e) { return on(e, now); }, event);
}

Action Protocol::on(const Begin&, SteadyClock::time_point) {
  if (phase_ != Phase::start) return unexpected();
  return step(Phase::claiming, Step::claim);
}

Action Protocol::on(const Claimed& e, SteadyClock::time_point now) {
  if (phase_ != Phase::claiming) return unexpected();
  if (e.owner) return acquired(*e.owner, false);
  // Lost: from here on this request answers from the record, within `wait` of its first
  // loss (a later claim_again round keeps that deadline).
  if (!settling_) {
    settling_ = true;
    wait_deadline_ = now + options_.wait;
    poll_ = options_.first_poll;
  }
  if (e.row_read) return decide_on(e.row, now);
  return step(Phase::reading, Step::read);
}

Action Protocol::on(const RowRead& e, SteadyClock::time_point now) {
  if (phase_ == Phase::checking) return check_backend_record(e.row);
  if (phase_ != Phase::reading) return unexpected();
  return decide_on(e.row, now);
}

Action Protocol::on(const Acquired& e, SteadyClock::time_point) {
  if (phase_ != Phase::acquiring) return unexpected();
  if (e.owner) return acquired(*e.owner, taking_over_);
  // Someone else took it over or replaced it first: look again.
  return step(Phase::reading, Step::read);
}

// This request owns the record now (a won claim, a replacement, a takeover). On
// same_payload_new_key routes every attempt notes its payload before it forwards, so that
// under reject a detection comes before anything reaches the backend; a takeover notes too,
// so that a rejected claim whose release failed cannot be taken over into a forward.
Action Protocol::acquired(const store::Ownership& owner, bool takeover) {
  owner_ = owner;
  noted_takeover_ = takeover;
  if (options_.note_payload) return step(Phase::noting, Step::note_payload);
  return proceed_as_owner();
}

// A takeover's predecessor ended with its outcome unknown (a timeout, a crash mid-call):
// the backend may be asked first whether the operation happened.
Action Protocol::proceed_as_owner() {
  if (noted_takeover_ && options_.reconcile) {
    Action a = step(Phase::reconciling, Step::reconcile);
    a.owner = owner_;
    return a;
  }
  return own(owner_);
}

// Registered now: an owner in this process that finishes from here on wakes us. The row
// that asked for the wait was read before, and its owner may have finished in between
// with its wake-up gone to nobody: read again before sleeping.
Action Protocol::on(const Watching&, SteadyClock::time_point) {
  if (phase_ != Phase::watching) return unexpected();
  watching_ = true;
  return step(Phase::reading, Step::read);
}

Action Protocol::on(const Waited&, SteadyClock::time_point) {
  if (phase_ != Phase::waiting) return unexpected();
  return step(Phase::reading, Step::read);
}

Action Protocol::on(const Forwarded& e, SteadyClock::time_point) {
  if (phase_ != Phase::forwarding) return unexpected();
  switch (e.result) {
    case UpstreamResult::answered:
      // A backend that recorded this very answer in its own transaction has done the
      // completion: the record committed before the response was sent.
      if (e.backend == BackendRecord::confirmed) return finish(Answer::recorded);
      // One that recorded something else: the record wins, but only the row can tell
      // whether that record is this claim's.
      if (e.backend == BackendRecord::differs) {
        storable_ = e.storable;
        return step(Phase::checking, Step::read);
      }
      return record_or_release(e.storable);
    case UpstreamResult::not_sent:
      // Nothing reached the backend: free the key so the retry starts clean.
      pending_ = Answer::not_sent;
      return step(Phase::releasing, Step::release, owner_.fence);
    case UpstreamResult::unknown:
    case UpstreamResult::invalid:
      // The backend may have acted. Keep the row but end the lease now, so the next retry
      // takes over at once with a higher attempt and the same operation id, which lets
      // the backend find its own earlier result.
      pending_ = e.result == UpstreamResult::unknown ? Answer::timed_out : Answer::invalid_response;
      return step(Phase::expiring, Step::expire_lease, owner_.fence);
  }
  return unexpected();
}

Action Protocol::on(const Written& e, SteadyClock::time_point now) {
  if (phase_ == Phase::releasing) {
    if (e.written) return finish(pending_);
    fenced_ = Fenced::release;
    // "Not sent" stays the truth about this request, fenced or not (so do the refusals
    // that come before any forward). An answer the backend gave to a superseded attempt is
    // not the key's: answer from the record instead.
    if (pending_ == Answer::not_sent || pending_ == Answer::payload_reused ||
        pending_ == Answer::store_unavailable) {
      return finish(pending_);
    }
    return settle_fenced(Fenced::release, now);
  }
  if (phase_ == Phase::expiring) {
    // There is no answer to hide: the outcome is unknown either way.
    if (!e.written) fenced_ = Fenced::lease_expiry;
    return finish(pending_);
  }
  return unexpected();
}

Action Protocol::on(const Completed& e, SteadyClock::time_point now) {
  if (phase_ != Phase::completing) return unexpected();
  // already_recorded: an earlier try of this completion committed after all.
  if (e.completion == store::Completion::fenced) return settle_fenced(Fenced::completion, now);
  return finish(Answer::recorded);
}

Action Protocol::on(const Refetched& e, SteadyClock::time_point) {
  if (phase_ != Phase::refetching) return unexpected();
  switch (e.result) {
    case RefetchResult::fetched: return finish(Answer::refetched);
    case RefetchResult::refused: return finish(Answer::refetch_refused);
    case RefetchResult::failed: break;
  }
  return finish(Answer::refetch_failed);
}

// Found: the operation happened, and its answer (the driver holds it as the upstream's)
// is recorded as if the upstream had just sent it. Not found: it is forwarded again with
// this attempt. Not known: nothing is forwarded on a guess; the lease ends now so that the
// next retry takes over and asks again.
Action Protocol::on(const Reconciled& e, SteadyClock::time_point) {
  if (phase_ != Phase::reconciling) return unexpected();
  switch (e.result) {
    case ReconcileResult::found: return step(Phase::completing, Step::complete, owner_.fence);
    case ReconcileResult::not_found: return own(owner_);
    case ReconcileResult::failed: break;
  }
  pending_ = Answer::reconcile_failed;
  return step(Phase::expiring, Step::expire_lease, owner_.fence);
}

// Detected under reject: the claim goes (nothing was forwarded, so the key stays free for
// the client's retry with the earlier key, or after the window) and the answer says why.
// Otherwise the request goes on as the owner; counting and warning are the driver's.
Action Protocol::on(const PayloadNoted& e, SteadyClock::time_point) {
  if (phase_ != Phase::noting) return unexpected();
  if (e.detected && options_.reject_same_payload) {
    pending_ = Answer::payload_reused;
    return step(Phase::releasing, Step::release, owner_.fence);
  }
  return proceed_as_owner();
}

Action Protocol::on(const StoreFailed&, SteadyClock::time_point) {
  switch (phase_) {
    case Phase::noting:
      // The claim holds; only the note failed. Counting and warning are no reason to stop
      // an order. Refusing is, and it cannot be decided without the note: fail closed,
      // release the claim and answer 503, as for any store failure before a forward.
      if (!options_.reject_same_payload) return proceed_as_owner();
      pending_ = Answer::store_unavailable;
      return step(Phase::releasing, Step::release, owner_.fence);
    case Phase::checking:
      // The backend says it recorded an answer; which one is not known: no answer goes out
      // that a retry might not replay.
      return finish(Answer::unrecorded);
    case Phase::claiming:
    case Phase::reading:
    case Phase::acquiring:
      // Fail closed: nothing is forwarded without the store.
      return finish(Answer::store_unavailable);
    case Phase::completing:
      // One retry covers a pooled connection that died in between; then the client gets
      // 503, never the unrecorded answer (the row keeps its lease until it lapses).
      if (++completion_failures_ < 2) return step(Phase::completing, Step::complete, owner_.fence);
      return finish(Answer::unrecorded);
    case Phase::releasing:
    case Phase::expiring:
      // The row keeps its lease until it lapses; then a retry takes over, which the
      // fencing token makes safe. The client's answer does not depend on this write.
      return finish(pending_);
    default:
      return unexpected();
  }
}

// The order of the checks is decide()'s; this adds what comes next for each.
Action Protocol::decide_on(const std::optional<RowView>& row, SteadyClock::time_point now) {
  if (++rounds_ > options_.max_rounds) return finish(Answer::in_progress);
  Situation sit;
  sit.row = row;
  sit.fingerprint = options_.fingerprint;
  sit.principal = options_.principal;
  sit.check_principal = options_.check_principal;
  sit.wait_budget_left = now < wait_deadline_;
  const Action decision = [&] {
    switch (decide(sit)) {
      case Decision::claim_again: return step(Phase::claiming, Step::claim);
      case Decision::replace_expired:
        taking_over_ = false;
        return step(Phase::acquiring, Step::replace, row->fence);
      case Decision::take_over:
        taking_over_ = true;
        return step(Phase::acquiring, Step::take_over, row->fence);
      case Decision::reject_mismatch: return finish(Answer::mismatch);
      case Decision::forbid: return finish(Answer::forbidden);
      case Decision::replay:
        // A record whose answer names its resource is re-fetched: the current
        // representation, and the backend's say on whether this client may see it.
        if (options_.refetch && row->has_resource) return step(Phase::refetching, Step::refetch);
        return finish(Answer::replay);
      case Decision::answer_in_progress: return finish(Answer::in_progress);
      case Decision::wait: break;
    }
    if (!watching_) return step(Phase::watching, Step::watch);
    auto until = std::min(wait_deadline_, now + poll_);
    // Wake when the owner's lease runs out, to take over without waiting a full poll.
    if (row->lease_remaining > Millis{0}) {
      until = std::min(until, now + row->lease_remaining + Millis{5});
    }
    poll_ = std::min(options_.max_poll, poll_ * 2);
    Action wait = step(Phase::waiting, Step::wait);
    wait.until = until;
    return wait;
  }();
  // A fenced owner already ran its attempt: it must not become an owner again. Its
  // client retries into whatever the record says by then.
  const bool would_own = decision.step == Step::claim || decision.step == Step::replace ||
                         decision.step == Step::take_over;
  if (role_ == Role::fenced_owner && would_own) return finish(Answer::fenced_unrecorded);
  return decision;
}

// The response goes out only after its record commits, so every later retry sees exactly
// what this client saw. Transient answers (5xx, 408, 425, 429 by default, or the backend's
// "release") must not stick to the key.
Action Protocol::record_or_release(bool storable) {
  if (storable) return step(Phase::completing, Step::complete, owner_.fence);
  pending_ = Answer::released;
  return step(Phase::releasing, Step::release, owner_.fence);
}

// The backend recorded an answer other than the one it sent. Completed under this claim's
// fence: that record is the operation's answer, and the client gets it. Otherwise the
// backend recorded nothing of this claim after all (its transaction rolled back, or the
// marker lied): the sidecar completes or releases as usual, fenced if need be.
Action Protocol::check_backend_record(const std::optional<RowView>& row) {
  if (row && row->completed && row->fence == owner_.fence) return finish(Answer::backend_recorded);
  return record_or_release(storable_);
}

Action Protocol::own(const store::Ownership& owner) {
  owner_ = owner;
  Action a = step(Phase::forwarding, Step::forward);
  a.owner = owner;
  return a;
}

// A fenced owner never answers with its own, unrecorded response: it reads the record and
// answers as a duplicate would, within `wait` from now.
Action Protocol::settle_fenced(Fenced what, SteadyClock::time_point now) {
  fenced_ = what;
  role_ = Role::fenced_owner;
  settling_ = true;
  wait_deadline_ = now + options_.wait;
  poll_ = options_.first_poll;
  rounds_ = 0;
  return step(Phase::reading, Step::read);
}

Action Protocol::step(Phase next, Step what, std::int64_t fence) {
  phase_ = next;
  Action a;
  a.step = what;
  a.fence = fence;
  return a;
}

Action Protocol::finish(Answer answer) {
  phase_ = Phase::done;
  Action a;
  a.step = Step::answer;
  a.answer = answer;
  a.fenced = fenced_;
  a.from_record = role_ == Role::fenced_owner;
  return a;
}

// An event the last action cannot produce is a driver defect. The request still ends,
// with no further store call or forward.
Action Protocol::unexpected() {
  phase_ = Phase::done;
  Action a;
  a.step = Step::answer;
  a.answer = Answer::store_unavailable;
  a.fenced = fenced_;
  return a;
}

std::string_view to_string(Step s) {
  switch (s) {
    case Step::claim: return "claim";
    case Step::read: return "read";
    case Step::take_over: return "take_over";
    case Step::replace: return "replace";
    case Step::watch: return "watch";
    case Step::wait: return "wait";
    case Step::forward: return "forward";
    case Step::release: return "release";
    case Step::expire_lease: return "expire_lease";
    case Step::complete: return "complete";
    case Step::refetch: return "refetch";
    case Step::reconcile: return "reconcile";
    case Step::note_payload: return "note_payload";
    case Step::answer: return "answer";
  }
  return "unknown";
}

std::string_view to_string(Answer a) {
  switch (a) {
    case Answer::none: return "none";
    case Answer::replay: return "replay";
    case Answer::recorded: return "recorded";
    case Answer::backend_recorded: return "backend_recorded";
    case Answer::released: return "released";
    case Answer::not_sent: return "not_sent";
    case Answer::timed_out: return "timed_out";
    case Answer::invalid_response: return "invalid_response";
    case Answer::mismatch: return "mismatch";
    case Answer::forbidden: return "forbidden";
    case Answer::in_progress: return "in_progress";
    case Answer::store_unavailable: return "store_unavailable";
    case Answer::unrecorded: return "unrecorded";
    case Answer::fenced_unrecorded: return "fenced_unrecorded";
    case Answer::refetched: return "refetched";
    case Answer::refetch_refused: return "refetch_refused";
    case Answer::refetch_failed: return "refetch_failed";
    case Answer::reconcile_failed: return "reconcile_failed";
    case Answer::payload_reused: return "payload_reused";
  }
  return "unknown";
}

}  // namespace idem::idempotency
