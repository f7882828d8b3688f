#include "app/commands.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <functional>
#include <iostream>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <spdlog/spdlog.h>

#include "app/config.hpp"
#include "app/sidecar.hpp"
#include "observability/logging.hpp"
#include "common/time_text.hpp"
#include "settings/detail.hpp"
#include "store/migrations.hpp"

namespace idem::app {
namespace {

// database.migrate: bring the schema up to date, or refuse to serve on one that is behind.
// Returns whether to serve; throws store::DatabaseUnreachable when no host answered, and
// any other exception for a failure that waiting would not end.
bool prepare_database_once(const settings::Settings& cfg, const std::string& path) {
  switch (cfg.database.migrate) {
    case settings::MigrateMode::automatic: {
      store::MigrateOptions options;
      options.connect_timeout = cfg.database.connect_timeout;
      options.on_event = [](const store::MigrationEvent& e) {
        if (e.kind == store::MigrationEvent::Kind::note || e.kind == store::MigrationEvent::Kind::step_retry) {
          spdlog::info("migrate: {}{}", e.name.empty() ? "" : e.name + ": ", e.detail);
        }
      };
      const auto report = store::apply_migrations(cfg.database.url, options);
      for (int v : report.applied) spdlog::info("applied migration {}", v);
      return true;
    }
    case settings::MigrateMode::check: {
      const auto check = store::check_schema(cfg.database.url, cfg.database.connect_timeout);
      if (check.status == store::SchemaStatus::current) return true;
      if (check.status == store::SchemaStatus::newer_compatible) {
        // A replica of the previous release during a rolling upgrade, or one rolled
        // back: the database says it may serve (docs/operations.md, "Upgrading").
        spdlog::warn("database schema: {}: serving", check.detail);
        return true;
      }
      if (check.status == store::SchemaStatus::incompatible) {
        spdlog::critical("database schema: {}", check.detail);
        return false;
      }
      spdlog::critical("database schema is not current ({}); run `idemproxy migrate --config {}` "
                       "or set database.migrate: auto",
                       check.detail, path);
      return false;
    }
    case settings::MigrateMode::off:
      return true;
  }
  return false;
}

// prepare_database_once(), waiting up to database.start_wait for a database that cannot be
// reached: a replica started while PostgreSQL restarts or fails over (a deploy meeting a
// maintenance, a node replaced) serves as soon as it answers, instead of exiting into its
// orchestrator's restart back-off, which can keep it down for minutes after the database
// is back. Nothing listens meanwhile (the replica is not ready, so nothing is routed to
// it), and SIGTERM still ends the process at once: no handler is installed yet. The wait
// is here and not in the migrator: `idemproxy migrate` is a one-shot command whose retry
// belongs to whatever runs it.
bool prepare_database(const settings::Settings& cfg, const std::string& path) {
  const auto deadline = SteadyClock::now() + cfg.database.start_wait;
  Millis pause{250};
  for (;;) {
    try {
      return prepare_database_once(cfg, path);
    } catch (const store::DatabaseUnreachable& e) {
      const auto left = std::chrono::duration_cast<Millis>(deadline - SteadyClock::now());
      if (left <= Millis{0}) {
        spdlog::critical("cannot prepare the database: {} (no answer within database.start_wait, {})",
                         e.what(), settings::detail::format_duration(cfg.database.start_wait));
        return false;
      }
      const Millis wait = std::min(pause, left);
      spdlog::warn("the database cannot be reached: {}; trying again in {} (database.start_wait: {} left)",
                   e.what(), settings::detail::format_duration(wait),
                   settings::detail::format_duration(left));
      std::this_thread::sleep_for(wait);
      pause = std::min(pause * 2, Millis{5000});
    } catch (const std::exception& e) {
      spdlog::critical("cannot prepare the database: {}", e.what());
      return false;
    }
  }
}

// What an operator must see at start and after every reload: checks that are off, and the
// key material in use.
void log_security(const gateway::Runtime& runtime) {
  const auto& cfg = runtime.settings();
  if (cfg.upstream.https && !cfg.upstream.tls.verify) {
    spdlog::warn("upstream.tls.verify is false: the backend's certificate and name are not checked, "
                 "so anyone on the path to {} can read and answer requests", cfg.upstream.host);
  }
  if (!cfg.encryption.keys.empty()) {
    spdlog::info("encryption at rest: new records sealed with key {}; keys listed to open records: {}",
                 cfg.encryption.active, cfg.encryption.keys.size());
  }
  if (const auto* identity = runtime.identity(); identity && identity->keys()) {
    spdlog::info("tenant from verified bearer tokens: {} keys from {} ({} skipped)", identity->keys()->size(),
                 cfg.tenant.jwt.jwks_file, identity->keys()->skipped());
  }
}

// SIGHUP: an invalid file keeps the running configuration and says why. Everything is
// read and built first (the configuration, the JWKS, the TLS files), then applied at once.
void reload(Sidecar& sidecar, const std::string& path) {
  try {
    const auto loaded = load_runtime(path);
    auto plan = plan_reload(loaded->settings(), sidecar.runtime()->settings(),
                            sidecar.change_feed_running());
    auto next = gateway::Runtime::build(std::move(plan.effective));
    auto tls = load_tls(next->settings());
    // The key files are read again: a missing or unusable one refuses the whole reload,
    // and the running keys stay.
    auto keys = load_key_ring(next->settings());
    for (const auto& key : plan.restart_only) {
      spdlog::warn("reload: {} changed; it applies only after a restart", key);
    }
    obs::setup_logging(next->settings().log);
    log_security(*next);
    sidecar.apply(std::move(next), std::move(tls), std::move(keys));
    spdlog::info("configuration reloaded from {}", path);
  } catch (const settings::ConfigError& e) {
    spdlog::error("reload refused, keeping the running configuration: {}", e.full_message());
  } catch (const std::exception& e) {
    spdlog::error("reload refused, keeping the running configuration: {}", e.what());
  }
}

// Lets in-flight requests finish, up to limits.drain_timeout as configured when the
// signal came, or until a second signal cuts it short. A request cut off here leaves its
// row in progress with a lease nobody renews: a retry takes over once the lease lapses (at
// most `lease` later), with a higher attempt and the same operation id, as after a crash.
void drain(Sidecar& sidecar, asio::io_context& signals_ioc, const bool& cut_short) {
  const auto deadline = SteadyClock::now() + sidecar.runtime()->settings().limits.drain_timeout;
  // Owners count too: an operation that answered 202 has no connection left, but its
  // record is still to be written.
  const auto busy = [&] { return sidecar.open_connections() > 0 || sidecar.owners_in_flight() > 0; };
  while (busy() && !cut_short && SteadyClock::now() < deadline) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - SteadyClock::now());
    signals_ioc.run_for(std::clamp(left, Millis{1}, Millis{20}));
  }
  if (busy()) {
    spdlog::warn("drain ended with {} connections still open and {} operations running; their "
                 "records stay in progress and a retry takes over once the lease lapses",
                 sidecar.open_connections(), sidecar.owners_in_flight());
  } else {
    spdlog::info("drained: every in-flight request has been answered");
  }
}

}  // namespace

