#include "nemesis.hpp"

#include <algorithm>
#include <csignal>
#include <vector>

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

namespace idem::chaos {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

// --------------------------------------------------------------------- MetricsTally

void MetricsTally::observe(int replica, const MetricValues& now) {
  std::lock_guard lock(mutex_);
  current_.at(replica) = now;
}

void MetricsTally::bank(int replica) {
  std::lock_guard lock(mutex_);
  for (const auto& [series, value] : current_.at(replica)) banked_[series] += value;
  current_.at(replica).clear();
}

MetricValues MetricsTally::totals() const {
  std::lock_guard lock(mutex_);
  MetricValues out = banked_;
  for (const auto& values : current_) {
    for (const auto& [series, value] : values) out[series] += value;
  }
  return out;
}

// -------------------------------------------------------------------------- Nemesis

Nemesis::Nemesis(Topology& topology, History& history, Schedule schedule, MetricsTally& tally,
                 std::size_t max_failovers)
    : topology_(topology),
      history_(history),
      schedule_(std::move(schedule)),
      tally_(tally),
      max_failovers_(max_failovers) {}

void Nemesis::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
}

bool Nemesis::wait_until(Clock::time_point until) {
  std::unique_lock lock(mutex_);
  return wake_.wait_until(lock, until, [&] { return stopping_; });
}

std::map<std::string, std::size_t> Nemesis::faults_by_kind() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

void Nemesis::event(std::string action, const Fault& f, std::string detail) {
  history_.add(NemesisEvent{.at_us = run_clock_us(),
                            .action = std::move(action),
                            .fault = std::string(fault_name(f.kind)),
                            .detail = detail.empty() ? f.detail() : std::move(detail)});
}

void Nemesis::scrape_all() {
  for (int r = 0; r < Topology::kReplicas; ++r) {
    if (auto values = topology_.scrape(r)) tally_.observe(r, *values);
  }
}

// The primary is killed, or a switchover asked for ("start"); a watcher thread records
// the moment another node accepts writes ("promoted"), while the step's other faults (a
// replica killed meanwhile, say) go on: the report measures the clients' answers from the
// start on. The old primary stays down until the heal (rejoin).
void Nemesis::fail_over(const Fault& f) {
  const Cluster& cluster = topology_.cluster();
  const auto old_primary = cluster.primary();
  if (!old_primary) throw it::Failure("no primary to fail over from:\n" + cluster.state());
  const bool switchover = f.kind == FaultKind::pg_switchover;
  if (switchover) {
    event("start", f, "switchover from " + *old_primary);
  } else {
    killed_node_ = *old_primary;
    topology_.kill_node(*old_primary, f.kind == FaultKind::pg_failover_vanish);
    // Recorded once the node is dead: whatever a client sends from now on meets the
    // failover.
    event("start", f, "primary " + *old_primary + " killed" +
                          (f.kind == FaultKind::pg_failover_vanish ? ", its links blackholed" : ""));
  }
  promotion_ = std::jthread([this, f, switchover, old = *old_primary, &cluster] {
    const auto start = Clock::now();
    try {
      // pg_autoctl perform switchover returns once the whole transition is over; the
      // promotion is watched meanwhile, as for a kill.
      std::string switchover_error;
      std::jthread command;
      if (switchover) {
        command = std::jthread([&cluster, &switchover_error] {
          try {
            cluster.switchover();
          } catch (const std::exception& e) {
            switchover_error = e.what();
          }
        });
      }
      const std::string promoted = cluster.wait_promoted(old, std::chrono::seconds(90));
      const auto ms = std::chrono::duration_cast<Millis>(Clock::now() - start).count();
      event("promoted", f, promoted + " accepts writes after " + std::to_string(ms) + " ms");
      if (command.joinable()) command.join();
      if (!switchover_error.empty()) throw it::Failure(switchover_error);
    } catch (const std::exception& e) {
      ++errors_;
      event("error", f, std::string("promotion: ") + e.what());
    }
  });
}

// Once the promotion is over, the old primary starts again and rejoins as the secondary;
// the step ends when the cluster is whole (synchronous replication back), so the next
// failover loses nothing.
void Nemesis::rejoin() {
  if (promotion_.joinable()) promotion_.join();
  const auto start = Clock::now();
  if (!killed_node_.empty()) {
    topology_.start_node(killed_node_);
    killed_node_.clear();
  }
  topology_.cluster().wait_healthy(std::chrono::seconds(120));
  rejoined_ms_ = std::chrono::duration_cast<Millis>(Clock::now() - start).count();
}

