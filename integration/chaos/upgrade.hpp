#pragma once
// A rolling upgrade under the fault-injection workload (scripts/upgrade-check,
// docs/operations.md "Upgrading"): the two replicas start on the previous release, the
// record table is filled, and then, while the clients run, the upgrade goes the way
// deploy/kubernetes does it: `migrate` with the new release first, then each replica in
// turn drained (SIGTERM) and started again on the new release.
//
// Measured meanwhile:
//   - claim probes: a create with a new key through each live replica every 40 ms; the
//     longest wait per migration step (the migrator's own timed lines say when each step
//     ran) and every answer that was not 201;
//   - readiness: /readyz of both replicas every 100 ms: how many were ready at each
//     sample, and the reasons of the unready ones.
// The clients' history goes to the run's ordinary checker, so the invariants are checked
// across the versions.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/json/object.hpp>

#include "migrate_log.hpp"
#include "nemesis.hpp"
#include "topology.hpp"

namespace idem::chaos {

struct UpgradeOptions {
  std::string new_binary;           // the release rolled out
  std::string old_label;            // e.g. "0.1.0 (d0ebebe)", for the report
  std::string new_label;
  std::uint64_t prefill = 0;        // records written at the old schema before the load
  std::chrono::seconds warmup{5};   // load before the migration, and after the roll
  bool expect_incompatible = false; // the new release's migration allows no old replica
  bool readiness_may_drop = false;  // the old release predates the compatibility rule
  Millis max_stall{1000};
  std::filesystem::path out;
  // The run's counters: a replica's are banked before it is replaced, so the summary
  // adds up both releases' takeovers, fenced writes and outcomes.
  MetricsTally* tally = nullptr;
};


class Upgrade {
 public:
  Upgrade(Topology& topology, UpgradeOptions options);
  ~Upgrade();

  // Writes the records at the old schema (before any traffic or witness trigger).
  void prefill();
  // Starts the probes, the readiness sampler and the roll (warm-up, migrate, replicas).
  void start();
  bool done() const { return done_.load(); }
  void stop();

  // The report (upgrade.json, upgrade.txt in the run's directory) and its verdict.
  struct Verdict {
    bool ok = true;
    std::vector<std::string> failures;
  };
  Verdict report(idem::it::Db& orders_db);
  // The probes' tenant: its rows are the probes', not the workload's.
  static constexpr const char* kProbeTenant = "upgrade-probe";

 private:
  struct Probe {
    int replica = 0;
    std::string binary;  // "old" | "new"
    std::int64_t sent_us = 0;  // wall clock
    double ms = 0;
    int status = 0;
    std::string error;
  };
  struct Sample {
    std::int64_t at_us = 0;
    int ready = 0;
    std::string reasons[Topology::kReplicas];
  };
  struct Phase {
    std::string what;
    std::int64_t start_us = 0;
    std::int64_t end_us = 0;
  };

  void probe_loop(int replica);
  void sample_loop();
  void roll();
  void phase(std::string what, std::int64_t start_us);
  boost::json::object figures(std::vector<std::string>& failures, idem::it::Db& orders_db);

  Topology& topology_;
  UpgradeOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::atomic<bool> replacing_[Topology::kReplicas]{};
  std::atomic<bool> upgraded_[Topology::kReplicas]{};
  mutable std::mutex mutex_;
  std::vector<Probe> probes_;
  std::vector<Sample> samples_;
  std::vector<Phase> phases_;
  std::vector<StepWindow> steps_;
  std::string migrate_output_;
  int migrate_status_ = -1;
  std::string roll_error_;
  double prefill_seconds_ = 0;
  std::vector<std::jthread> threads_;
};

}  // namespace idem::chaos