int serve(const std::string& path, const std::string& version) {
  const auto runtime = load_runtime(path);
  auto tls = load_tls(runtime->settings());
  load_key_ring(runtime->settings());  // refused here, with exit status 2, before any work
  obs::setup_logging(runtime->settings().log);
  log_security(*runtime);
  if (!prepare_database(runtime->settings(), path)) return kExitFailure;

  // Installed before any worker starts, so an early SIGTERM drains instead of killing.
  asio::io_context signals_ioc{1};
  asio::signal_set signals(signals_ioc, SIGINT, SIGTERM, SIGHUP);

  std::unique_ptr<Sidecar> sidecar;
  try {
    sidecar = std::make_unique<Sidecar>(runtime, std::move(tls));
    sidecar->start();
  } catch (const std::exception& e) {
    spdlog::critical("cannot start: {}", e.what());
    if (sidecar) sidecar->stop();
    return kExitFailure;
  }
  spdlog::info("idemproxy {} {}", version, sidecar->summary());

  // SIGHUP reloads at any time. The first SIGTERM/SIGINT starts the drain; another one
  // during the drain cuts it short (an operator who asks twice means it).
  bool draining = false;
  bool cut_short = false;
  std::function<void(const error_code&, int)> on_signal = [&](const error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP) {
      reload(*sidecar, path);
    } else if (!draining) {
      spdlog::info("signal {}: draining (no new connections; in-flight requests may take up "
                   "to limits.drain_timeout)", sig);
      draining = true;
      sidecar->begin_drain();
    } else {
      spdlog::warn("signal {} during the drain: stopping now", sig);
      cut_short = true;
    }
    signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);
  while (!draining) signals_ioc.run_one();
  drain(*sidecar, signals_ioc, cut_short);
  sidecar->stop();
  spdlog::info("stopped");
  spdlog::shutdown();
  return kExitOk;
}

