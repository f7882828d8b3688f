// Wiring only: parse the command line, load the configuration, build one worker per
// event-loop thread (each with its own store pool, upstream pool and listener on the
// shared port), and handle signals.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <functional>
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

#include "admin/admin.hpp"
#include "gateway/gateway.hpp"
#include "gateway/caching_store.hpp"
#include "gateway/replay_cache.hpp"
#include "gateway/router.hpp"
#include "gateway/waiters.hpp"
#include "idempotency/fingerprint.hpp"
#include "observability/logging.hpp"
#include "observability/metrics.hpp"
#include "pg/listener.hpp"
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
                                                       const settings::Settings& running,
                                                       bool change_listener_running) {
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
  // The admin listener is bound once too; its token, read per request, does reload.
  const auto same_endpoint = [](const auto& a, const auto& b) {
    return a.has_value() == b.has_value() && (!a || (a->host == b->host && a->port == b->port));
  };
  keep("admin.listen", next->admin.listen, running.admin.listen,
       !same_endpoint(next->admin.listen, running.admin.listen));
  // The cache can only serve with the change listener, which starts with the process.
  if (!change_listener_running) {
    keep("replay_cache.enabled", next->replay_cache.enabled, running.replay_cache.enabled,
         next->replay_cache.enabled != running.replay_cache.enabled);
  }
  return gateway::Runtime::build(std::move(next));
}

// Bound on each store call the admin listener makes (readiness, record lookups, the
// scrape-time gauge sample). Probes must answer within their own short timeouts (1s by
// default in Kubernetes), whatever the database does.
constexpr Millis kAdminStoreDeadline{1000};

// The admin listener's own limits: its requests are small and its clients few.
settings::Limits admin_limits() {
  settings::Limits l;
  l.max_header_bytes = 16u << 10;
  l.max_request_body = 4u << 10;  // no admin call has a body
  l.header_timeout = Millis{5000};
  l.body_timeout = Millis{5000};
  l.max_connections = 64;
  return l;
}

// An event loop whose pending handlers can be destroyed on demand. At exit, requests the
// drain cut off are coroutines suspended inside the loop, and their frames reference the
// gateway, store and admin handler; ~io_context would destroy them only after those are
// gone. destroy_pending() runs the same shutdown (execution_context::shutdown) while
// everything still exists; the later destructor finds nothing left to do.
class WorkerContext : public asio::io_context {
 public:
  using asio::io_context::io_context;
  void destroy_pending() { shutdown(); }
};

gateway::ReplayCacheOptions replay_cache_options(const settings::ReplayCacheSettings& s) {
  return gateway::ReplayCacheOptions{s.enabled, s.max_bytes, s.ttl};
}

// Every change to a completed record is announced on this channel (migration 0002).
constexpr std::string_view kRecordChannel = "idemproxy_records";

struct Worker {
  WorkerContext ioc{1};
  std::shared_ptr<pg::Pool> pool;
  std::unique_ptr<store::PgStore> store;
  std::unique_ptr<gateway::CachingStore> cached;  // the replay cache in front of `store`
  std::unique_ptr<upstream::Pool> upstream;
  std::unique_ptr<gateway::Gateway> gateway;
  std::unique_ptr<server::Server> server;
  std::thread thread;
};

// Retention: every replica runs this; SKIP LOCKED in the store keeps them from fighting
// over the same rows. Bounded per tick (kMaxBatchesPerTick batches) so a backlog never
// monopolises a pooled connection or the database: it is worked off over several ticks.
// A failed batch ends the tick and is counted; the next tick simply tries again.
constexpr int kMaxBatchesPerTick = 10;

