#include "cluster.hpp"

#include <sstream>
#include <thread>

namespace idem::chaos {

using namespace std::chrono_literals;

std::vector<ClusterNode> parse_cluster_nodes(std::string_view text) {
  std::vector<ClusterNode> out;
  std::istringstream in{std::string(text)};
  for (std::string word; in >> word;) {
    const auto eq = word.find('=');
    const auto colon = word.rfind(':');
    if (eq == std::string::npos || colon == std::string::npos || colon < eq) return {};
    ClusterNode n{word.substr(0, eq), word.substr(eq + 1, colon - eq - 1), 0};
    try {
      const int port = std::stoi(word.substr(colon + 1));
      if (port < 1 || port > 65535) return {};
      n.port = static_cast<std::uint16_t>(port);
    } catch (const std::exception&) {
      return {};
    }
    if (n.name.empty() || n.host.empty()) return {};
    out.push_back(std::move(n));
  }
  return out;
}

Cluster::Cluster(std::vector<ClusterNode> nodes, std::string ctl)
    : nodes_(std::move(nodes)), ctl_(std::move(ctl)) {}

Cluster Cluster::from_environment() {
  const auto nodes = parse_cluster_nodes(it::env("IDEM_FAILOVER_NODES").value_or(""));
  const auto ctl = it::env("IDEM_FAILOVER_CTL").value_or("");
  if (nodes.size() != 2 || ctl.empty()) {
    throw it::Failure(
        "--failover needs the cluster of scripts/lib/paf-up: IDEM_FAILOVER_NODES (two nodes, "
        "\"a=HOST:PORT b=HOST:PORT\") and IDEM_FAILOVER_CTL; scripts/chaos --failover starts it");
  }
  return Cluster(nodes, ctl);
}

const ClusterNode& Cluster::node(const std::string& name) const {
  for (const auto& n : nodes_) {
    if (n.name == name) return n;
  }
  throw it::Failure("no cluster node named '" + name + "'");
}

std::string Cluster::url(const std::string& database) const {
  std::string hosts;
  for (const auto& n : nodes_) {
    if (!hosts.empty()) hosts += ",";
    hosts += n.host + ":" + std::to_string(n.port);
  }
  return "postgresql://postgres@" + hosts + "/" + database + "?target_session_attrs=read-write";
}

std::string Cluster::ctl(const std::vector<std::string>& args, Millis timeout) const {
  auto r = it::run_command(it::ProcessOptions{.executable = ctl_, .args = args, .name = "pafctl"},
                           timeout);
  if (!r.status.success()) {
    std::string what;
    for (const auto& a : args) what += " " + a;
    throw it::Failure("pafctl" + what + " failed (" + r.status.describe() + "): " + r.output);
  }
  return r.output;
}

std::optional<std::string> Cluster::primary() const {
  std::string out = ctl({"primary"}, 10s);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (out.empty() || out.find('\n') != std::string::npos) return std::nullopt;
  return out;
}

std::optional<std::string> Cluster::writable() const {
  for (const auto& n : nodes_) {
    try {
      // libpq's own check, the one the sidecars rely on: a session that is read-write.
      it::Db probe("postgresql://postgres@" + n.host + ":" + std::to_string(n.port) +
                   "/postgres?connect_timeout=1&target_session_attrs=read-write");
      return n.name;
    } catch (const std::exception&) {
      // Down, in recovery or read-only: not this one.
    }
  }
  return std::nullopt;
}

std::string Cluster::wait_promoted(const std::string& old_primary, Millis within) const {
  const it::Deadline deadline(within);
  for (;;) {
    if (auto w = writable(); w && *w != old_primary) return *w;
    if (deadline.passed()) {
      throw it::Failure("no node but " + old_primary + " accepts writes after " +
                        std::to_string(within.count()) + " ms; the monitor says:\n" + state());
    }
    std::this_thread::sleep_for(20ms);  // polling the cluster with a deadline
  }
}

void Cluster::kill(const std::string& node) const { ctl({"kill", node}, 20s); }

void Cluster::start(const std::string& node) const { ctl({"start", node}, 20s); }

void Cluster::wait_healthy(Millis within) const {
  const auto seconds = std::to_string((within.count() + 999) / 1000);
  ctl({"wait-healthy", seconds}, within + 10s);
}

void Cluster::switchover() const { ctl({"switchover"}, 90s); }

std::string Cluster::state() const {
  try {
    return ctl({"state"}, 10s);
  } catch (const std::exception& e) {
    return std::string("(state unavailable: ") + e.what() + ")";
  }
}

}  // namespace idem::chaos
