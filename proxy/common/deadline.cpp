#include "common/deadline.hpp"

#include <boost/asio/steady_timer.hpp>

namespace idem {

struct LazyDeadline::State {
  State(const asio::any_io_executor& executor, std::function<void()> expiry)
      : timer(executor), on_expiry(std::move(expiry)) {}

  asio::steady_timer timer;
  DeadlineBook book;
  std::function<void()> on_expiry;
  std::uint64_t waits = 0;
};

// The handler owns a reference to the state: it may run after the owner is gone, and
// must then find a live (if stopped) object.
void LazyDeadline::start_wait(const std::shared_ptr<State>& state) {
  const auto generation = state->book.start_wait();
  ++state->waits;
  // Cancels a pending wait: its handler sees a stale generation.
  state->timer.expires_at(state->book.wait_until());
  state->timer.async_wait([state, generation](const error_code& ec) {
    switch (state->book.fired(generation, ec.failed(), SteadyClock::now())) {
      case DeadlineBook::Fired::wait_again:
        start_wait(state);
        return;
      case DeadlineBook::Fired::expired:
        state->on_expiry();
        return;
      case DeadlineBook::Fired::stale:
      case DeadlineBook::Fired::idle:
        return;
    }
  });
}

LazyDeadline::LazyDeadline(const asio::any_io_executor& executor, std::function<void()> on_expiry)
    : state_(std::make_shared<State>(executor, std::move(on_expiry))) {}

LazyDeadline::~LazyDeadline() { stop(); }

void LazyDeadline::arm(SteadyClock::time_point deadline) {
  if (state_->book.arm(deadline)) start_wait(state_);
}

void LazyDeadline::disarm() noexcept { state_->book.disarm(); }

bool LazyDeadline::expired() const noexcept { return state_->book.expired(); }

void LazyDeadline::stop() noexcept {
  state_->book.stop();
  state_->timer.cancel();
}

std::uint64_t LazyDeadline::waits_started() const noexcept { return state_->waits; }

}  // namespace idem
