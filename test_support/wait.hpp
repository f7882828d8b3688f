#pragma once
// Deadlines for tests (unit and end-to-end). Nothing in the test support sleeps "long
// enough": a test either waits for an observable condition with a deadline, or fails
// naming what it was waiting for. Failures are exceptions (idem::test::Failure), which
// doctest reports with their message, and which also work from helper threads
// (integration/support/concurrently.hpp).
#include <chrono>
#include <functional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idem::test {

using namespace std::chrono_literals;
using Millis = std::chrono::milliseconds;

// Default deadline for one step (an HTTP exchange, a process start, a condition). Generous
// so a loaded 2-core CI machine does not flake; a passing test never waits for it.
inline constexpr Millis kDefaultTimeout = 10s;

// A harness-detected test failure. The message says what was expected and where.
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws Failure("<file>:<line>: <message>") for the caller's location.
[[noreturn]] void fail(std::string_view message,
                       std::source_location where = std::source_location::current());

// Polls `predicate` (first at once, then at short, growing intervals up to 20 ms) until it
// returns true. On timeout throws Failure naming `description` and the caller's location.
// Exceptions from the predicate propagate unchanged.
void wait_until(const std::function<bool()>& predicate, Millis timeout,
                std::string_view description,
                std::source_location where = std::source_location::current());

// A point in time that several steps share, so a sequence of waits is bounded as a whole.
class Deadline {
 public:
  explicit Deadline(Millis budget) : end_(std::chrono::steady_clock::now() + budget) {}
  bool passed() const { return std::chrono::steady_clock::now() >= end_; }
  // What is left, never negative.
  Millis remaining() const;

 private:
  std::chrono::steady_clock::time_point end_;
};

}  // namespace idem::test