bool Nemesis::apply(const Fault& f) {
  if (is_failover(f.kind)) {
    fail_over(f);
    return false;
  }
  switch (f.kind) {
    case FaultKind::kill:
      if (auto values = topology_.scrape(f.replica)) tally_.observe(f.replica, *values);
      tally_.bank(f.replica);
      topology_.kill_replica(f.replica);
      break;
    case FaultKind::pause: topology_.signal_replica(f.replica, SIGSTOP); break;
    case FaultKind::pg_restart_fast: topology_.restart_database(false); break;
    case FaultKind::pg_restart_immediate: topology_.restart_database(true); break;
    case FaultKind::backend_kill: topology_.kill_backend(); break;
    case FaultKind::backend_pause: topology_.signal_backend(SIGSTOP); break;
    case FaultKind::backend_slow:
      topology_.backend_faults(json::serialize(json::object{
          {"delay_ms", f.delay.count()},
          {"delay_mode", f.after_commit ? "after_commit" : "before_commit"}}));
      break;
    case FaultKind::backend_503_before:
    case FaultKind::backend_503_after:
      topology_.backend_faults(json::serialize(json::object{
          {"fail_every", f.every},
          {"fail_status", 503},
          {"fail_mode", f.kind == FaultKind::backend_503_after ? "after_commit" : "before_commit"},
          {"delay_ms", f.delay.count()}}));
      break;
    case FaultKind::net_delay:
    case FaultKind::net_blackhole:
    case FaultKind::net_reset:
    case FaultKind::net_refuse: topology_.set_links(f.links, f.link_mode); break;
    case FaultKind::pg_failover:
    case FaultKind::pg_failover_vanish:
    case FaultKind::pg_switchover: break;  // above
  }
  return true;
}

// The backend goes on being slow, but stops failing.
void Nemesis::relax(const Fault& f) {
  topology_.backend_faults(json::serialize(json::object{{"delay_ms", f.delay.count()}}));
}

void Nemesis::heal(const Fault& f) {
  switch (f.kind) {
    // Spawned only: it may need a fault of the same step (the database's links) healed
    // first; the step's end waits for it to listen (run()).
    case FaultKind::kill: topology_.spawn_replica(f.replica); break;
    case FaultKind::pause: topology_.signal_replica(f.replica, SIGCONT); break;
    case FaultKind::pg_restart_fast:
    case FaultKind::pg_restart_immediate: break;  // the restart was the whole fault
    case FaultKind::backend_kill: topology_.start_backend(); break;
    case FaultKind::backend_pause: topology_.signal_backend(SIGCONT); break;
    case FaultKind::backend_slow:
    case FaultKind::backend_503_before:
    case FaultKind::backend_503_after: topology_.backend_faults("{}"); break;
    case FaultKind::net_delay:
    case FaultKind::net_blackhole:
    case FaultKind::net_reset:
    case FaultKind::net_refuse: topology_.set_links(f.links, LinkMode{}); break;
    case FaultKind::pg_failover:
    case FaultKind::pg_failover_vanish:
    case FaultKind::pg_switchover: rejoin(); break;
  }
}

// One step: a timeline of its faults' starts, relaxations and heals, run in order of
// time; then the gap passes without faults. A failed action is recorded and the run goes
// on: the final heal (Topology::heal) brings everything back regardless. A stop only
// shortens the waits, so what was started is always healed.
void Nemesis::run() {
  enum class Act { start, relax, heal };
  struct Action {
    Millis at;
    Act act;
    std::size_t fault;
  };
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (stopping_) return;
      if (max_failovers_ > 0 && failovers_ >= max_failovers_) {
        // Done: the run drains its clients and stops us.
        wake_.wait(lock, [&] { return stopping_; });
        return;
      }
    }
    const Step step = schedule_.next();
    std::vector<Action> timeline;
    for (std::size_t i = 0; i < step.faults.size(); ++i) {
      const Fault& f = step.faults[i];
      timeline.push_back({f.start, Act::start, i});
      if (f.relax.count() > 0) timeline.push_back({f.start + f.relax, Act::relax, i});
      timeline.push_back({f.start + f.hold, Act::heal, i});
    }
    std::stable_sort(timeline.begin(), timeline.end(),
                     [](const Action& a, const Action& b) { return a.at < b.at; });
    const auto begin = Clock::now();
    for (const auto& action : timeline) {
      wait_until(begin + action.at);
      const Fault& f = step.faults[action.fault];
      const char* what = action.act == Act::start ? "start" : action.act == Act::relax ? "relax" : "heal";
      try {
        bool record = true;
        if (action.act == Act::start) {
          record = apply(f);
          std::lock_guard lock(mutex_);
          ++counts_[std::string(fault_name(f.kind))];
        } else if (action.act == Act::relax) {
          relax(f);
        } else {
          heal(f);
          if (is_failover(f.kind)) {
            event(what, f, "cluster whole again after " + std::to_string(rejoined_ms_) + " ms");
            record = false;
          }
        }
        if (record) event(what, f);
      } catch (const std::exception& e) {
        ++errors_;
        event("error", f, std::string(what) + ": " + e.what());
      }
    }
    // Every fault of the step is healed: a killed replica must be serving again.
    for (const Fault& f : step.faults) {
      if (f.kind != FaultKind::kill) continue;
      try {
        topology_.await_replica(f.replica);
      } catch (const std::exception& e) {
        ++errors_;
        event("error", f, std::string("heal: ") + e.what());
      }
    }
    if (std::any_of(step.faults.begin(), step.faults.end(),
                    [](const Fault& f) { return is_failover(f.kind); })) {
      ++failovers_;
    }
    scrape_all();
    if (wait_until(Clock::now() + step.gap)) return;
  }
}

}  // namespace idem::chaos
