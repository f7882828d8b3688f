#pragma once
// Runs the idemproxy binary under test. SidecarOptions describes a configuration in test
// terms (ports, upstream, routes) and sidecar_config() renders it as the YAML of contract
// §3; Sidecar writes that to a file, starts `idemproxy serve --config FILE` and waits until
// it accepts connections. Defaults are tuned for tests: short leases and waits so that
// takeover and in-progress paths run in well under a second, admin listener off.
//
// A string option left empty is omitted from the YAML, so the sidecar's own default
// applies; that is how a test covers the documented defaults.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/process.hpp"

namespace idem::it {

struct RouteOptions {
  std::string name = "create-order";
  std::string method = "POST";
  std::string path = "/orders";
  std::string scope;  // empty: the sidecar's default, "METHOD path"

  std::string key_header = "Idempotency-Key";
  bool key_required = true;
  std::optional<int> key_max_length;
  // key.from (header | body | query) with key.pointer / key.param; empty: omitted.
  std::string key_from;
  std::string key_pointer;
  std::string key_param;

  // fingerprint.format (json | form | raw), its media_types and repeated_names; empty or
  // [] : omitted.
  std::string fingerprint_format;
  std::vector<std::string> fingerprint_media_types;
  std::string fingerprint_repeated_names;

  std::string fingerprint_version = "1";
  // JSON Pointers; nullopt: the key is omitted and the whole body (minus ignore) counts.
  std::optional<std::vector<std::string>> fingerprint_fields;
  std::vector<std::string> fingerprint_ignore;
  // JSON Pointer -> default value as JSON text (JSON is valid YAML): {"/currency", "\"EUR\""}.
  std::vector<std::pair<std::string, std::string>> fingerprint_defaults;
  std::vector<std::string> fingerprint_headers;
  bool fingerprint_query = false;

  std::string retention = "24h";
  std::string lease = "2s";
  std::string wait = "300ms";
  std::string retry_after = "1s";
  int mismatch_status = 409;
  std::vector<std::string> store_statuses = {"2xx", "4xx"};
  std::vector<int> store_except = {408, 425, 429};
  std::vector<std::string> replay_headers = {"Content-Type", "Location", "ETag"};
  std::string max_stored_body;

  // Appended verbatim inside this route's mapping (lines indented by 4 spaces), for keys
  // this struct does not know yet.
  std::string extra_yaml;
};

struct SidecarOptions {
  std::uint16_t port = 0;  // 0: Sidecar picks a free port (sidecar_config() requires one)

  std::string upstream_url;  // required, e.g. TestBackend::url()
  std::string upstream_connect_timeout = "1s";
  std::string upstream_response_timeout = "5s";
  std::string upstream_max_response_body;
  // Appended inside `upstream:` (lines indented by 2), e.g. "tls:\n  ca_file: ...".
  std::string upstream_extra_yaml;

  std::string database_url;  // empty: database_url() from the environment
  std::optional<int> database_pool_size = 4;
  std::string database_connect_timeout = "2s";
  std::string database_statement_timeout = "2s";
  std::string database_migrate = "auto";  // tests start on whatever schema is there
  std::string database_start_wait;        // empty: the product default

  std::string tenant_header = "X-Tenant-Id";
  std::string principal_header;
  // Appended inside `tenant:` (lines indented by 2), e.g. "from: jwt\njwt: ...".
  std::string tenant_extra_yaml;

  std::string max_header_bytes;
  std::string max_request_body;
  std::string header_timeout;
  std::string body_timeout;
  std::string idle_timeout;
  std::optional<int> max_connections;
  std::string drain_timeout;  // limits.drain_timeout (SIGTERM drain bound)

  std::string admin_listen;  // always written; empty disables the admin listener
  std::string admin_token;

  std::string log_level = "info";
  std::string log_format = "json";

  std::string cleanup_interval;
  std::optional<int> cleanup_batch;

  std::string unmatched = "pass";
  std::vector<RouteOptions> routes = {RouteOptions{}};

  // Appended verbatim at the top level, for keys this struct does not know yet.
  std::string extra_yaml;
};

// The YAML text for `options`. Strings are double-quoted and escaped; sizes and durations
// made only of digits are written as integers.
std::string sidecar_config(const SidecarOptions& options);

struct SidecarLaunch {
  std::string binary;  // empty: idemproxy_binary() (env.hpp)
  EnvList env;         // extra environment for the sidecar process
  Millis start_timeout = 15s;
  bool wait_until_listening = true;  // false: return right after spawning (tests of bad configs)
};

class Sidecar {
 public:
  // Picks a free port when options.port is 0, renders the config and starts.
  explicit Sidecar(SidecarOptions options, SidecarLaunch launch = {});
  // A hand-written config; `port` must be the one its `listen` names.
  Sidecar(std::string yaml, std::uint16_t port, SidecarLaunch launch = {});
  ~Sidecar();

  std::uint16_t port() const { return port_; }
  std::string url() const;  // http://127.0.0.1:<port>
  // Waits until the log shows `n` completed reloads ("configuration reloaded") or `n`
  // refused ones ("reload refused"), whichever the test names.
  void wait_for_log(std::string_view needle, std::size_t n = 1, Millis timeout = kDefaultTimeout);
  const std::filesystem::path& config_path() const { return config_path_; }
  const std::string& config() const { return yaml_; }

  void signal(int sig);
  // SIGKILL and reap: a crash, with no chance to clean up.
  void kill9();
  // SIGTERM and wait for the exit; throws Failure (with the log tail) if it does not exit
  // within `timeout`, and then kills it.
  ExitStatus stop(Millis timeout = 10s);
  // Starts the process again with the current config file (after stop() or kill9()).
  // `wait` false: returns once the process is spawned (wait_until_listening() later).
  void restart(bool wait = true);
  // The executable of the next start (a rolling upgrade starts another release).
  void set_binary(std::string binary) { launch_.binary = std::move(binary); }
  // Rewrites the config file and sends SIGHUP.
  void reload(std::string yaml);
  bool running();
  // Waits until the port accepts connections; fails early if the process ends.
  void wait_until_listening(Millis timeout);

  Process& process() { return *process_; }
  std::string log() const;
  std::string log_tail(std::size_t lines = 40) const;

 private:
  void start(bool wait = true);

  SidecarLaunch launch_;
  std::uint16_t port_ = 0;
  std::string yaml_;
  TempDir dir_{"idem-sidecar"};
  std::filesystem::path config_path_;
  std::unique_ptr<Process> process_;
};

// Runs `idemproxy <args...>` to completion (migrate, check-config, --version).
CommandResult run_idemproxy(std::vector<std::string> args, EnvList env = {},
                            Millis timeout = kDefaultTimeout);

}  // namespace idem::it
