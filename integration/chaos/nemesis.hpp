#pragma once
// The nemesis of the fault-injection run: a thread that takes the schedule's steps
// (faults.hpp) one after the other and applies them to the topology, each healed when
// its time is up (a failing backend may first be relaxed to a slow one), until told to
// stop. Every start and heal goes to the history; the
// replicas' counters are read between steps, and before a replica is killed, so the
// summary can add up takeovers and fenced writes across restarts.
#include <array>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "faults.hpp"
#include "history.hpp"
#include "topology.hpp"

namespace idem::chaos {

// The counters of every replica, summed over its restarts.
class MetricsTally {
 public:
  void observe(int replica, const MetricValues& now);
  // The replica is about to die: what it counted so far is kept.
  void bank(int replica);
  MetricValues totals() const;

 private:
  mutable std::mutex mutex_;
  std::array<MetricValues, Topology::kReplicas> current_;
  MetricValues banked_;
};

class Nemesis {
 public:
  // `max_failovers` > 0: after that many steps with a failover fault (healed), no more
  // steps are drawn (the run then drains its clients).
  Nemesis(Topology& topology, History& history, Schedule schedule, MetricsTally& tally,
          std::size_t max_failovers = 0);

  // Runs steps until stop() (the step under way is healed first).
  void run();
  void stop();

  std::map<std::string, std::size_t> faults_by_kind() const;
  std::size_t errors() const { return errors_; }
  std::size_t failovers() const { return failovers_; }  // failover steps done and healed

 private:
  // Applies the start of `f`; false when it wrote its own history events (failovers).
  bool apply(const Fault& f);
  void fail_over(const Fault& f);
  void rejoin();
  void relax(const Fault& f);
  void heal(const Fault& f);
  // Sleeps until `until` or stop(); true when stopped.
  bool wait_until(std::chrono::steady_clock::time_point until);
  void scrape_all();
  void event(std::string action, const Fault& f, std::string detail = "");

  Topology& topology_;
  History& history_;
  Schedule schedule_;
  MetricsTally& tally_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::map<std::string, std::size_t> counts_;
  std::atomic<std::size_t> errors_{0};
  std::size_t max_failovers_ = 0;
  std::atomic<std::size_t> failovers_{0};
  std::string killed_node_;  // the old primary of the failover under way
  std::jthread promotion_;   // waits for the failover under way to promote a node
  std::int64_t rejoined_ms_ = 0;
};

}  // namespace idem::chaos
