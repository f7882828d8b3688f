// Wiring only: parse the command line, load the configuration, build one worker per
// event-loop thread (each with its own store pool, upstream pool and listener on the
// shared port), and handle signals.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include "gateway/gateway.hpp"
#include "gateway/router.hpp"
#include "gateway/waiters.hpp"
#include "observability/logging.hpp"
#include "observability/metrics.hpp"
#include "pg/pool.hpp"
#include "server/server.hpp"
#include "settings/settings.hpp"
#include "store/migrations.hpp"
#include "store/pg_store.hpp"
#include "upstream/client.hpp"

#ifndef IDEMPROXY_VERSION
#define IDEMPROXY_VERSION "0.0.0"
#endif

namespace {

using namespace idem;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr const char* kUsage =
    "usage:\n"
    "  idemproxy [serve] --config FILE      run the sidecar (default command)\n"
    "  idemproxy migrate --config FILE      apply pending migrations, then exit\n"
    "  idemproxy check-config --config FILE validate; print the effective config (secrets masked)\n"
    "  idemproxy --version | --help\n";

struct Command {
  std::string name = "serve";
  std::string config;
};

std::optional<Command> parse_args(int argc, char** argv, int& exit_code) {
  Command cmd;
  bool named = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      exit_code = kExitOk;
      return std::nullopt;
    }
    if (arg == "--version") {
      std::cout << "idemproxy " << IDEMPROXY_VERSION << "\n";
      exit_code = kExitOk;
      return std::nullopt;
    }
    if (arg == "--config" || arg == "-c") {
      if (i + 1 >= argc) {
        std::cerr << "idemproxy: --config needs a file\n" << kUsage;
        exit_code = kExitUsage;
        return std::nullopt;
      }
      cmd.config = argv[++i];
      continue;
    }
    if (arg.rfind("--config=", 0) == 0) {
      cmd.config = arg.substr(9);
      continue;
    }
    if (!named && (arg == "serve" || arg == "migrate" || arg == "check-config")) {
      cmd.name = arg;
      named = true;
      continue;
    }
    std::cerr << "idemproxy: unknown argument '" << arg << "'\n" << kUsage;
    exit_code = kExitUsage;
    return std::nullopt;
  }
  if (cmd.config.empty()) {
    std::cerr << "idemproxy: --config FILE is required\n" << kUsage;
    exit_code = kExitUsage;
    return std::nullopt;
  }
  return cmd;
}

void print_config_error(const settings::ConfigError& e) {
  std::cerr << "idemproxy: " << e.full_message() << "\n";
}

// Loads and fully validates (including what only the gateway can compile, such as
// fingerprint pointers and defaults). Throws ConfigError.
std::shared_ptr<const gateway::Runtime> load_runtime(const std::string& path) {
  auto s = settings::load_file(path);
  if (s->workers > s->database.pool_size) {
    throw settings::ConfigError(path, 0, "database.pool_size",
                                "must be at least `workers` (" + std::to_string(s->workers) +
                                    "): every worker needs its own connection");
  }
  return gateway::Runtime::build(s);
}

// Listener, upstream, database and workers are bound at start-up. A reload keeps the
// running values for them (and says so) rather than half-applying a change.
std::shared_ptr<const gateway::Runtime> reload_runtime(const std::string& path,
                                                       const settings::Settings& running) {
  auto loaded = load_runtime(path);
  auto next = std::make_shared<settings::Settings>(loaded->settings());
  auto keep = [](std::string_view what, auto& field, const auto& current, bool changed) {
    if (changed) spdlog::warn("reload: {} changed; it applies only after a restart", what);
    field = current;
  };
  keep("listen", next->listen, running.listen,
       next->listen.host != running.listen.host || next->listen.port != running.listen.port);
  keep("upstream", next->upstream, running.upstream, next->upstream.url != running.upstream.url ||
       next->upstream.connect_timeout != running.upstream.connect_timeout ||
       next->upstream.response_timeout != running.upstream.response_timeout ||
       next->upstream.max_response_body != running.upstream.max_response_body);
  keep("database", next->database, running.database, next->database.url != running.database.url ||
       next->database.pool_size != running.database.pool_size ||
       next->database.connect_timeout != running.database.connect_timeout ||
       next->database.statement_timeout != running.database.statement_timeout);
  keep("workers", next->workers, running.workers, next->workers != running.workers);
  return gateway::Runtime::build(std::move(next));
}

struct Worker {
  asio::io_context ioc{1};
  std::shared_ptr<pg::Pool> pool;
  std::unique_ptr<store::PgStore> store;
  std::unique_ptr<upstream::Pool> upstream;
  std::unique_ptr<gateway::Gateway> gateway;
  std::unique_ptr<server::Server> server;
  std::thread thread;
};

