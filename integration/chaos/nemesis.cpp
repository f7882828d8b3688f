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

Nemesis::Nemesis(Topology& topology, History& history, Schedule schedule, MetricsTally& tally)
    : topology_(topology), history_(history), schedule_(std::move(schedule)), tally_(tally) {}

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

void Nemesis::apply(const Fault& f) {
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
  }
}

// The backend goes on being slow, but stops failing.
void Nemesis::relax(const Fault& f) {
  topology_.backend_faults(json::serialize(json::object{{"delay_ms", f.delay.count()}}));
}

void Nemesis::heal(const Fault& f) {
  switch (f.kind) {
    case FaultKind::kill: topology_.start_replica(f.replica); break;
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
      std::lock_guard lock(mutex_);
      if (stopping_) return;
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
        if (action.act == Act::start) {
          apply(f);
          std::lock_guard lock(mutex_);
          ++counts_[std::string(fault_name(f.kind))];
        } else if (action.act == Act::relax) {
          relax(f);
        } else {
          heal(f);
        }
        event(what, f);
      } catch (const std::exception& e) {
        ++errors_;
        event("error", f, std::string(what) + ": " + e.what());
      }
    }
    scrape_all();
    if (wait_until(Clock::now() + step.gap)) return;
  }
}

}  // namespace idem::chaos
