#include "faults.hpp"

#include <algorithm>
#include <array>
#include <iterator>
#include <map>
#include <utility>

namespace idem::chaos {

namespace {

constexpr std::array<std::pair<FaultKind, std::string_view>, 16> kNames{{
    {FaultKind::kill, "kill"},
    {FaultKind::pause, "pause"},
    {FaultKind::pg_restart_fast, "pg-restart-fast"},
    {FaultKind::pg_restart_immediate, "pg-restart-immediate"},
    {FaultKind::backend_kill, "backend-kill"},
    {FaultKind::backend_pause, "backend-pause"},
    {FaultKind::backend_slow, "backend-slow"},
    {FaultKind::backend_503_before, "backend-503-before"},
    {FaultKind::backend_503_after, "backend-503-after"},
    {FaultKind::net_delay, "net-delay"},
    {FaultKind::net_blackhole, "net-blackhole"},
    {FaultKind::net_reset, "net-reset"},
    {FaultKind::net_refuse, "net-refuse"},
    {FaultKind::pg_failover, "pg-failover"},
    {FaultKind::pg_failover_vanish, "pg-failover-vanish"},
    {FaultKind::pg_switchover, "pg-switchover"},
}};

const std::map<std::string_view, std::vector<FaultKind>>& groups() {
  static const std::map<std::string_view, std::vector<FaultKind>> g{
      {"process", {FaultKind::kill, FaultKind::pause}},
      {"pg", {FaultKind::pg_restart_fast, FaultKind::pg_restart_immediate}},
      {"backend",
       {FaultKind::backend_kill, FaultKind::backend_pause, FaultKind::backend_slow,
        FaultKind::backend_503_before, FaultKind::backend_503_after}},
      {"net",
       {FaultKind::net_delay, FaultKind::net_blackhole, FaultKind::net_reset,
        FaultKind::net_refuse}},
      {"failover",
       {FaultKind::pg_failover, FaultKind::pg_failover_vanish, FaultKind::pg_switchover}},
  };
  return g;
}

// What a fault acts on; a combination never puts two faults on one target, so that
// healing one cannot undo the other.
enum class Target { replica0, replica1, database, backend, network };

Target target_of(const Fault& f) {
  switch (f.kind) {
    case FaultKind::kill:
    case FaultKind::pause: return f.replica == 0 ? Target::replica0 : Target::replica1;
    case FaultKind::pg_restart_fast:
    case FaultKind::pg_restart_immediate:
    case FaultKind::pg_failover:
    case FaultKind::pg_failover_vanish:
    case FaultKind::pg_switchover: return Target::database;
    case FaultKind::net_delay:
    case FaultKind::net_blackhole:
    case FaultKind::net_reset:
    case FaultKind::net_refuse: return Target::network;
    default: return Target::backend;
  }
}

bool is_backend_failure(FaultKind k) {
  return k == FaultKind::backend_503_before || k == FaultKind::backend_503_after ||
         k == FaultKind::backend_slow;
}

}  // namespace

std::string_view fault_name(FaultKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "?";
}

bool is_failover(FaultKind kind) {
  return kind == FaultKind::pg_failover || kind == FaultKind::pg_failover_vanish ||
         kind == FaultKind::pg_switchover;
}

const std::vector<FaultKind>& all_fault_kinds() {
  static const std::vector<FaultKind> all = [] {
    std::vector<FaultKind> v;
    for (const auto& [k, name] : kNames) {
      if (!is_failover(k)) v.push_back(k);
    }
    return v;
  }();
  return all;
}

std::variant<FaultSet, std::string> parse_faults(std::string_view list) {
  FaultSet set;
  bool none = false;
  while (!list.empty()) {
    const auto comma = list.find(',');
    std::string_view word = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    while (!word.empty() && word.front() == ' ') word.remove_prefix(1);
    while (!word.empty() && word.back() == ' ') word.remove_suffix(1);
    if (word.empty()) continue;
    if (word == "all") {
      for (const auto k : all_fault_kinds()) set.kinds.insert(k);
      set.combos = true;
    } else if (word == "none") {
      none = true;
    } else if (word == "combo") {
      set.combos = true;
    } else if (const auto g = groups().find(word); g != groups().end()) {
      set.kinds.insert(g->second.begin(), g->second.end());
    } else {
      bool found = false;
      for (const auto& [k, name] : kNames) {
        if (name == word) {
          set.kinds.insert(k);
          found = true;
        }
      }
      if (!found) return "unknown fault '" + std::string(word) + "'";
    }
  }
  if (none && !set.kinds.empty()) return std::string("'none' cannot be combined with faults");
  if (set.combos && set.kinds.empty()) return std::string("'combo' needs faults to combine");
  return set;
}

std::string describe(const FaultSet& set) {
  if (set.kinds.empty()) return "none";
  const auto& all = all_fault_kinds();
  if (set.combos && set.kinds == std::set<FaultKind>(all.begin(), all.end())) return "all";
  std::string out;
  for (const auto k : set.kinds) {
    if (!out.empty()) out += ",";
    out += fault_name(k);
  }
  if (set.combos) out += ",combo";
  return out;
}

std::string link_name(int replica, bool database) {
  return "r" + std::to_string(replica) + (database ? "-pg" : "-api");
}

std::string node_link_name(int replica, const std::string& node) {
  return link_name(replica, true) + "-" + node;
}

std::string Fault::detail() const {
  std::string s;
  switch (kind) {
    case FaultKind::kill:
    case FaultKind::pause: s = "replica " + std::to_string(replica); break;
    case FaultKind::backend_slow:
      s = "answers " + std::to_string(delay.count()) + " ms late, " +
          (after_commit ? "after" : "before") + " its commit";
      break;
    case FaultKind::backend_503_before:
    case FaultKind::backend_503_after:
      s = "every " + std::to_string(every) + " request(s)";
      if (delay.count() > 0) s += ", " + std::to_string(delay.count()) + " ms late";
      break;
    case FaultKind::net_delay:
    case FaultKind::net_blackhole:
    case FaultKind::net_reset:
    case FaultKind::net_refuse:
      for (const auto& l : links) s += (s.empty() ? "" : "+") + l;
      s += " " + render_link_mode(link_mode);
      break;
    case FaultKind::pg_failover:
    case FaultKind::pg_failover_vanish: s = "the primary, down at least"; break;
    default: s = "-"; break;
  }
  if (relax.count() > 0) s += ", failing until +" + std::to_string(relax.count()) + " ms";
  s += ", " + std::to_string(hold.count()) + " ms";
  if (start.count() > 0) s += " from +" + std::to_string(start.count()) + " ms";
  return s;
}

// ---------------------------------------------------------------------- Schedule

Schedule::Schedule(std::uint64_t seed, FaultSet set, FaultTimings timings)
    : rng_(seed), set_(std::move(set)), timings_(timings), kinds_(set_.kinds.begin(), set_.kinds.end()) {}

namespace {

// The faults that make stale owners (pauses, kills) and released claims (backend
// failures) weigh more: their meeting is where fencing is tested.
int weight(FaultKind k) {
  switch (k) {
    case FaultKind::pause: return 4;
    case FaultKind::kill:
    case FaultKind::backend_503_before:
    case FaultKind::backend_503_after: return 2;
    default: return 1;
  }
}

}  // namespace

FaultKind Schedule::pick(const std::vector<FaultKind>& from) {
  std::uint64_t total = 0;
  for (const auto k : from) total += static_cast<std::uint64_t>(weight(k));
  auto n = rng_.below(total);
  for (const auto k : from) {
    const auto w = static_cast<std::uint64_t>(weight(k));
    if (n < w) return k;
    n -= w;
  }
  return from.back();
}

Fault Schedule::make(FaultKind kind) {
  Fault f{.kind = kind};
  const auto lease = timings_.lease.count();
  const auto timeout = timings_.response_timeout.count();
  f.replica = static_cast<int>(rng_.below(static_cast<std::uint64_t>(timings_.replicas)));
  switch (kind) {
    case FaultKind::kill:
    case FaultKind::backend_kill: f.hold = Millis(rng_.between(100, 2000)); break;
    case FaultKind::pause:
      // Past the lease, so the other replica takes over and the paused owner comes back
      // stale: the case fencing exists for.
      f.hold = Millis(rng_.between(lease * 6 / 5, lease * 5));
      break;
    case FaultKind::pg_restart_fast:
    case FaultKind::pg_restart_immediate:
    case FaultKind::pg_switchover: f.hold = Millis(0); break;
    case FaultKind::pg_failover:
    case FaultKind::pg_failover_vanish:
      // From the kill; the promotion alone takes longer than the shortest (a few
      // seconds), so the old primary comes back sometimes at once, sometimes later.
      f.hold = Millis(rng_.between(1000, 12000));
      break;
    case FaultKind::backend_pause: f.hold = Millis(rng_.between(300, timeout * 3)); break;
    case FaultKind::backend_slow:
      // Half the time past the response timeout (the sidecar gives up: unknown outcome),
      // half the time just slow (claims stay in progress for long).
      f.delay = rng_.chance(0.5) ? Millis(rng_.between(timeout * 6 / 5, timeout * 5 / 2))
                                 : Millis(rng_.between(timeout * 3 / 10, timeout * 4 / 5));
      f.after_commit = rng_.chance(0.5);
      f.hold = Millis(rng_.between(1000, 4000));
      break;
    case FaultKind::backend_503_before:
    case FaultKind::backend_503_after:
      f.every = static_cast<int>(rng_.between(1, 3));
      // Failing and slow at once, half the time: the claims that the failures release
      // and the retries take again then stay in progress for a while.
      if (rng_.chance(0.5)) f.delay = Millis(rng_.between(timeout / 5, timeout * 4 / 5));
      f.hold = Millis(rng_.between(1000, 4000));
      break;
    case FaultKind::net_delay:
    case FaultKind::net_blackhole:
    case FaultKind::net_reset:
    case FaultKind::net_refuse: {
      static constexpr std::array<LinkKind, 4> modes{LinkKind::delay, LinkKind::blackhole,
                                                      LinkKind::reset, LinkKind::refuse};
      f.link_mode.kind = modes.at(static_cast<std::size_t>(kind) -
                                  static_cast<std::size_t>(FaultKind::net_delay));
      if (f.link_mode.kind == LinkKind::delay) f.link_mode.delay = Millis(rng_.between(20, 300));
      const auto spread = rng_.below(100);
      const bool database = rng_.chance(0.5);
      for (int r = 0; r < timings_.replicas; ++r) {
        if (spread < 60) {  // one link
          if (r == f.replica) f.links.push_back(link_name(r, database));
        } else if (spread < 85) {  // one kind of link on every replica
          f.links.push_back(link_name(r, database));
        } else {  // everything
          f.links.push_back(link_name(r, true));
          f.links.push_back(link_name(r, false));
        }
      }
      f.hold = Millis(rng_.between(300, 3000));
      break;
    }
  }
  return f;
}

// The shape of the combination that puts a stale owner next to a newer claim of its key,
// so that, with per-claim tokens, the owner's late write lands on that claim:
//   - the backend is slow (so the replica about to pause holds claims in flight, waiting)
//     and fails every request (so the held claims end in a release when their owner
//     resumes, and the other replica's takeovers of those keys are released too, and the
//     clients' retries claim them again, afresh, again and again);
//   - the pause ends after a client's timeout (longer than the lease: its retry elsewhere
//     took the key over) and one to three slow answers more;
//   - one slow answer before the pause ends, the backend stops failing but stays slow:
//     the fresh claim taken then succeeds, and is in flight when the owner resumes.
// A backend-slow partner (slow, not failing) keeps its own shape, only timed the same.
void Schedule::shape_stale_owner(Fault& backend, Fault& pause) {
  const auto client = std::max(timings_.client_timeout.count(), timings_.lease.count() + 100);
  if (backend.kind != FaultKind::backend_slow) {
    backend.every = 1;
    backend.delay = Millis(rng_.between(300, 800));
  }
  const auto slow = backend.delay.count();
  pause.hold = Millis(rng_.between(client + slow, client + 3 * slow));
  const Millis resumed = pause.start + pause.hold;
  if (backend.kind != FaultKind::backend_slow) backend.relax = resumed - backend.delay;
  backend.hold = std::max(backend.hold, resumed + Millis(rng_.between(300, 1500)));
}

Step Schedule::next() {
  Step step;
  if (kinds_.empty()) {
    step.gap = Millis(1000);
    return step;
  }
  // With failover kinds every step is a failover, the kinds in turn (a run of N
  // failovers meets each kind when N allows); the other kinds only join as partners.
  std::vector<FaultKind> failover_kinds;
  std::copy_if(kinds_.begin(), kinds_.end(), std::back_inserter(failover_kinds), is_failover);
  if (!failover_kinds.empty()) {
    step.faults.push_back(make(failover_kinds[failover_turn_++ % failover_kinds.size()]));
    std::vector<FaultKind> partners;
    std::copy_if(kinds_.begin(), kinds_.end(), std::back_inserter(partners),
                 [](FaultKind k) { return !is_failover(k); });
    if (set_.combos && !partners.empty() && rng_.chance(0.5)) {
      Fault other = make(pick(partners));
      // Somewhere in the failover's first seconds: before, during or after the promotion.
      other.start = Millis(rng_.between(0, 7000));
      step.faults.push_back(std::move(other));
    }
    step.gap = Millis(rng_.between(1000, 3000));
    return step;
  }
  step.faults.push_back(make(pick(kinds_)));
  const bool pause = step.faults[0].kind == FaultKind::pause;
  if (set_.combos && rng_.chance(pause ? 0.7 : 0.4)) {
    // A paused owner and a backend that fails meanwhile is the combination that makes a
    // stale owner meet a newer claim of its key (released on the 5xx, claimed again):
    // drawn on purpose more often than chance would when both are selected.
    std::vector<FaultKind> partners;
    if (pause && rng_.chance(0.6)) {
      std::copy_if(kinds_.begin(), kinds_.end(), std::back_inserter(partners), is_backend_failure);
    }
    if (partners.empty()) partners = kinds_;
    for (int tries = 0; tries < 8 && !partners.empty(); ++tries) {
      Fault other = make(pick(partners));
      if (target_of(other) == target_of(step.faults[0])) continue;
      // A backend that fails or is slow first, and the pause a moment later: claims
      // pile up at the replica, waiting for the backend, and the pause catches them.
      const bool failing_then_pause =
          (step.faults[0].kind == FaultKind::pause && is_backend_failure(other.kind)) ||
          (other.kind == FaultKind::pause && is_backend_failure(step.faults[0].kind));
      if (failing_then_pause && step.faults[0].kind == FaultKind::pause) {
        std::swap(step.faults[0], other);
      }
      other.start = Millis(failing_then_pause ? rng_.between(200, 800) : rng_.between(0, 500));
      if (failing_then_pause) shape_stale_owner(step.faults[0], other);
      step.faults.push_back(std::move(other));
      break;
    }
  }
  step.gap = Millis(rng_.between(300, 2000));
  return step;
}

}  // namespace idem::chaos