asio::awaitable<void> housekeeping(store::Store& store, obs::Metrics& metrics,
                                   std::shared_ptr<gateway::RuntimeHolder> runtime,
                                   std::shared_ptr<std::atomic<bool>> stopping) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (!stopping->load()) {
    // Re-read every tick, so a reload changes interval and batch from the next one.
    const auto cfg = runtime->load()->settings().cleanup;
    timer.expires_after(cfg.interval);
    error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (stopping->load()) break;

    std::size_t total = 0;
    int batches = 0;
    bool backlog = true;  // until a short batch shows nothing more is due
    while (batches < kMaxBatchesPerTick) {
      const auto t0 = SteadyClock::now();
      auto deleted = co_await store.delete_expired(cfg.batch);
      metrics.store_duration(obs::StoreOp::cleanup,
                             std::chrono::duration<double>(SteadyClock::now() - t0).count());
      if (!deleted) {
        metrics.store_error(obs::store_error_kind(deleted.error()));
        spdlog::warn("cleanup: deleting expired records failed ({}); retrying next round",
                     deleted.error().message());
        backlog = false;  // unknown; the failure is what to report
        break;
      }
      ++batches;
      total += *deleted;
      metrics.expired_deleted(*deleted);
      if (*deleted < cfg.batch) {
        backlog = false;
        break;
      }
    }
    if (total > 0) {
      spdlog::info("cleanup: deleted {} expired records in {} batches of at most {}", total,
                   batches, cfg.batch);
    }
    if (backlog) {
      spdlog::warn("cleanup: a backlog of expired records remains after {} batches; raise "
                   "cleanup.batch or lower cleanup.interval if this persists",
                   kMaxBatchesPerTick);
    }

    auto oldest = co_await store.oldest_in_progress_age();
    if (oldest) {
      metrics.set_in_progress_oldest(
          *oldest ? std::chrono::duration<double>(**oldest).count() : 0.0);
    } else {
      metrics.store_error(obs::store_error_kind(oldest.error()));
    }
  }
}

