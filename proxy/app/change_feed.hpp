#pragma once
// The change feed: one LISTEN session per process that tells the replay cache about every
// change to a completed record (migration 0002's trigger), and switches the cache on only
// while it is known to be listening and the trigger exists.
#include <memory>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>

#include "gateway/replay_cache.hpp"
#include "observability/metrics.hpp"
#include "pg/listener.hpp"
#include "settings/settings.hpp"

namespace idem::app {

// Every change to a completed record is announced on this channel (migration 0002).
constexpr std::string_view kRecordChannel = "idemproxy_records";

// The listener's options: its session, and the ready check that keeps the cache off
// while deletions would go unannounced (a schema behind, or the trigger disabled).
pg::ListenerOptions change_feed_options(const settings::DatabaseSettings& db);

// Starts it on `executor`; notifications evict, the listening state switches the cache.
// Both outlive the listener.
std::shared_ptr<pg::Listener> start_change_feed(asio::any_io_executor executor,
                                                const settings::DatabaseSettings& db,
                                                gateway::ReplayCache& cache,
                                                obs::Metrics& metrics);

}  // namespace idem::app
