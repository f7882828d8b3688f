#include "topology.hpp"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include "faults.hpp"

#ifndef IDEM_ORDER_BACKEND_BIN
#define IDEM_ORDER_BACKEND_BIN ""
#endif
#ifndef IDEM_FAULT_PROXY_BIN
#define IDEM_FAULT_PROXY_BIN ""
#endif

namespace idem::chaos {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::string binary(const char* variable, const char* built) {
  std::string path = it::env(variable).value_or("");
  if (path.empty()) path = built;
  std::error_code ec;
  if (path.empty() || !fs::is_regular_file(path, ec)) {
    throw it::Failure(std::string(variable) + ": no binary at '" + path +
                      "' (build it, or set the variable)");
  }
  return path;
}

std::string millis(Millis d) { return std::to_string(d.count()) + "ms"; }

// "LINK r0-pg 41234" lines of the fault proxy's output.
std::map<std::string, std::uint16_t> link_ports(const std::string& log) {
  std::map<std::string, std::uint16_t> out;
  std::istringstream in(log);
  std::string word, name;
  unsigned port = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    if (fields >> word >> name >> port && word == "LINK") {
      out[name] = static_cast<std::uint16_t>(port);
    }
  }
  return out;
}

// Runs `step` until it stops throwing or `within` passes (then rethrows its last failure).
template <class F>
void retry_until(Millis within, const std::string& what, F step) {
  const it::Deadline deadline(within);
  for (;;) {
    try {
      step();
      return;
    } catch (const std::exception& e) {
      if (deadline.passed()) throw it::Failure(what + ": " + e.what());
    }
    std::this_thread::sleep_for(200ms);  // a process start retried, not a test waiting
  }
}

}  // namespace

// ------------------------------------------------------------------------- PgUrl

std::optional<PgUrl> parse_pg_url(std::string_view url) {
  PgUrl out;
  std::string_view rest;
  for (const std::string_view scheme : {"postgresql://", "postgres://"}) {
    if (url.starts_with(scheme)) rest = url.substr(scheme.size());
  }
  if (rest.empty()) return std::nullopt;
  const std::string_view scheme = url.substr(0, url.size() - rest.size());
  const auto query = rest.find('?');
  if (query != std::string_view::npos) {
    out.query = std::string(rest.substr(query));
    rest = rest.substr(0, query);
  }
  const auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  out.database = slash == std::string_view::npos ? "" : std::string(rest.substr(slash + 1));
  const auto at = authority.rfind('@');
  out.scheme_and_user = std::string(scheme);
  if (at != std::string_view::npos) {
    out.scheme_and_user += std::string(authority.substr(0, at + 1));
    authority = authority.substr(at + 1);
  }
  if (authority.find(',') != std::string_view::npos || authority.starts_with('[')) {
    return std::nullopt;  // several hosts, or IPv6: not what a throwaway server gives
  }
  const auto colon = authority.find(':');
  out.host = std::string(authority.substr(0, colon));
  if (colon != std::string_view::npos) {
    const std::string port(authority.substr(colon + 1));
    char* end = nullptr;
    const long n = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || n < 1 || n > 65535) return std::nullopt;
    out.port = static_cast<std::uint16_t>(n);
  }
  if (out.host.empty()) out.host = "127.0.0.1";
  return out;
}

std::string PgUrl::with(std::string_view new_host, std::uint16_t new_port,
                        std::string_view new_database) const {
  return scheme_and_user + std::string(new_host) + ":" + std::to_string(new_port) + "/" +
         std::string(new_database) + query;
}

MetricValues parse_metrics(std::string_view text) {
  MetricValues out;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line.front() == '#') continue;
    const auto space = line.rfind(' ');
    if (space == std::string::npos) continue;
    const std::string series = line.substr(0, space);
    const std::string name = series.substr(0, series.find('{'));
    if (name.ends_with("_bucket") || name.ends_with("_sum") || name.ends_with("_count")) continue;
    try {
      out[series] = std::stod(line.substr(space + 1));
    } catch (const std::exception&) {
      // A value we cannot read is not worth failing a run for.
    }
  }
  return out;
}

// ---------------------------------------------------------------------- Topology