void log_task_end(std::string_view what, std::exception_ptr e) noexcept {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    spdlog::error("{} stopped by an exception: {}", what, ex.what());
  } catch (...) {
    spdlog::error("{} stopped by an unknown exception", what);
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
  auto replay_cache = std::make_shared<gateway::ReplayCache>(metrics.get());
  replay_cache->configure(replay_cache_options(cfg.replay_cache));

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
      w->cached = std::make_unique<gateway::CachingStore>(*w->store, *replay_cache);

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
      deps.store = w->cached.get();
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
      pool_of_workers.push_back(std::move(w));
    }
  } catch (const std::exception& e) {
    spdlog::critical("cannot start: {}", e.what());
    return kExitFailure;
  }
  Worker& first = *pool_of_workers.front();

  // The admin listener: one acceptor on worker 0's loop, using that worker's store (no
  // connection beyond pool_size). Declared after the workers so it is destroyed first.
  std::unique_ptr<admin::Handler> admin_handler;
  std::unique_ptr<server::Server> admin_server;
  std::string admin_address = "off";
  try {
    if (cfg.admin.listen) {
      admin::Dependencies ad;
      ad.store = first.cached.get();
      ad.metrics = metrics.get();
      ad.readiness = admin::pg_readiness(first.pool, kAdminStoreDeadline);
      ad.token = [holder] { return holder->load()->settings().admin.token; };
      ad.store_deadline = kAdminStoreDeadline;
      admin_handler = std::make_unique<admin::Handler>(std::move(ad));
      auto* ah = admin_handler.get();
      server::Handler handler = [ah](server::Request& req, const server::RequestContext& ctx) {
        return ah->handle(req, ctx);
      };
      server::ListenerOptions lo;
      lo.endpoint = *cfg.admin.listen;
      // A second process on the same admin port must fail to start, not silently share
      // the probes and scrapes with this one.
      lo.reuse_port = false;
      lo.backlog = 64;
      // Own gauge: a scraper's keep-alive connection must not hold up the drain.
      admin_server = std::make_unique<server::Server>(
          first.ioc, lo, [] { return admin_limits(); }, handler,
          std::make_shared<server::ConnectionGauge>());
      // Bound before the request listeners, so a client that finds the main port open
      // finds the admin port open too.
      admin_server->start();
      admin_address = cfg.admin.listen->host + ":" + std::to_string(admin_server->port());
    }
    for (auto& w : pool_of_workers) w->server->start();
  } catch (const std::exception& e) {
    spdlog::critical("cannot start: {}", e.what());
    return kExitFailure;
  }

  asio::co_spawn(first.ioc, housekeeping(*first.store, *metrics, holder, stopping),
                 [](std::exception_ptr e) { log_task_end("retention cleanup", e); });

  // The replay cache serves only while this session listens for record changes: one
  // connection beyond pool_size, on worker 0's loop.
  std::shared_ptr<pg::Listener> change_listener;
  if (cfg.replay_cache.enabled) {
    pg::ListenerOptions lo;
    lo.conninfo = cfg.database.url;
    lo.channel = std::string(kRecordChannel);
    lo.connect_timeout = cfg.database.connect_timeout;
    lo.statement_timeout = cfg.database.statement_timeout;
    // Without the trigger (a schema behind, or the trigger disabled) deletions would go
    // unannounced: the cache then stays off.
    lo.ready_check_sql =
        "SELECT to_regclass('idempotency_requests') IS NOT NULL AND EXISTS ("
        "SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('idempotency_requests') "
        "AND tgname = 'idempotency_requests_announce_change' AND tgenabled <> 'D')";
    lo.ready_check_failure =
        "the table idempotency_requests has no enabled change trigger (migration 0002); run "
        "`idemproxy migrate` — until then every replay reads PostgreSQL";
    change_listener = pg::Listener::start(
        first.ioc.get_executor(), std::move(lo),
        [cache = replay_cache.get(), m = metrics.get()](std::string_view op_id) {
          m->replay_cache_notification();
          cache->evict(op_id);
        },
        [cache = replay_cache.get()](bool listening) {
          cache->set_listening(listening);
          if (listening) {
            spdlog::info("replay cache: listening for record changes; serving replays from memory");
          } else {
            spdlog::warn("replay cache: not listening for record changes; every replay reads "
                         "the database until the listener reconnects");
          }
        });
  }

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
  // The database only ever appears masked: the URL may carry a password.
  spdlog::info("idemproxy {} listening on {}:{} ({} workers, upstream {}:{}, database {}, "
               "admin {})",
               IDEMPROXY_VERSION, cfg.listen.host, first.server->port(), workers,
               cfg.upstream.host, cfg.upstream.port,
               settings::mask_database_url(cfg.database.url), admin_address);

  // SIGHUP reloads at any time. The first SIGTERM/SIGINT starts the drain; another one
  // during the drain cuts it short (an operator who asks twice means it).
  bool cut_short = false;
  std::function<void(const error_code&, int)> on_signal;
  on_signal = [&](const error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP) {
      try {
        auto next = reload_runtime(path, holder->load()->settings(), change_listener != nullptr);
        obs::setup_logging(next->settings().log);
        // Routes may have changed what a record answers (replay headers, scopes): start
        // the cache afresh with the new options.
        replay_cache->configure(replay_cache_options(next->settings().replay_cache));
        holder->store(std::move(next));
        spdlog::info("configuration reloaded from {}", path);
      } catch (const settings::ConfigError& e) {
        spdlog::error("reload refused, keeping the running configuration: {}", e.full_message());
      } catch (const std::exception& e) {
        spdlog::error("reload refused, keeping the running configuration: {}", e.what());
      }
    } else if (!stopping->load()) {
      spdlog::info("signal {}: draining (no new connections; in-flight requests may take up "
                   "to limits.drain_timeout)", sig);
      stopping->store(true);
      if (admin_handler) admin_handler->set_draining();
      for (auto& w : pool_of_workers) {
        asio::post(w->ioc, [srv = w->server.get()] {
          srv->stop_accepting();
          srv->close_idle();
        });
      }
    } else {
      spdlog::warn("signal {} during the drain: stopping now", sig);
      cut_short = true;
    }
    signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);
  while (!stopping->load()) signals_ioc.run_one();

  // Let in-flight requests finish, up to limits.drain_timeout as configured when the signal
  // came. A request cut off here leaves its row in progress with a lease nobody renews: a
  // retry takes over once the lease lapses (at most `lease` later), with a higher attempt
  // and the same operation id, exactly as after a crash.
  const auto drain_deadline = SteadyClock::now() + holder->load()->settings().limits.drain_timeout;
  while (gauge->open.load() > 0 && !cut_short && SteadyClock::now() < drain_deadline) {
    const auto left = std::chrono::duration_cast<Millis>(drain_deadline - SteadyClock::now());
    signals_ioc.run_for(std::clamp(left, Millis{1}, Millis{20}));
  }
  if (const auto open = gauge->open.load(); open > 0) {
    spdlog::warn("drain ended with {} connections still open; their records stay in progress "
                 "and a retry takes over once the lease lapses", open);
  } else {
    spdlog::info("drained: every in-flight request has been answered");
  }
  if (admin_server) {
    admin_server->stop_accepting();
    admin_server->close_idle();
  }
  if (change_listener) asio::post(first.ioc, [l = change_listener] { l->stop(); });
  for (auto& w : pool_of_workers) {
    asio::post(w->ioc, [w = w.get()] {
      w->upstream->shutdown();
      w->pool->close();
    });
  }
  guards.clear();
  for (auto& w : pool_of_workers) w->ioc.stop();
  for (auto& w : pool_of_workers) w->thread.join();
  for (auto& w : pool_of_workers) w->ioc.destroy_pending();
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
