#include "app/sidecar.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include "admin/admin.hpp"
#include "app/change_feed.hpp"
#include "app/config.hpp"
#include "app/retention.hpp"
#include "gateway/caching_store.hpp"
#include "gateway/gateway.hpp"
#include "gateway/replay_cache.hpp"
#include "gateway/waiters.hpp"
#include "observability/logging.hpp"
#include "observability/metrics.hpp"
#include "observability/tracing.hpp"
#include "gateway/encrypting_store.hpp"
#include "pg/pool.hpp"
#include "server/server.hpp"
#include "store/pg_store.hpp"
#include "upstream/client.hpp"

namespace idem::app {
namespace {

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

gateway::ReplayCacheOptions replay_cache_options(const settings::ReplayCacheSettings& s) {
  return gateway::ReplayCacheOptions{s.enabled, s.max_bytes, s.ttl};
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

struct Worker {
  WorkerContext ioc{1};
  std::shared_ptr<pg::Pool> pool;
  std::unique_ptr<store::PgStore> store;
  std::unique_ptr<gateway::EncryptingStore> encrypted;  // with `encryption` only
  std::unique_ptr<gateway::CachingStore> cached;  // the replay cache in front of `store`
  std::unique_ptr<upstream::Pool> upstream;
  std::unique_ptr<gateway::Gateway> gateway;
  std::unique_ptr<server::Server> server;
  std::thread thread;
};

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

// pool_size is the process's budget of PostgreSQL connections, split across workers, so
// the default worker count never exceeds it.
int worker_count(const settings::Settings& cfg) {
  if (cfg.workers > 0) return cfg.workers;
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1,
                    cfg.database.pool_size);
}

// Every outcome series of every configured route exists from the start, at 0.
void declare_routes(obs::Metrics& m, const settings::Settings& cfg) {
  std::vector<std::string> names;
  names.reserve(cfg.routes.size());
  for (const auto& r : cfg.routes) names.push_back(r.name);
  m.declare_routes(names);
}

}  // namespace

// The TLS contexts new connections take, swapped whole by a reload (lock-free reads, one
// per accepted client connection or new upstream connection).
struct TlsHolder {
  std::atomic<std::shared_ptr<server::TlsContext>> listener;
  std::atomic<std::shared_ptr<const upstream::ClientTls>> upstream;
  void store(TlsMaterial m) {
    listener.store(std::move(m.listener));
    upstream.store(std::move(m.upstream));
  }
};

struct Sidecar::Parts {
  // Shared by every worker.
  std::shared_ptr<gateway::RuntimeHolder> holder;
  std::shared_ptr<TlsHolder> tls = std::make_shared<TlsHolder>();
  std::shared_ptr<obs::Metrics> metrics = std::make_shared<obs::Metrics>();
  std::shared_ptr<gateway::WaiterRegistry> waiters = std::make_shared<gateway::WaiterRegistry>();
  std::shared_ptr<server::ConnectionGauge> gauge = std::make_shared<server::ConnectionGauge>();
  std::shared_ptr<std::atomic<bool>> stopping = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<gateway::ReplayCache> replay_cache;
  // Before the workers, so it outlives them: their requests hand it spans until the end.
  std::unique_ptr<obs::SpanExporter> tracer;
  // The encryption keys, swapped whole by a reload; null: answers are stored in clear
  // (whether there are keys at all is fixed at start, see plan_reload).
  std::shared_ptr<std::atomic<std::shared_ptr<const store::KeyRing>>> key_ring =
      std::make_shared<std::atomic<std::shared_ptr<const store::KeyRing>>>();

  std::vector<std::unique_ptr<Worker>> workers;
  // Declared after the workers so they are destroyed first.
  std::unique_ptr<admin::Handler> admin_handler;
  std::unique_ptr<server::Server> admin_server;
  std::string admin_address = "off";
  std::shared_ptr<pg::Listener> change_feed;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;

