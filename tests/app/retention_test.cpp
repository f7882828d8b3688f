// The retention round against the in-memory store: batches, the backlog bound, failures,
// and what it counts. Time moves by the store's fake clock, never by sleeping.
#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <spdlog/spdlog.h>

#include "app/retention.hpp"
#include "store/memory_store.hpp"

using namespace idem;
using namespace std::chrono_literals;

namespace {

struct Fixture {
  Fixture() { spdlog::set_level(spdlog::level::off); }

  template <class T>
  T run(asio::awaitable<T> a) {
    auto f = asio::co_spawn(ioc, std::move(a), asio::use_future);
    ioc.restart();
    ioc.run();
    return f.get();
  }

  // n completed records with a 1 s retention, and one running claim with a long lease.
  void seed(int n) {
    for (int i = 0; i < n; ++i) {
      store::ClaimRequest req{{"t", "POST /orders", "k" + std::to_string(i)}, "fp", "", 1s, 1s};
      const auto won = run(store.claim(req)).value();
      REQUIRE(won.won);
      store::StoredResponse resp;
      resp.status = 201;
      REQUIRE(run(store.complete(req.id, won.owner.fence, resp, 1s)).value() ==
              store::Completion::recorded);
    }
    store::ClaimRequest running{{"t", "POST /orders", "running"}, "fp", "", 1h, 1h};
    REQUIRE(run(store.claim(running)).value().won);
  }

  std::chrono::system_clock::time_point now{std::chrono::seconds(2'000'000'000)};
  asio::io_context ioc;
  store::MemoryStore store{[this] { return now; }};
  obs::Metrics metrics;
};

}  // namespace

TEST_CASE("retention: deletes the expired records in batches and samples the oldest claim") {
  Fixture f;
  f.seed(25);
  f.now += 5s;
  settings::CleanupSettings cleanup;
  cleanup.batch = 10;
  const auto round = f.run(app::retention_round(f.store, f.metrics, cleanup));
  CHECK(round.deleted == 25);
  CHECK(round.batches == 3);  // 10, 10, 5: the short one ends the round
  CHECK_FALSE(round.backlog);
  CHECK_FALSE(round.failed);
  CHECK(f.store.size() == 1);  // the running claim stays
  const auto text = f.metrics.render_prometheus();
  CHECK(text.find("idemproxy_expired_deleted_total 25") != std::string::npos);
  CHECK(text.find("idemproxy_in_progress_oldest_seconds 5") != std::string::npos);
}

TEST_CASE("retention: a round stops after kMaxBatchesPerRound and reports the backlog") {
  Fixture f;
  f.seed(app::kMaxBatchesPerRound * 2 + 1);
  f.now += 5s;
  settings::CleanupSettings cleanup;
  cleanup.batch = 2;
  const auto first = f.run(app::retention_round(f.store, f.metrics, cleanup));
  CHECK(first.batches == app::kMaxBatchesPerRound);
  CHECK(first.deleted == app::kMaxBatchesPerRound * 2);
  CHECK(first.backlog);
  const auto second = f.run(app::retention_round(f.store, f.metrics, cleanup));
  CHECK(second.deleted == 1);
  CHECK_FALSE(second.backlog);
  CHECK(f.store.size() == 1);
}

TEST_CASE("retention: a failing store ends the round, counted, and the next one retries") {
  Fixture f;
  f.seed(3);
  f.now += 5s;
  f.store.set_unavailable(true);
  settings::CleanupSettings cleanup;
  const auto failed = f.run(app::retention_round(f.store, f.metrics, cleanup));
  CHECK(failed.failed);
  CHECK(failed.deleted == 0);
  CHECK_FALSE(failed.backlog);
  CHECK(f.metrics.render_prometheus().find("idemproxy_store_errors_total{kind=\"unavailable\"} 2") !=
        std::string::npos);  // the batch and the oldest-claim sample
  f.store.set_unavailable(false);
  CHECK(f.run(app::retention_round(f.store, f.metrics, cleanup)).deleted == 3);
}