namespace {

// One line per migrator event, timed (UTC, milliseconds), so an operator can follow a
// long backfill and scripts/upgrade-check can attribute claim stalls to steps.
void print_event(const store::MigrationEvent& e) {
  using K = store::MigrationEvent::Kind;
  const auto now = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  std::string line = rfc3339_from_us(now.count()) + " ";
  switch (e.kind) {
    case K::migration_started: line += e.name + ": started (" + e.detail + ")"; break;
    case K::step_started:
      line += e.name + " step " + std::to_string(e.step) + "/" + std::to_string(e.steps) +
              " started: " + e.detail;
      break;
    case K::step_progress:
    case K::step_retry:
      line += e.name + " step " + std::to_string(e.step) + "/" + std::to_string(e.steps) + ": " + e.detail;
      break;
    case K::step_done:
      line += e.name + " step " + std::to_string(e.step) + "/" + std::to_string(e.steps) +
              " done in " + fmt::format("{:.3f}", e.seconds) + " s";
      break;
    case K::migration_done:
      line += e.name + ": applied in " + fmt::format("{:.3f}", e.seconds) + " s";
      break;
    case K::note: line += (e.name.empty() ? "" : e.name + ": ") + e.detail; break;
  }
  std::cout << line << std::endl;  // flushed: a caller follows it as it happens
}

}  // namespace

int migrate(const std::string& path, const MigrateArgs& args) {
  const auto rt = load_runtime(path);
  const auto& db = rt->settings().database;
  try {
    if (args.plan) {
      std::cout << store::plan_migrations(db.url, db.connect_timeout);
      return kExitOk;
    }
    store::MigrateOptions options;
    options.connect_timeout = db.connect_timeout;
    if (args.lock_wait) options.lock_wait = *args.lock_wait;
    if (args.backfill_rest) options.backfill_rest = *args.backfill_rest;
    options.release = args.release;
    options.contract = args.contract;
    options.on_event = print_event;
    const auto report = store::apply_migrations(db.url, options);
    if (report.applied.empty()) {
      std::cout << (report.current_version > report.binary_version ? "nothing to apply (version "
                                                                   : "schema is current (version ")
                << report.current_version << ")\n";
    } else {
      for (int v : report.applied) std::cout << "applied migration " << v << "\n";
      std::cout << "schema is now at version " << report.current_version << "\n";
    }
    if (!report.held_back.empty()) {
      std::cout << "held back (contract):";
      for (int v : report.held_back) std::cout << " " << v;
      std::cout << "; apply with `idemproxy migrate --contract` once every replica runs this release\n";
    }
    return kExitOk;
  } catch (const std::exception& e) {
    std::cerr << "idemproxy: migrate failed: " << e.what() << "\n";
    return kExitFailure;
  }
}

int check_config(const std::string& path) {
  const auto rt = load_runtime(path);
  load_tls(rt->settings());  // the files must be usable too
  load_key_ring(rt->settings());
  std::cout << settings::render_effective(rt->settings());
  return kExitOk;
}

}  // namespace idem::app