  std::unique_ptr<Worker> build_worker(int index, int count);
  void build_admin();
};

std::unique_ptr<Worker> Sidecar::Parts::build_worker(int index, int count) {
  const auto& cfg = holder->load()->settings();
  auto w = std::make_unique<Worker>();
  const int base = cfg.database.pool_size / count;
  const auto size =
      static_cast<std::size_t>(base + (index < cfg.database.pool_size % count ? 1 : 0));
  w->pool = pg::Pool::create(
      w->ioc.get_executor(),
      store::pg_store_pool_options(cfg.database.url, size, cfg.database.connect_timeout,
                                   cfg.database.statement_timeout));
  store::PgBatching batching;
  batching.enabled = cfg.database.batching;
  batching.max_size = static_cast<std::size_t>(cfg.database.batch_max);
  batching.on_batch = [m = metrics](std::string_view op, std::size_t calls) {
    m->store_batch(op, calls);
  };
  // One set of batchers per process, on worker 0's loop: every worker's concurrent calls
  // share a batch, so batches are as large as the process's concurrency allows (at 32
  // connections on two workers, twice the calls per statement and commit of one set per
  // worker; docs/performance.md).
  if (index == 0) {
    w->store = std::make_unique<store::PgStore>(w->pool, store::PgStore::ClaimRead::adaptive,
                                                batching);
  } else {
    w->store = std::make_unique<store::PgStore>(w->pool, store::PgStore::ClaimRead::adaptive,
                                                *workers.front()->store);
  }
  // Encryption sits between the replay cache and PostgreSQL: plaintext stays in memory.
  store::Store* durable = w->store.get();
  if (key_ring->load()) {
    w->encrypted = std::make_unique<gateway::EncryptingStore>(*w->store, [k = key_ring] { return k->load(); });
    durable = w->encrypted.get();
  }
  w->cached = std::make_unique<gateway::CachingStore>(*durable, *replay_cache);

  w->upstream = std::make_unique<upstream::Pool>(
      w->ioc.get_executor(), upstream_pool_options(cfg, [t = tls] { return t->upstream.load(); }));

  gateway::Dependencies deps;
  deps.executor = w->ioc.get_executor();
  deps.runtime = holder;
  deps.store = w->cached.get();
  deps.upstream = w->upstream.get();
  deps.waiters = waiters.get();
  deps.metrics = metrics.get();
  deps.tracer = tracer.get();
  w->gateway = std::make_unique<gateway::Gateway>(std::move(deps));

  auto* gw = w->gateway.get();
  server::Handler handler = [gw](server::Request& req, const server::RequestContext& ctx) {
    return gw->handle(req, ctx);
  };
  server::LimitsSource limits = [h = holder] { return h->load()->settings().limits; };
  // Requests the listener answers itself (400 framing, 408, 413, 431) in the metrics and
  // the access log, under route "unmatched".
  auto on_reject = [m = metrics](const server::RequestContext&, int status, std::string_view code) {
    m->request("unmatched", obs::Outcome::rejected, 0);
    obs::AccessRecord rec;
    rec.outcome = obs::to_string(obs::Outcome::rejected);
    rec.status = status;
    rec.code = code;
    obs::log_access(rec);
  };
  server::ListenerOptions lo;
  lo.endpoint = cfg.listen;
  if (cfg.tls) lo.tls = [t = tls] { return t->listener.load(); };
  w->server = std::make_unique<server::Server>(w->ioc, lo, limits, handler, gauge, on_reject);
  return w;
}

// One acceptor on worker 0's loop, using that worker's store (no connection beyond
// pool_size).
void Sidecar::Parts::build_admin() {
  const auto& cfg = holder->load()->settings();
  if (!cfg.admin.listen) return;
  Worker& first = *workers.front();
  admin::Dependencies ad;
  ad.store = first.cached.get();
  ad.metrics = metrics.get();
  ad.readiness = admin::pg_readiness(first.pool, kAdminStoreDeadline, metrics.get());
  ad.token = [h = holder] { return h->load()->settings().admin.token; };
  ad.store_deadline = kAdminStoreDeadline;
  admin_handler = std::make_unique<admin::Handler>(std::move(ad));
  auto* ah = admin_handler.get();
  server::Handler handler = [ah](server::Request& req, const server::RequestContext& ctx) {
    return ah->handle(req, ctx);
  };
  server::ListenerOptions lo;
  lo.endpoint = *cfg.admin.listen;
  // A second process on the same admin port must fail to start, not silently share the
  // probes and scrapes with this one.
  lo.reuse_port = false;
  lo.backlog = 64;
  // Record paths carry percent-encoded keys verbatim (a key may be ".."); nothing the
  // admin listener serves is forwarded, so its targets need no normalization.
  lo.normalize_target = false;
  // Own gauge: a scraper's keep-alive connection must not hold up the drain.
  admin_server = std::make_unique<server::Server>(first.ioc, lo, [] { return admin_limits(); },
                                                  handler,
                                                  std::make_shared<server::ConnectionGauge>());
}

Sidecar::Sidecar(std::shared_ptr<const gateway::Runtime> runtime, TlsMaterial tls)
    : parts_(std::make_unique<Parts>()) {
  auto& p = *parts_;
  const auto& cfg = runtime->settings();
  p.tls->store(std::move(tls));
  p.holder = std::make_shared<gateway::RuntimeHolder>(std::move(runtime));
  p.replay_cache = std::make_shared<gateway::ReplayCache>(p.metrics.get());
  p.replay_cache->configure(replay_cache_options(cfg.replay_cache));
  declare_routes(*p.metrics, cfg);
  p.key_ring->store(load_key_ring(cfg));
  if (!cfg.tracing.otlp_endpoint.empty()) {
    obs::ExporterOptions eo;
    eo.host = cfg.tracing.host;
    eo.port = cfg.tracing.port;
    eo.path = cfg.tracing.path;
    p.tracer = std::make_unique<obs::SpanExporter>(std::move(eo), p.metrics.get());
  }
  const int count = worker_count(cfg);
  for (int i = 0; i < count; ++i) p.workers.push_back(p.build_worker(i, count));
  p.build_admin();
}

Sidecar::~Sidecar() = default;

void Sidecar::start() {
  auto& p = *parts_;
  const auto& cfg = p.holder->load()->settings();
  Worker& first = *p.workers.front();
  if (p.admin_server) {
    p.admin_server->start();
    p.admin_address = cfg.admin.listen->host + ":" + std::to_string(p.admin_server->port());
  }
  for (auto& w : p.workers) w->server->start();

  asio::co_spawn(first.ioc, run_retention(*first.store, *p.metrics, p.holder, p.stopping),
                 [](std::exception_ptr e) { log_task_end("retention cleanup", e); });
  // The replay cache serves only while this session listens for record changes: one
  // connection beyond pool_size, on worker 0's loop.
  if (cfg.replay_cache.enabled) {
    p.change_feed = start_change_feed(first.ioc.get_executor(), cfg.database, *p.replay_cache,
                                      *p.metrics);
  }

  for (auto& w : p.workers) {
    p.guards.emplace_back(w->ioc.get_executor());
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
}

std::shared_ptr<const gateway::Runtime> Sidecar::runtime() const { return parts_->holder->load(); }

void Sidecar::apply(std::shared_ptr<const gateway::Runtime> next, TlsMaterial tls,
                    std::shared_ptr<const store::KeyRing> keys) {
  parts_->tls->store(std::move(tls));
  // New records are sealed with the new active key from now on; records of any key still
  // listed keep opening. A sidecar started without keys has no EncryptingStore to give
  // them to, and plan_reload never turns encryption on or off.
  if (parts_->key_ring->load() && keys) parts_->key_ring->store(std::move(keys));
  // Routes may have changed what a record answers (replay headers, scopes): start the
  // cache afresh with the new options.
  parts_->replay_cache->configure(replay_cache_options(next->settings().replay_cache));
  declare_routes(*parts_->metrics, next->settings());
  parts_->holder->store(std::move(next));
}

bool Sidecar::change_feed_running() const { return parts_->change_feed != nullptr; }

void Sidecar::begin_drain() {
  auto& p = *parts_;
  p.stopping->store(true);
  if (p.admin_handler) p.admin_handler->set_draining();
  for (auto& w : p.workers) {
    asio::post(w->ioc, [srv = w->server.get()] {
      srv->stop_accepting();
      srv->close_idle();
    });
  }
}

std::size_t Sidecar::open_connections() const { return parts_->gauge->open.load(); }

std::size_t Sidecar::owners_in_flight() const {
  std::size_t n = 0;
  for (const auto& w : parts_->workers) n += w->gateway->owners_in_flight();
  return n;
}

void Sidecar::stop() {
  auto& p = *parts_;
  p.stopping->store(true);
  if (p.admin_server) {
    p.admin_server->stop_accepting();
    p.admin_server->close_idle();
  }
  Worker& first = *p.workers.front();
  if (p.change_feed) asio::post(first.ioc, [l = p.change_feed] { l->stop(); });
  for (auto& w : p.workers) {
    asio::post(w->ioc, [w = w.get()] {
      w->upstream->shutdown();
      w->pool->close();
    });
  }
  p.guards.clear();
  for (auto& w : p.workers) w->ioc.stop();
  for (auto& w : p.workers) {
    if (w->thread.joinable()) w->thread.join();
  }
  for (auto& w : p.workers) w->ioc.destroy_pending();
}

std::string Sidecar::summary() const {
  const auto& p = *parts_;
  const auto& cfg = p.holder->load()->settings();
  // The database only ever appears masked: the URL may carry a password.
  const char* from = cfg.tenant.from == settings::TenantSource::jwt    ? "jwt"
                     : cfg.tenant.from == settings::TenantSource::mtls ? "mtls"
                                                                       : "header";
  const std::string listener_tls =
      !cfg.tls ? "" : cfg.tls->client_ca_file.empty() ? ", TLS" : ", TLS with client certificates";
  return "listening on " + cfg.listen.host + ":" + std::to_string(p.workers.front()->server->port()) +
         " (" + std::to_string(p.workers.size()) + " workers" + listener_tls + ", upstream " +
         (cfg.upstream.https ? "https://" : "http://") + cfg.upstream.host + ":" +
         std::to_string(cfg.upstream.port) + ", database " +
         settings::mask_database_url(cfg.database.url) + ", admin " + p.admin_address +
         ", tenant from " + from + ")";
}

}  // namespace idem::app