// Retention: every replica runs this; SKIP LOCKED in the store keeps them from fighting
// over the same rows. Bounded per tick so a backlog never monopolises the database.
asio::awaitable<void> housekeeping(store::Store& store, obs::Metrics& metrics,
                                   std::shared_ptr<gateway::RuntimeHolder> runtime,
                                   std::shared_ptr<std::atomic<bool>> stopping) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  constexpr int kMaxBatchesPerTick = 10;
  while (!stopping->load()) {
    const auto cfg = runtime->load()->settings().cleanup;
    timer.expires_after(cfg.interval);
    error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (stopping->load()) break;
    for (int i = 0; i < kMaxBatchesPerTick; ++i) {
      auto deleted = co_await store.delete_expired(cfg.batch);
      if (!deleted) {
        metrics.store_error("cleanup");
        break;
      }
      metrics.expired_deleted(*deleted);
      if (*deleted < cfg.batch) break;
    }
    auto oldest = co_await store.oldest_in_progress_age();
    if (oldest) {
      metrics.set_in_progress_oldest(
          *oldest ? std::chrono::duration<double>(**oldest).count() : 0.0);
    }
  }
}

int run_migrate(const std::string& path) {
  const auto rt = load_runtime(path);
  const auto& db = rt->settings().database;
  try {
    const auto report = store::apply_migrations(db.url, db.connect_timeout);
    if (report.applied.empty()) {
      std::cout << "schema is current (version " << report.current_version << ")\n";
    } else {
      for (int v : report.applied) std::cout << "applied migration " << v << "\n";
      std::cout << "schema is now at version " << report.current_version << "\n";
    }
    return kExitOk;
  } catch (const std::exception& e) {
    std::cerr << "idemproxy: migrate failed: " << e.what() << "\n";
    return kExitFailure;
  }
}

int run_check_config(const std::string& path) {
  const auto rt = load_runtime(path);
  std::cout << settings::render_effective(rt->settings());
  return kExitOk;
}

