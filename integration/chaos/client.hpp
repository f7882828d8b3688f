#pragma once
// The clients of the fault-injection run: worker threads that take the plan's entries in
// order and run each to a definite answer, retrying everything else (in progress, 5xx,
// connection errors, timeouts) with the same key, on a replica chosen per attempt. Every
// request and its answer goes to the history.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "history.hpp"
#include "support/http.hpp"
#include "support/wait.hpp"
#include "workload.hpp"

namespace idem::chaos {

using it::Millis;

struct ClientOptions {
  std::uint64_t seed = 1;
  std::size_t workers = 8;
  Millis request_timeout{1500};   // one exchange: impatient, as real clients are
  Millis give_up{120'000};        // one entry; then it is reported as never settled
  Millis max_backoff{200};
};

class Clients {
 public:
  Clients(const Plan& plan, History& history, std::vector<std::uint16_t> replica_ports,
          ClientOptions options);

  // Runs every entry; returns when each has settled or given up.
  void run();

  // Entries started: always the first taken() of the plan.
  std::size_t taken() const { return next_.load(); }
  std::size_t settled() const { return settled_.load(); }  // entries finished
  std::size_t requests() const { return requests_.load(); }
  // When an entry last got a definite answer (run_clock_us()).
  std::int64_t last_definite_us() const { return last_definite_us_.load(); }
  // Stops taking entries and retrying (a stalled run): run() returns soon after.
  void abort() { aborted_.store(true); }
  // Stops taking entries; the entries under way go on to a definite answer (a run that
  // ends when its nemesis is done rather than when the plan is).
  void drain();

 private:
  void worker();
  // The next entry to run, or the plan's size when no more are to be taken.
  std::size_t take();
  void run_entry(std::size_t index, std::vector<it::HttpClient>& clients);

  const Plan& plan_;
  History& history_;
  std::vector<std::uint16_t> ports_;
  ClientOptions options_;
  std::mutex take_mutex_;
  std::size_t limit_;  // under take_mutex_: entries at or past it are not taken
  std::atomic<std::size_t> next_{0};
  std::atomic<std::size_t> settled_{0};
  std::atomic<std::size_t> requests_{0};
  std::atomic<std::int64_t> last_definite_us_{0};
  std::atomic<bool> aborted_{false};
};

}  // namespace idem::chaos