Topology::Topology(TopologyOptions options) : options_(std::move(options)) {
  auto server = parse_pg_url(options_.server_url);
  if (!server) {
    throw it::Failure("DATABASE_URL must be a postgresql://[user@]host:port/db URI, got '" +
                      options_.server_url + "'");
  }
  server_ = *server;
  run_url_ = server_.with(server_.host, server_.port, options_.database);
  store_url_ = options_.cluster ? options_.cluster->url(options_.database) : run_url_;
  // The database name is made of [a-z0-9_] by the caller: an identifier cannot be a
  // parameter. Commits must survive an immediate shutdown, which the throwaway server's
  // synchronous_commit = off does not promise: this database turns it back on (on the
  // cluster it is on anyway, and waits for the synchronous standby).
  const auto create = [&](const std::string& admin_url) {
    it::Db admin(admin_url);
    admin.exec("CREATE DATABASE " + options_.database);
    admin.exec("ALTER DATABASE " + options_.database + " SET synchronous_commit = on");
  };
  create(options_.server_url);
  if (options_.cluster) {
    create(options_.cluster->url("postgres"));
    // Synchronous replication waits for the standby's flush, not its replay: until the
    // standby has replayed the CREATE DATABASE, a session there is refused (3D000), and
    // the harness's own blocking connects (libpq's list handling) would stop at it.
    for (const auto& n : options_.cluster->nodes()) {
      retry_until(30s, "node " + n.name + " did not show the run's database", [&] {
        it::Db node("postgresql://postgres@" + n.host + ":" + std::to_string(n.port) + "/" +
                    options_.database + "?connect_timeout=2");
      });
    }
  }
  start_backend_process();
  start_proxy();
  for (int r = 0; r < kReplicas; ++r) {
    replicas_[r].admin_port = it::free_port();
    replicas_[r].sidecar = std::make_unique<it::Sidecar>(
        replica_options(r), it::SidecarLaunch{.binary = options_.replica_binary});
  }
}

Topology::~Topology() {
  try {
    stop();
  } catch (...) {
    // Processes are killed by their destructors anyway.
  }
}

void Topology::start_backend_process() {
  backend_ = std::make_unique<it::Process>(it::ProcessOptions{
      .executable = binary("IDEM_ORDER_BACKEND_BIN", IDEM_ORDER_BACKEND_BIN),
      .args = {"api", "--enable-fault-injection", "--record-arrivals", "--database-url", run_url_, "--listen",
               "127.0.0.1:" + std::to_string(backend_port_), "--operation-retention",
               options_.retention, "--pool-size", "8"},
      .name = "order_api",
  });
  const std::string line = backend_->wait_for_output("LISTENING ", 20s);
  backend_port_ = static_cast<std::uint16_t>(std::stoul(line.substr(line.find("LISTENING ") + 10)));
  backend_paused_ = false;
}

void Topology::start_proxy() {
  std::vector<std::string> args{"--control", "127.0.0.1:0"};
  for (int r = 0; r < kReplicas; ++r) {
    if (options_.cluster) {
      for (const auto& n : options_.cluster->nodes()) {
        args.push_back("--link");
        args.push_back(node_link_name(r, n.name) + "=0:" + n.host + ":" + std::to_string(n.port));
      }
    } else {
      args.push_back("--link");
      args.push_back(link_name(r, true) + "=0:" + server_.host + ":" + std::to_string(server_.port));
    }
    args.push_back("--link");
    args.push_back(link_name(r, false) + "=0:127.0.0.1:" + std::to_string(backend_port_));
  }
  proxy_ = std::make_unique<it::Process>(it::ProcessOptions{
      .executable = binary("IDEM_FAULT_PROXY_BIN", IDEM_FAULT_PROXY_BIN),
      .args = std::move(args),
      .name = "fault_proxy",
  });
  proxy_->wait_for_output("READY", 10s);
  const std::string log = proxy_->log();
  const auto control = log.find("CONTROL ");
  control_port_ = static_cast<std::uint16_t>(std::stoul(log.substr(control + 8)));
  link_ports_ = link_ports(log);
}

