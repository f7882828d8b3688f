#pragma once
// Retention: the background task that deletes expired records and samples the oldest
// in-progress claim. Every replica runs it; SKIP LOCKED in the store keeps them from
// fighting over the same rows.
#include <atomic>
#include <cstddef>
#include <memory>

#include <boost/asio/awaitable.hpp>

#include "gateway/router.hpp"
#include "observability/metrics.hpp"
#include "settings/settings.hpp"
#include "store/store.hpp"

namespace idem::app {

// Bound on the batches of one round, so a backlog never monopolises a pooled connection or
// the database: it is worked off over several rounds.
constexpr int kMaxBatchesPerRound = 10;

struct RetentionRound {
  std::size_t deleted = 0;
  int batches = 0;       // batches that succeeded
  bool backlog = false;  // every batch was full: more is due than a round deletes
  bool failed = false;   // a batch failed; the next round simply tries again
};

// One round: batches of `cleanup.batch` until one comes back short (or kMaxBatchesPerRound),
// then the oldest in-progress age for idemproxy_in_progress_oldest_seconds. Counts and
// logs what it did.
asio::awaitable<RetentionRound> retention_round(store::Store& store, obs::Metrics& metrics,
                                                const settings::CleanupSettings& cleanup);

// Rounds every `cleanup.interval` (re-read each time, so a reload applies from the next
// one) until `stopping`.
asio::awaitable<void> run_retention(store::Store& store, obs::Metrics& metrics,
                                    std::shared_ptr<gateway::RuntimeHolder> runtime,
                                    std::shared_ptr<std::atomic<bool>> stopping);

}  // namespace idem::app
