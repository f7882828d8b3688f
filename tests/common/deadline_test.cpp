// common/deadline.hpp. The bookkeeping is tested as step sequences with made-up times (no
// clock, no timer), including the property both users rely on: phases that keep arming
// later deadlines start about one timer wait per timeout, not one per phase. A few cases
// drive the real Asio timer with short deadlines to show the wiring.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/deadline.hpp"

using namespace idem;
using namespace std::chrono_literals;
using Fired = DeadlineBook::Fired;
using TimePoint = SteadyClock::time_point;

namespace {

const TimePoint t0{};  // the book never reads the clock: any origin will do

}  // namespace

TEST_CASE("deadline book: the first arm starts a wait, a later deadline does not") {
  DeadlineBook b;
  CHECK_FALSE(b.pending());
  REQUIRE(b.arm(t0 + 100ms));
  const auto g = b.start_wait();
  CHECK(b.pending());
  CHECK(b.wait_until() == t0 + 100ms);

  b.disarm();
  CHECK_FALSE(b.arm(t0 + 150ms));  // the pending wait ends first: it will look again
  CHECK(b.arm(t0 + 50ms));         // earlier than the pending wait: restart it
  const auto g2 = b.start_wait();
  CHECK(b.wait_until() == t0 + 50ms);
  CHECK(b.fired(g, true, t0 + 10ms) == Fired::stale);  // the replaced wait
  CHECK(b.pending());
  CHECK(b.fired(g2, false, t0 + 50ms) == Fired::expired);
  CHECK(b.expired());
  CHECK_FALSE(b.pending());
}

TEST_CASE("deadline book: a wait that fires early waits again; a disarmed one goes idle") {
  DeadlineBook b;
  REQUIRE(b.arm(t0 + 100ms));
  auto g = b.start_wait();
  b.disarm();
  CHECK_FALSE(b.arm(t0 + 300ms));
  CHECK(b.fired(g, false, t0 + 100ms) == Fired::wait_again);
  g = b.start_wait();
  CHECK(b.wait_until() == t0 + 300ms);
  CHECK_FALSE(b.expired());

  b.disarm();
  CHECK(b.fired(g, false, t0 + 300ms) == Fired::idle);
  CHECK_FALSE(b.expired());
  CHECK_FALSE(b.pending());
  CHECK(b.arm(t0 + 400ms));  // nothing pending: the next arm starts a wait again
}

TEST_CASE("deadline book: expired() survives disarm and is cleared by the next arm") {
  DeadlineBook b;
  REQUIRE(b.arm(t0 + 10ms));
  const auto g = b.start_wait();
  CHECK(b.fired(g, false, t0 + 11ms) == Fired::expired);
  b.disarm();
  CHECK(b.expired());  // the caller reads it after its operation returned
  b.arm(t0 + 20ms);
  CHECK_FALSE(b.expired());
}

TEST_CASE("deadline book: cancelled and stopped waits never expire") {
  DeadlineBook b;
  REQUIRE(b.arm(t0 + 10ms));
  auto g = b.start_wait();
  CHECK(b.fired(g, true, t0 + 20ms) == Fired::idle);
  CHECK_FALSE(b.expired());

  REQUIRE(b.arm(t0 + 30ms));
  g = b.start_wait();
  b.stop();
  CHECK(b.fired(g, false, t0 + 40ms) == Fired::idle);
  CHECK_FALSE(b.expired());
  CHECK(b.deadline() == DeadlineBook::kNone);
}

// The server arms idle, header, body and write deadlines for every request; the upstream
// pool arms one per exchange. With a timeout of one second and a phase every millisecond,
// ten seconds of traffic must start about ten waits, not ten thousand.
TEST_CASE("deadline book: keep-alive traffic starts about one wait per timeout") {
  constexpr auto timeout = 1000ms;
  constexpr auto phase = 1ms;
  DeadlineBook b;
  std::uint64_t waits = 0;
  std::uint64_t generation = 0;
  TimePoint now = t0;
  for (int i = 0; i < 10'000; ++i) {
    // The pending wait fires when its time has come (as the timer would).
    while (b.pending() && now >= b.wait_until()) {
      const auto fired = b.fired(generation, false, now);
      REQUIRE(fired != Fired::expired);  // every phase ends long before its deadline
      if (fired == Fired::wait_again) {
        generation = b.start_wait();
        ++waits;
      }
    }
    if (b.arm(now + timeout)) {
      generation = b.start_wait();
      ++waits;
    }
    now += phase;
    b.disarm();
  }
  CHECK(waits >= 10);
  CHECK(waits <= 11);
}