it::SidecarOptions Topology::replica_options(int r) const {
  it::SidecarOptions s;
  s.upstream_url = "http://127.0.0.1:" + std::to_string(link_ports_.at(link_name(r, false)));
  s.upstream_connect_timeout = "500ms";
  s.upstream_response_timeout = millis(options_.response_timeout);
  if (options_.cluster) {
    // Every node, in the cluster's order, through this replica's links; libpq keeps the
    // one that takes writes.
    std::string hosts;
    for (const auto& n : options_.cluster->nodes()) {
      if (!hosts.empty()) hosts += ",";
      hosts += "127.0.0.1:" + std::to_string(link_ports_.at(node_link_name(r, n.name)));
    }
    s.database_url = "postgresql://postgres@" + hosts + "/" + options_.database +
                     "?target_session_attrs=read-write";
  } else {
    s.database_url =
        server_.with("127.0.0.1", link_ports_.at(link_name(r, true)), options_.database);
  }
  s.database_pool_size = 8;
  s.database_connect_timeout = "1s";
  s.database_statement_timeout = "1s";
  s.database_migrate = "auto";
  s.admin_listen = "127.0.0.1:" + std::to_string(replicas_[r].admin_port);
  s.log_level = "info";
  s.log_format = "json";

  it::RouteOptions route;  // config/demo.yaml's route, with the run's timings
  route.fingerprint_fields = std::vector<std::string>{"/customer_id", "/currency",    "/amount",
                                                      "/items",       "/checkout_id", "/coupon"};
  route.fingerprint_defaults = {{"/currency", "\"EUR\""}};
  route.retention = options_.retention;
  route.lease = millis(options_.lease);
  route.wait = millis(options_.wait);
  route.retry_after = "1s";
  route.replay_headers = {"Content-Type", "Location"};
  s.routes = {route};
  // Replica 0 answers retries from its replay cache, replica 1 always from PostgreSQL:
  // both paths run under the same faults.
  // (The cache is on by default: replica 1 turns it off.)
  s.extra_yaml = r == 0 ? "replay_cache:\n  enabled: true\n  max_bytes: 8MiB\n  ttl: 10s\n"
                        : "replay_cache:\n  enabled: false\n";
  return s;
}

std::uint16_t Topology::replica_port(int r) const { return replicas_[r].sidecar->port(); }
std::uint16_t Topology::admin_port(int r) const { return replicas_[r].admin_port; }

void Topology::replace_replica(int r, const std::string& binary, Millis drain) {
  auto& replica = replicas_[r];
  replica.sidecar->stop(drain);
  replica.sidecar->set_binary(binary);
  replica.sidecar->restart();
}

void Topology::kill_replica(int r) {
  replicas_[r].sidecar->kill9();
  replicas_[r].paused = false;
}

void Topology::start_replica(int r, Millis within) {
  auto& replica = replicas_[r];
  if (replica.paused) {
    replica.sidecar->signal(SIGCONT);
    replica.paused = false;
  }
  if (replica.sidecar->running()) return;
  retry_until(within, "replica " + std::to_string(r) + " did not start again", [&] {
    if (!replica.sidecar->running()) replica.sidecar->restart();
  });
}

void Topology::spawn_replica(int r) {
  auto& replica = replicas_[r];
  if (replica.paused) {
    replica.sidecar->signal(SIGCONT);
    replica.paused = false;
  }
  if (!replica.sidecar->running()) replica.sidecar->restart(false);
}

void Topology::await_replica(int r, Millis within) {
  auto& replica = replicas_[r];
  retry_until(within, "replica " + std::to_string(r) + " did not start again", [&] {
    if (!replica.sidecar->running()) replica.sidecar->restart(false);
    replica.sidecar->wait_until_listening(std::chrono::seconds(5));
  });
}

void Topology::signal_replica(int r, int sig) {
  replicas_[r].sidecar->signal(sig);
  if (sig == SIGSTOP) replicas_[r].paused = true;
  if (sig == SIGCONT) replicas_[r].paused = false;
}

void Topology::kill_backend() {
  backend_->kill();
  backend_paused_ = false;
}

void Topology::start_backend(Millis within) {
  if (backend_paused_) {
    backend_->signal(SIGCONT);
    backend_paused_ = false;
  }
  if (backend_->running()) return;
  retry_until(within, "the order API did not start again", [&] {
    if (!backend_->running()) start_backend_process();
  });
}

