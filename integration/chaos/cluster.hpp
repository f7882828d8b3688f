#pragma once
// The store of a failover run (--failover): the pg_auto_failover cluster of
// scripts/lib/paf-up (a monitor and two nodes, synchronous replication), driven through
// its control script (pafctl). The nemesis kills the primary and waits for the promotion,
// starts the old primary again and waits for it to rejoin, or asks for a switchover.
//
// Environment (paf-up prints it): IDEM_FAILOVER_NODES ("a=127.0.0.1:PORT b=..."),
// IDEM_FAILOVER_CTL (the control script).
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "support/harness.hpp"

namespace idem::chaos {

using it::Millis;

struct ClusterNode {
  std::string name;
  std::string host;
  std::uint16_t port = 0;
};

// "a=127.0.0.1:5001 b=127.0.0.1:5002"; empty on a malformed list.
std::vector<ClusterNode> parse_cluster_nodes(std::string_view text);

class Cluster {
 public:
  // From the environment; throws it::Failure when it is missing or malformed.
  static Cluster from_environment();

  const std::vector<ClusterNode>& nodes() const { return nodes_; }
  const ClusterNode& node(const std::string& name) const;
  // postgresql://user@h1:p1,h2:p2/database?target_session_attrs=read-write, direct to the
  // nodes (the harness's own view, not through the fault proxy).
  std::string url(const std::string& database) const;

  // The primary by the monitor's account (reported state = goal state, a primary state).
  std::optional<std::string> primary() const;
  // The node that accepts a read-write session now, asked directly; nullopt if none does.
  std::optional<std::string> writable() const;
  // Polls writable() until a node other than `old_primary` accepts writes; its name, or
  // throws after `within`.
  std::string wait_promoted(const std::string& old_primary, Millis within) const;

  void kill(const std::string& node) const;
  void start(const std::string& node) const;
  // Until one node is primary and the other secondary (pafctl wait-healthy).
  void wait_healthy(Millis within) const;
  void switchover() const;
  std::string state() const;  // the monitor's view, one line per node, for messages

 private:
  Cluster(std::vector<ClusterNode> nodes, std::string ctl);
  std::string ctl(const std::vector<std::string>& args, Millis timeout) const;

  std::vector<ClusterNode> nodes_;
  std::string ctl_;
};

}  // namespace idem::chaos