// ----------------------------------------------------------------- with an Asio timer

namespace {

struct Clocked {
  asio::io_context io;
  int expiries = 0;
  TimePoint expired_at{};
  LazyDeadline deadline{io.get_executor(), [this] {
                          ++expiries;
                          expired_at = SteadyClock::now();
                        }};
};

}  // namespace

TEST_CASE("lazy deadline: an armed deadline expires once, not before its time") {
  Clocked c;
  const auto start = SteadyClock::now();
  c.deadline.arm(start + 30ms);
  c.io.run();  // returns when the last wait ended
  CHECK(c.expiries == 1);
  CHECK(c.deadline.expired());
  CHECK(c.expired_at >= start + 30ms);
  CHECK(c.deadline.waits_started() == 1);
}

TEST_CASE("lazy deadline: a disarmed deadline never expires") {
  Clocked c;
  c.deadline.arm_after(20ms);
  c.deadline.disarm();
  c.io.run();  // the one wait fires, finds nothing armed and ends
  CHECK(c.expiries == 0);
  CHECK_FALSE(c.deadline.expired());
}

TEST_CASE("lazy deadline: a later deadline is waited for by the same timer") {
  Clocked c;
  const auto start = SteadyClock::now();
  c.deadline.arm(start + 20ms);
  c.deadline.disarm();
  c.deadline.arm(start + 60ms);  // no new wait: the pending one looks again at 20 ms
  CHECK(c.deadline.waits_started() == 1);
  c.io.run();
  CHECK(c.expiries == 1);
  CHECK(c.expired_at >= start + 60ms);
  CHECK(c.deadline.waits_started() == 2);
}

TEST_CASE("lazy deadline: an earlier deadline replaces the pending wait") {
  Clocked c;
  const auto start = SteadyClock::now();
  c.deadline.arm(start + 10s);
  c.deadline.arm(start + 20ms);
  CHECK(c.deadline.waits_started() == 2);
  c.io.run();  // would take ten seconds if the first wait were still the one pending
  CHECK(c.expiries == 1);
  CHECK(SteadyClock::now() - start < 5s);
}

TEST_CASE("lazy deadline: stop and destruction cancel the wait at once") {
  SUBCASE("stop") {
    Clocked c;
    const auto start = SteadyClock::now();
    c.deadline.arm(start + 10s);
    c.deadline.stop();
    c.io.run();  // the cancelled wait ends now, not in ten seconds
    CHECK(c.expiries == 0);
    CHECK(SteadyClock::now() - start < 5s);
    c.deadline.arm(start);  // stopped for good
    c.io.restart();
    c.io.run();
    CHECK(c.expiries == 0);
  }
  SUBCASE("destruction") {
    asio::io_context io;
    int expiries = 0;
    const auto start = SteadyClock::now();
    {
      LazyDeadline d(io.get_executor(), [&] { ++expiries; });
      d.arm(start + 10s);
    }
    io.run();
    CHECK(expiries == 0);
    CHECK(SteadyClock::now() - start < 5s);
  }
}

// A wait that has already completed cannot be cancelled any more; its handler must still
// find the deadline stopped and do nothing.
TEST_CASE("lazy deadline: a wait already completed when stopped does not expire") {
  Clocked c;
  c.deadline.arm(SteadyClock::now() - 1ms);  // due at once
  // Runs before the timer's handler: that one is queued only when the loop checks timers.
  asio::post(c.io, [&] { c.deadline.stop(); });
  c.io.run();
  CHECK(c.expiries == 0);
}
