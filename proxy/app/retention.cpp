#include "app/retention.hpp"

#include <chrono>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

namespace idem::app {
namespace {

double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

}  // namespace

asio::awaitable<RetentionRound> retention_round(store::Store& store, obs::Metrics& metrics,
                                                const settings::CleanupSettings& cleanup) {
  RetentionRound round;
  round.backlog = true;  // until a short batch shows nothing more is due
  while (round.batches < kMaxBatchesPerRound) {
    const auto t0 = SteadyClock::now();
    auto deleted = co_await store.delete_expired(cleanup.batch);
    metrics.store_duration(obs::StoreOp::cleanup, seconds_since(t0));
    if (!deleted) {
      metrics.store_error(obs::store_error_kind(deleted.error()));
      spdlog::warn("cleanup: deleting expired records failed ({}); retrying next round",
                   deleted.error().message());
      round.failed = true;
      round.backlog = false;  // unknown; the failure is what to report
      break;
    }
    ++round.batches;
    round.deleted += *deleted;
    metrics.expired_deleted(*deleted);
    if (*deleted < cleanup.batch) {
      round.backlog = false;
      break;
    }
  }
  if (round.deleted > 0) {
    spdlog::info("cleanup: deleted {} expired records in {} batches of at most {}", round.deleted,
                 round.batches, cleanup.batch);
  }
  if (round.backlog) {
    spdlog::warn("cleanup: a backlog of expired records remains after {} batches; raise "
                 "cleanup.batch or lower cleanup.interval if this persists",
                 kMaxBatchesPerRound);
  }

  auto oldest = co_await store.oldest_in_progress_age();
  if (oldest) {
    metrics.set_in_progress_oldest(*oldest ? std::chrono::duration<double>(**oldest).count() : 0.0);
  } else {
    metrics.store_error(obs::store_error_kind(oldest.error()));
  }
  co_return round;
}

asio::awaitable<void> run_retention(store::Store& store, obs::Metrics& metrics,
                                    std::shared_ptr<gateway::RuntimeHolder> runtime,
                                    std::shared_ptr<std::atomic<bool>> stopping) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (!stopping->load()) {
    const auto cleanup = runtime->load()->settings().cleanup;
    timer.expires_after(cleanup.interval);
    error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (stopping->load()) break;
    co_await retention_round(store, metrics, cleanup);
  }
}

}  // namespace idem::app
