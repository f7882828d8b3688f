#include "app/change_feed.hpp"

#include <spdlog/spdlog.h>

#include "store/pg_store.hpp"

namespace idem::app {

pg::ListenerOptions change_feed_options(const settings::DatabaseSettings& db) {
  pg::ListenerOptions lo;
  lo.conninfo = db.url;
  lo.channel = std::string(kRecordChannel);
  lo.application_name = store::replica_application_name("idemproxy-listener");
  lo.connect_timeout = db.connect_timeout;
  lo.statement_timeout = db.statement_timeout;
  lo.ready_check_sql =
      "SELECT to_regclass('idempotency_requests') IS NOT NULL AND EXISTS ("
      "SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('idempotency_requests') "
      "AND tgname = 'idempotency_requests_announce_change' AND tgenabled <> 'D')";
  lo.ready_check_failure =
      "the table idempotency_requests has no enabled change trigger (migration 0002); run "
      "`idemproxy migrate` — until then every replay reads PostgreSQL";
  return lo;
}

std::shared_ptr<pg::Listener> start_change_feed(asio::any_io_executor executor,
                                                const settings::DatabaseSettings& db,
                                                gateway::ReplayCache& cache,
                                                obs::Metrics& metrics) {
  return pg::Listener::start(
      std::move(executor), change_feed_options(db),
      [&cache, &metrics](std::string_view op_id) {
        metrics.replay_cache_notification();
        cache.evict(op_id);
      },
      [&cache](bool listening) {
        cache.set_listening(listening);
        if (listening) {
          spdlog::info("replay cache: listening for record changes; serving replays from memory");
        } else {
          spdlog::warn("replay cache: not listening for record changes; every replay reads "
                       "the database until the listener reconnects");
        }
      });
}

}  // namespace idem::app
