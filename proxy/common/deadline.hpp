#pragma once
// A lazy deadline: one timer that guards a sequence of operations (the phases of a client
// request, the steps of an exchange with the backend) without being set and cancelled
// for each of them.
//
// arm() records the deadline and only touches the timer when no wait is pending or the
// pending one is due later; disarm() only forgets the deadline. When the pending wait
// fires it compares the clock with the deadline current at that moment: passed → the
// owner's expiry action runs; later → wait again until then; none → stay idle until the
// next arm(). Phases that arm later and later deadlines (keep-alive traffic) thus cost
// one timer wait per timeout period, not a timer-queue insert, a cancellation and a
// handler call per phase.
//
// The bookkeeping (DeadlineBook) is pure and tested without a clock; LazyDeadline drives
// it with an Asio timer. Not thread-safe: the owner uses it from its executor only.
#include <cstdint>
#include <functional>
#include <memory>

#include <boost/asio/any_io_executor.hpp>

#include "common/types.hpp"

namespace idem {

class DeadlineBook {
 public:
  using time_point = SteadyClock::time_point;
  static constexpr time_point kNone = time_point::max();

  // What a wait that ended means.
  enum class Fired {
    stale,       // a newer wait replaced it: ignore
    idle,        // cancelled, stopped or nothing armed: no wait is pending now
    wait_again,  // the deadline moved later: start a wait for wait_until()
    expired,     // the armed deadline passed: run the expiry action
  };

  // Records `deadline` and clears expired(). True when a wait must be started (no wait is
  // pending, or the pending one ends after `deadline`).
  bool arm(time_point deadline) noexcept {
    expired_ = false;
    deadline_ = deadline;
    return !pending_ || deadline_ < wait_until_;
  }
  // Forgets the deadline; expired() keeps its value so the caller can still read it.
  void disarm() noexcept { deadline_ = kNone; }
  // No deadline may expire any more.
  void stop() noexcept {
    stopped_ = true;
    deadline_ = kNone;
  }

  // A wait until wait_until() (the current deadline) starts; returns its generation.
  std::uint64_t start_wait() noexcept {
    wait_until_ = deadline_;
    pending_ = true;
    return ++generation_;
  }
  // The wait `generation` ended at `now`; `cancelled` when the timer reported an error.
  Fired fired(std::uint64_t generation, bool cancelled, time_point now) noexcept {
    if (generation != generation_) return Fired::stale;
    pending_ = false;
    if (cancelled || stopped_ || deadline_ == kNone) return Fired::idle;
    if (now < deadline_) return Fired::wait_again;
    expired_ = true;
    return Fired::expired;
  }

  bool expired() const noexcept { return expired_; }
  bool pending() const noexcept { return pending_; }
  time_point deadline() const noexcept { return deadline_; }
  time_point wait_until() const noexcept { return wait_until_; }

 private:
  time_point deadline_ = kNone;
  time_point wait_until_{};
  std::uint64_t generation_ = 0;
  bool pending_ = false;
  bool expired_ = false;
  bool stopped_ = false;
};

class LazyDeadline {
 public:
  // `on_expiry` runs on `executor` when an armed deadline passes. It never runs after
  // stop() or the destructor, so it may refer to the owner that holds this object.
  LazyDeadline(const asio::any_io_executor& executor, std::function<void()> on_expiry);
  ~LazyDeadline();
  LazyDeadline(const LazyDeadline&) = delete;
  LazyDeadline& operator=(const LazyDeadline&) = delete;

  void arm(SteadyClock::time_point deadline);
  void arm_after(Millis after) { arm(SteadyClock::now() + after); }
  void disarm() noexcept;
  // Whether the deadline armed last has passed (until the next arm()).
  bool expired() const noexcept;
  // No expiry any more; the pending wait is cancelled, so nothing outlives the owner
  // until the timer's expiry.
  void stop() noexcept;

  // Timer waits started so far (for tests of the once-per-timeout property).
  std::uint64_t waits_started() const noexcept;

 private:
  struct State;  // the timer and the book, shared with the pending wait's handler
  static void start_wait(const std::shared_ptr<State>& state);
  std::shared_ptr<State> state_;
};

}  // namespace idem
