#include "test_support/wait.hpp"

#include <algorithm>
#include <filesystem>
#include <thread>

namespace idem::test {

namespace {

std::string location(const std::source_location& where) {
  return std::filesystem::path(where.file_name()).filename().string() + ":" +
         std::to_string(where.line());
}

}  // namespace

void fail(std::string_view message, std::source_location where) {
  throw Failure(location(where) + ": " + std::string(message));
}

void wait_until(const std::function<bool()>& predicate, Millis timeout,
                std::string_view description, std::source_location where) {
  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + timeout;
  // Start fast so a condition that is nearly true costs almost nothing, then back off so a
  // predicate that does I/O (an HTTP poll of the backend) does not hammer the machine.
  auto interval = 1ms;
  for (;;) {
    if (predicate()) {
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      break;
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        interval, deadline - now));
    interval = std::min<Millis>(interval * 2, 20ms);
  }
  // One last look: the condition may have become true during the final sleep.
  if (predicate()) {
    return;
  }
  fail("timed out after " + std::to_string(timeout.count()) + " ms waiting for: " +
           std::string(description),
       where);
}

Millis Deadline::remaining() const {
  const auto left = end_ - std::chrono::steady_clock::now();
  return std::max(Millis(0), std::chrono::duration_cast<Millis>(left));
}

}  // namespace idem::test