void Topology::signal_backend(int sig) {
  backend_->signal(sig);
  if (sig == SIGSTOP) backend_paused_ = true;
  if (sig == SIGCONT) backend_paused_ = false;
}

void Topology::backend_faults(const std::string& json) {
  it::HttpClient client(backend_port_);
  const auto res =
      client.request("PUT", "/_faults", {{"Content-Type", "application/json"}}, json, 3s);
  if (res.status != 200) {
    throw it::Failure("PUT /_faults " + json + " answered " + std::to_string(res.status) + ": " +
                      res.body);
  }
}

void Topology::set_links(const std::vector<std::string>& links, const LinkMode& mode) {
  it::HttpClient client(control_port_);
  for (const auto& link : links) {
    const auto res = client.request("PUT", "/links/" + link, {{"Content-Type", "application/json"}},
                                    render_link_mode(mode), 3s);
    if (res.status != 200) {
      throw it::Failure("fault proxy: PUT /links/" + link + " answered " +
                        std::to_string(res.status) + ": " + res.body);
    }
  }
}

void Topology::restart_database(bool immediate) {
  it::pgctl(immediate ? "restart-immediate" : "restart-fast", 90s);
}

const Cluster& Topology::cluster() const {
  if (!options_.cluster) throw it::Failure("this run's store is not a cluster (--failover)");
  return *options_.cluster;
}

void Topology::kill_node(const std::string& node, bool vanish) {
  if (vanish) {
    std::vector<std::string> links;
    for (int r = 0; r < kReplicas; ++r) links.push_back(node_link_name(r, node));
    set_links(links, LinkMode{.kind = LinkKind::blackhole});
  }
  cluster().kill(node);
  if (std::find(down_nodes_.begin(), down_nodes_.end(), node) == down_nodes_.end()) {
    down_nodes_.push_back(node);
  }
}

void Topology::start_node(const std::string& node) {
  // The machine is back: reachable again, then its service starts and rejoins.
  std::vector<std::string> links;
  for (int r = 0; r < kReplicas; ++r) links.push_back(node_link_name(r, node));
  set_links(links, LinkMode{});
  cluster().start(node);
  down_nodes_.erase(std::remove(down_nodes_.begin(), down_nodes_.end(), node), down_nodes_.end());
}

void Topology::heal() {
  std::vector<std::string> all;
  for (const auto& [name, port] : link_ports_) all.push_back(name);
  set_links(all, LinkMode{});
  if (options_.cluster) {
    for (const auto& node : std::vector<std::string>(down_nodes_)) start_node(node);
    options_.cluster->wait_healthy(std::chrono::seconds(120));
  }
  start_backend();
  retry_until(30s, "the order API's fault switches did not turn off", [&] { backend_faults("{}"); });
  for (int r = 0; r < kReplicas; ++r) start_replica(r);
  // The database may have been restarted by the last step: make sure it answers.
  retry_until(60s, "PostgreSQL did not come back", [&] {
    it::Db db(run_url_);
    db.scalar_int("SELECT 1");
    it::Db store(store_url_);
    store.scalar_int("SELECT 1");
  });
}

std::optional<MetricValues> Topology::scrape(int r) {
  if (replicas_[r].paused || !replicas_[r].sidecar->running()) return std::nullopt;
  try {
    it::HttpClient client(replicas_[r].admin_port);
    const auto res = client.get("/metrics", {}, 2s);
    if (res.status != 200) return std::nullopt;
    return parse_metrics(res.body);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void Topology::stop() {
  for (auto& replica : replicas_) {
    if (!replica.sidecar) continue;
    if (replica.paused) replica.sidecar->signal(SIGCONT);
    replica.paused = false;
    if (replica.sidecar->running()) {
      try {
        replica.sidecar->stop(10s);
      } catch (const std::exception&) {
        // stop() killed it after the timeout; its log says why it hung.
      }
    }
  }
  if (backend_) {
    if (backend_paused_) backend_->signal(SIGCONT);
    backend_paused_ = false;
    if (backend_->running()) {
      backend_->signal(SIGTERM);
      if (!backend_->wait_exit(10s)) backend_->kill();
    }
  }
  if (proxy_ && proxy_->running()) {
    proxy_->signal(SIGTERM);
    if (!proxy_->wait_exit(5s)) proxy_->kill();
  }
}

}  // namespace idem::chaos
