#pragma once
// The faults of the fault-injection run and their schedule: which kinds `--faults`
// selects, and the sequence of steps the nemesis runs, drawn from the seed. Pure: the
// nemesis (nemesis.cpp) applies the steps; when each happens relative to the clients'
// requests is up to the machine, what happens is the seed's.
//
// Kinds (the names of --faults):
//   kill                  SIGKILL a sidecar replica, restart it after a moment
//   pause                 SIGSTOP a replica for longer than its lease, then SIGCONT
//   pg-restart-fast       PostgreSQL restarted, fast shutdown (sessions end cleanly)
//   pg-restart-immediate  PostgreSQL restarted, immediate shutdown (crash recovery)
//   backend-kill          SIGKILL the order API, restart it after a moment
//   backend-pause         SIGSTOP the order API for a while, then SIGCONT
//   backend-slow          the order API answers later than the sidecar's response timeout
//   backend-503-before    the order API fails every k-th request with 503, writing nothing
//   backend-503-after     ... with 503 after its commit (the order exists, the answer is lost)
//   net-delay             links (replica-PostgreSQL, replica-API) delay every chunk
//   net-blackhole         links stall: nothing flows, nothing closes
//   net-reset             links reset every connection, open and new
//   net-refuse            links refuse new connections
// Groups: all (every kind above, and combinations), none, process (kill, pause), pg,
// backend, net; "combo" adds combinations (two faults of different targets at once) to a
// list.
//
// Failover kinds (group "failover"; only with --failover, where the store is a
// pg_auto_failover cluster of two nodes, and never part of "all"):
//   pg-failover           SIGKILL the primary node (its keeper and PostgreSQL); the
//                         monitor promotes the secondary; later the old primary is
//                         started again and rejoins as the secondary
//   pg-failover-vanish    the same, and the replicas' links to the old primary blackhole
//                         while it is down (a crashed machine: no RST, only silence)
//   pg-switchover         a planned switchover (pg_autoctl perform switchover)
#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "link_mode.hpp"
#include "workload.hpp"

namespace idem::chaos {

using Millis = std::chrono::milliseconds;

enum class FaultKind {
  kill,
  pause,
  pg_restart_fast,
  pg_restart_immediate,
  backend_kill,
  backend_pause,
  backend_slow,
  backend_503_before,
  backend_503_after,
  net_delay,
  net_blackhole,
  net_reset,
  net_refuse,
  pg_failover,
  pg_failover_vanish,
  pg_switchover,
};
bool is_failover(FaultKind kind);
std::string_view fault_name(FaultKind kind);
// The kinds of "all": every kind but the failover ones.
const std::vector<FaultKind>& all_fault_kinds();

struct FaultSet {
  std::set<FaultKind> kinds;
  bool combos = false;
  bool empty() const { return kinds.empty(); }
};

// A comma-separated list of kinds and groups; the error says which word is unknown.
std::variant<FaultSet, std::string> parse_faults(std::string_view list);
std::string describe(const FaultSet& set);

// The names of the fault proxy's links (fault_proxy.cpp), per replica and target; with
// --failover, per replica and cluster node (e.g. "r0-pg-a").
std::string link_name(int replica, bool database);
std::string node_link_name(int replica, const std::string& node);

// One fault, fully decided: where, how strong, how long.
struct Fault {
  FaultKind kind = FaultKind::kill;
  int replica = 0;                 // kill, pause
  std::vector<std::string> links;  // net-*
  LinkMode link_mode;              // net-*
  Millis start{0};                 // when it starts, from the start of its step
  Millis hold{0};                  // how long it lasts before it is healed
  Millis delay{0};                 // backend-slow, backend-503-*: how late the API answers
  bool after_commit = false;       // backend-slow: delay after (not before) the commit
                                   // (backend-503-*: the delay is always before it)
  int every = 1;                   // backend-503-*: fail every k-th request
                                   // (pg-failover*: hold is how long the old primary
                                   // stays down at least, from its kill)
  Millis relax{0};                 // backend-503-*: from start + relax on (if > 0), the
                                   // backend stops failing and is only slow

  std::string detail() const;  // "replica 1 for 2300 ms", for the history
};

// One fault, or two for a combination (the second may start a moment later), then a
// quiet gap.
struct Step {
  std::vector<Fault> faults;
  Millis gap{0};
};

// The timings the faults are measured against.
struct FaultTimings {
  Millis lease{1000};
  Millis response_timeout{1000};
  Millis client_timeout{1500};  // how long a client waits for one answer
  int replicas = 2;
};

class Schedule {
 public:
  Schedule(std::uint64_t seed, FaultSet set, FaultTimings timings);
  Step next();

 private:
  Fault make(FaultKind kind);
  void shape_stale_owner(Fault& backend, Fault& pause);
  FaultKind pick(const std::vector<FaultKind>& from);

  Rng rng_;
  std::size_t failover_turn_ = 0;
  FaultSet set_;
  FaultTimings timings_;
  std::vector<FaultKind> kinds_;
};

}  // namespace idem::chaos
