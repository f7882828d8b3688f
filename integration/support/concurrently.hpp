#pragma once
// Runs the same step on several threads at once, for races the sidecar must win: N
// duplicates of one request arriving together. All threads are created first and then
// released by one latch, so the calls overlap as much as the machine allows instead of
// trickling in while threads start.
#include <cstddef>
#include <exception>
#include <latch>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include "support/wait.hpp"

namespace idem::it {

// What one thread produced: a value, or the exception it threw.
template <class T>
struct Outcome {
  std::optional<T> value;
  std::exception_ptr error;

  bool ok() const { return !error; }
  // The value, or the thread's exception rethrown.
  T& get() {
    if (error) {
      std::rethrow_exception(error);
    }
    return *value;
  }
  // The exception's message ("" when ok), for CHECK messages.
  std::string error_message() const {
    if (!error) {
      return {};
    }
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "non-standard exception";
    }
  }
};

// Calls fn(i) for i in [0, n) on n threads started together; returns the outcomes in order
// of i. Never throws for fn's exceptions: they are collected so the test can assert on all
// of them. fn must bound its own waiting (harness calls all have deadlines); a void fn
// yields Outcome<std::monostate>.
template <class F>
auto concurrently(std::size_t n, F fn) {
  using R = std::invoke_result_t<F&, std::size_t>;
  using V = std::conditional_t<std::is_void_v<R>, std::monostate, R>;
  std::vector<Outcome<V>> outcomes(n);
  std::latch start(static_cast<std::ptrdiff_t>(n));
  const auto worker = [&](std::size_t i) {
    start.arrive_and_wait();
    try {
      if constexpr (std::is_void_v<R>) {
        fn(i);
        outcomes[i].value.emplace();
      } else {
        outcomes[i].value.emplace(fn(i));
      }
    } catch (...) {
      outcomes[i].error = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> threads;
    threads.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      try {
        threads.emplace_back(worker, i);
      } catch (...) {
        // No thread for i and later: count them down so the started ones are not left
        // waiting at the latch (and joined forever), then report the failure.
        start.count_down(static_cast<std::ptrdiff_t>(n - i));
        throw;
      }
    }
  }  // jthreads join here
  return outcomes;
}

// Throws Failure if any call failed, with how many and the first one's message.
template <class T>
void require_all_ok(const std::vector<Outcome<T>>& outcomes) {
  std::size_t failed = 0;
  std::string first;
  for (const auto& o : outcomes) {
    if (!o.ok()) {
      if (failed++ == 0) {
        first = o.error_message();
      }
    }
  }
  if (failed > 0) {
    throw Failure(std::to_string(failed) + " of " + std::to_string(outcomes.size()) +
                             " concurrent calls failed; first: " + first);
  }
}

}  // namespace idem::it
