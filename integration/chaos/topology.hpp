#pragma once
// The system under test of the fault-injection run, as real processes:
//
//   clients ─▶ replica 0 ─▶ link r0-api ─┐               ┌─ link r0-pg ◀─ replica 0
//           └▶ replica 1 ─▶ link r1-api ─┴▶ order API ─▶ PostgreSQL ◀─ link r1-pg ◀─ replica 1
//
// Two idemproxy replicas on one PostgreSQL database of their own (created for the run on
// the server the environment names), the reference order API (durable in the same
// database, started with --enable-fault-injection), and one fault proxy process holding
// the four links. Every process logs into the run's directory. The nemesis acts through
// the methods below; heal() undoes everything it may have done.
//
// With a cluster (--failover), the replicas' store is the pg_auto_failover cluster
// instead (cluster.hpp), reached through a libpq multi-host URI with
// target_session_attrs=read-write over one link per replica and node (r0-pg-a, r0-pg-b,
// r1-pg-a, r1-pg-b), and the order API keeps its database on the server of the
// environment: what reached the backend is recorded where no failover can lose it.
//
//   replica r ─▶ link rR-pg-a ─▶ node a (primary)  ◀─ sync replication ─▶ node b ◀─ link rR-pg-b
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "link_mode.hpp"
#include "support/harness.hpp"

namespace idem::chaos {

using it::Millis;

// A libpq URI split where the run needs to change it (the fault proxy's port, the run's
// own database). Only the postgresql:// and postgres:// forms.
struct PgUrl {
  std::string scheme_and_user;  // "postgresql://" or "postgresql://user[:pw]@"
  std::string host;
  std::uint16_t port = 5432;
  std::string database;
  std::string query;  // "" or "?..."

  std::string with(std::string_view host, std::uint16_t port, std::string_view database) const;
};
std::optional<PgUrl> parse_pg_url(std::string_view url);

struct TopologyOptions {
  std::string server_url;  // DATABASE_URL: a server the run may create a database on
  std::string database;    // the run's database, created here, e.g. chaos_1234
  Millis lease{1000};
  Millis wait{300};
  Millis response_timeout{1000};
  std::string retention = "24h";
  // --failover: the replicas' store (the run's database is created there too); null: the
  // store is server_url's database, as the order API's.
  const Cluster* cluster = nullptr;
  // The replicas' executable (an older release, for an upgrade run); empty: the build's.
  std::string replica_binary;
};

// Counters of one replica's /metrics (sums over label sets that matter to the summary).
using MetricValues = std::map<std::string, double>;
MetricValues parse_metrics(std::string_view text);

class Topology {
 public:
  static constexpr int kReplicas = 2;

  explicit Topology(TopologyOptions options);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  std::uint16_t replica_port(int replica) const;
  std::uint16_t admin_port(int replica) const;
  // A rolling upgrade's step for one replica: SIGTERM, the drain waited out (up to
  // `drain`), then the same configuration started on `binary`, waited until listening.
  void replace_replica(int replica, const std::string& binary, Millis drain);
  // The order API's database (orders, arrivals) and the replicas' store (records), direct;
  // one database unless the store is a cluster.
  const std::string& database_url() const { return run_url_; }
  const std::string& store_url() const { return store_url_; }
  const TopologyOptions& options() const { return options_; }

  void kill_replica(int replica);
  // Starts a killed replica again, retrying (PostgreSQL may be restarting) until `within`.
  void start_replica(int replica, Millis within = std::chrono::seconds(60));
  // Starts a killed (or resumes a paused) replica without waiting for it to listen: a
  // replica whose database is out of reach waits for it (database.start_wait), and the
  // fault that keeps it out of reach may heal only after this one.
  void spawn_replica(int replica);
  // Waits until the replica listens, starting it again whenever it has exited, until
  // `within`.
  void await_replica(int replica, Millis within = std::chrono::seconds(60));
  void signal_replica(int replica, int sig);

  void kill_backend();
  void start_backend(Millis within = std::chrono::seconds(60));
  void signal_backend(int sig);
  // PUT /_faults on the order API (order_api.hpp); "{}" turns every switch off.
  void backend_faults(const std::string& json);

  void set_links(const std::vector<std::string>& links, const LinkMode& mode);
  // pgctl restart-fast | restart-immediate (scripts/lib/pg-up).
  void restart_database(bool immediate);

  // The cluster (--failover only). A node killed here stays down until start_node() or
  // heal(); with `vanish`, the replicas' links to it blackhole meanwhile.
  const Cluster& cluster() const;
  void kill_node(const std::string& node, bool vanish);
  void start_node(const std::string& node);

  // Everything back to normal: processes resumed and running, links passing, the order
  // API's switches off. Throws if something cannot be brought back.
  void heal();

  // The replica's counters now, or nullopt when it does not answer (paused, down).
  std::optional<MetricValues> scrape(int replica);

  // Orderly stop of every process (SIGCONT first, so a paused one can die).
  void stop();

 private:
  struct Replica {
    std::unique_ptr<it::Sidecar> sidecar;
    std::uint16_t admin_port = 0;
    bool paused = false;
  };

  void start_proxy();
  void start_backend_process();
  it::SidecarOptions replica_options(int replica) const;

  TopologyOptions options_;
  std::string run_url_;
  std::string store_url_;
  std::vector<std::string> down_nodes_;  // killed by kill_node(), not started since
  PgUrl server_;
  std::unique_ptr<it::Process> proxy_;
  std::uint16_t control_port_ = 0;
  std::map<std::string, std::uint16_t> link_ports_;
  std::unique_ptr<it::Process> backend_;
  std::uint16_t backend_port_ = 0;
  bool backend_paused_ = false;
  Replica replicas_[kReplicas];
};

}  // namespace idem::chaos