int run_serve(const std::string& path) {
  auto runtime = load_runtime(path);
  const auto& cfg = runtime->settings();
  obs::setup_logging(cfg.log);

  try {
    switch (cfg.database.migrate) {
      case settings::MigrateMode::automatic: {
        const auto report = store::apply_migrations(cfg.database.url, cfg.database.connect_timeout);
        for (int v : report.applied) spdlog::info("applied migration {}", v);
        break;
      }
      case settings::MigrateMode::check: {
        const auto check = store::check_schema(cfg.database.url, cfg.database.connect_timeout);
        if (check.status != store::SchemaStatus::current) {
          spdlog::critical("database schema is not current ({}); run `idemproxy migrate --config {}` "
                           "or set database.migrate: auto",
                           check.detail, path);
          return kExitFailure;
        }
        break;
      }
      case settings::MigrateMode::off:
        break;
    }
  } catch (const std::exception& e) {
    spdlog::critical("cannot prepare the database: {}", e.what());
    return kExitFailure;
  }

  // Installed before any worker starts, so an early SIGTERM drains instead of killing.
  asio::io_context signals_ioc{1};
  asio::signal_set signals(signals_ioc, SIGINT, SIGTERM, SIGHUP);

  // pool_size is the process's budget of PostgreSQL connections, split across workers, so
  // the default worker count never exceeds it.
  const int workers =
      cfg.workers > 0 ? cfg.workers
                      : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1,
                                   cfg.database.pool_size);
  auto pool_share = [&](int worker) {
    const int base = cfg.database.pool_size / workers;
    return static_cast<std::size_t>(base + (worker < cfg.database.pool_size % workers ? 1 : 0));
  };

  auto holder = std::make_shared<gateway::RuntimeHolder>(runtime);
  auto metrics = std::make_shared<obs::Metrics>();
  auto waiters = std::make_shared<gateway::WaiterRegistry>();
  auto gauge = std::make_shared<server::ConnectionGauge>();
  auto stopping = std::make_shared<std::atomic<bool>>(false);

  std::vector<std::unique_ptr<Worker>> pool_of_workers;
  try {
    for (int i = 0; i < workers; ++i) {
      auto w = std::make_unique<Worker>();
      pg::PoolOptions po;
      po.conninfo = cfg.database.url;
      po.size = pool_share(i);
      po.connect_timeout = cfg.database.connect_timeout;
      po.statement_timeout = cfg.database.statement_timeout;
      po.acquire_timeout = cfg.database.statement_timeout;
      po.statements = store::pg_store_statements();
      w->pool = pg::Pool::create(w->ioc.get_executor(), std::move(po));
      w->store = std::make_unique<store::PgStore>(w->pool);

      upstream::PoolOptions uo;
      uo.host = cfg.upstream.host;
      uo.port = cfg.upstream.port;
      uo.connect_timeout = cfg.upstream.connect_timeout;
      uo.response_timeout = cfg.upstream.response_timeout;
      uo.max_response_body = cfg.upstream.max_response_body;
      w->upstream = std::make_unique<upstream::Pool>(w->ioc.get_executor(), std::move(uo));

      gateway::Dependencies deps;
      deps.executor = w->ioc.get_executor();
      deps.runtime = holder;
      deps.store = w->store.get();
      deps.upstream = w->upstream.get();
      deps.waiters = waiters.get();
      deps.metrics = metrics.get();
      w->gateway = std::make_unique<gateway::Gateway>(std::move(deps));

      auto* gw = w->gateway.get();
      server::Handler handler = [gw](server::Request& req, const server::RequestContext& ctx) {
        return gw->handle(req, ctx);
      };
      server::LimitsSource limits = [holder] { return holder->load()->settings().limits; };
      auto on_reject = [metrics](const server::RequestContext&, int status, std::string_view code) {
        metrics->request("unmatched", obs::Outcome::rejected, 0);
        obs::AccessRecord rec;
        rec.outcome = obs::to_string(obs::Outcome::rejected);
        rec.status = status;
        rec.code = code;
        obs::log_access(rec);
      };
      server::ListenerOptions lo;
      lo.endpoint = cfg.listen;
      w->server = std::make_unique<server::Server>(w->ioc, lo, limits, handler, gauge, on_reject);
      w->server->start();
      pool_of_workers.push_back(std::move(w));
    }
  } catch (const std::exception& e) {
    spdlog::critical("cannot start: {}", e.what());
    return kExitFailure;
  }

  asio::co_spawn(pool_of_workers.front()->ioc,
                 housekeeping(*pool_of_workers.front()->store, *metrics, holder, stopping),
                 asio::detached);

  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;
  for (auto& w : pool_of_workers) {
    guards.emplace_back(w->ioc.get_executor());
    w->thread = std::thread([&ioc = w->ioc] {
      for (;;) {
        try {
          ioc.run();
          return;
        } catch (const std::exception& e) {
          // A handler escaped its own error handling: log and keep the loop alive rather
          // than take every in-flight request down with it.
          spdlog::error("event loop error: {}", e.what());
        }
      }
    });
  }
  spdlog::info("idemproxy {} listening on {}:{} ({} workers, upstream {}:{})", IDEMPROXY_VERSION,
               cfg.listen.host, pool_of_workers.front()->server->port(), workers,
               cfg.upstream.host, cfg.upstream.port);

  std::function<void(const error_code&, int)> on_signal;
  on_signal = [&](const error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP) {
      try {
        auto next = reload_runtime(path, holder->load()->settings());
        obs::setup_logging(next->settings().log);
        holder->store(std::move(next));
        spdlog::info("configuration reloaded from {}", path);
      } catch (const settings::ConfigError& e) {
        spdlog::error("reload refused, keeping the running configuration: {}", e.full_message());
      } catch (const std::exception& e) {
        spdlog::error("reload refused, keeping the running configuration: {}", e.what());
      }
      signals.async_wait(on_signal);
      return;
    }
    spdlog::info("signal {}: draining", sig);
    stopping->store(true);
    for (auto& w : pool_of_workers) {
      asio::post(w->ioc, [srv = w->server.get()] {
        srv->stop_accepting();
        srv->close_idle();
      });
    }
  };
  signals.async_wait(on_signal);
  while (!stopping->load()) signals_ioc.run_one();

  // Let in-flight requests finish, bounded by the longest a request may legitimately take.
  const auto drain_limit = SteadyClock::now() + cfg.upstream.response_timeout + cfg.database.statement_timeout * 2;
  asio::steady_timer tick(signals_ioc);
  while (gauge->open.load() > 0 && SteadyClock::now() < drain_limit) {
    tick.expires_after(Millis{20});
    tick.wait();
  }
  if (gauge->open.load() > 0) {
    spdlog::warn("drain limit reached with {} connections open; their rows stay in progress and "
                 "a retry takes over after the lease", gauge->open.load());
  }
  for (auto& w : pool_of_workers) {
    asio::post(w->ioc, [w = w.get()] {
      w->upstream->shutdown();
      w->pool->close();
    });
  }
  guards.clear();
  for (auto& w : pool_of_workers) w->ioc.stop();
  for (auto& w : pool_of_workers) w->thread.join();
  spdlog::info("stopped");
  spdlog::shutdown();
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  int exit_code = kExitOk;
  const auto cmd = parse_args(argc, argv, exit_code);
  if (!cmd) return exit_code;
  try {
    if (cmd->name == "migrate") return run_migrate(cmd->config);
    if (cmd->name == "check-config") return run_check_config(cmd->config);
    return run_serve(cmd->config);
  } catch (const settings::ConfigError& e) {
    print_config_error(e);
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "idemproxy: " << e.what() << "\n";
    return kExitFailure;
  }
}
