// The batcher's lane without a database (store/batcher.hpp): a batcher that finds the lane
// held by another batcher's batch waits, and starts the moment that batch ends.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "store/batcher.hpp"

namespace asio = boost::asio;
using idem::store::detail::BatchLane;

namespace {

using IntBatcher = idem::store::detail::Batcher<int, int>;

// Two batchers on one lane of one batch: `a`'s runner blocks on `gate` until the test
// opens it; `b`'s answers at once. Each counts its batches.
struct TwoOnOneLane {
  explicit TwoOnOneLane(asio::io_context& io) : gate(io) {
    gate.expires_at(asio::steady_timer::time_point::max());
    IntBatcher::Options options;
    options.remote_alone_when_idle = false;  // a remote call queues like a local one
    a = std::make_shared<IntBatcher>(
        io.get_executor(), options,
        [this](std::vector<IntBatcher::SlotPtr>& batch) -> asio::awaitable<void> {
          ++a_batches;
          boost::system::error_code ec;
          co_await gate.async_wait(asio::redirect_error(asio::use_awaitable, ec));
          for (auto& s : batch) s->out = s->item;
        },
        -1, lane);
    b = std::make_shared<IntBatcher>(
        io.get_executor(), options,
        [this](std::vector<IntBatcher::SlotPtr>& batch) -> asio::awaitable<void> {
          ++b_batches;
          for (auto& s : batch) s->out = s->item;
          co_return;
        },
        -1, lane);
  }
  std::shared_ptr<BatchLane> lane = std::make_shared<BatchLane>(1);
  asio::steady_timer gate;
  std::shared_ptr<IntBatcher> a, b;
  int a_batches = 0, b_batches = 0;
};

asio::awaitable<void> call(std::shared_ptr<IntBatcher> batcher, int item, std::optional<int>& out,
                           bool remote = false) {
  out = co_await batcher->submit(item, -2, remote);
}

// An io_context whose shutdown a test can trigger while its I/O objects still exist: as
// when a worker's loop ends, the coroutine frames suspended in it are destroyed.
struct EndingContext : asio::io_context {
  using asio::io_context::shutdown;
};

// Runs handlers until `done`. The bound only ends a run that would otherwise hang (a
// caller left waiting forever); in a passing run a handler is always ready.
template <class Pred>
void run_until(asio::io_context& io, Pred done) {
  while (!done() && io.run_one_for(std::chrono::seconds(5)) > 0) {
  }
}

}  // namespace

TEST_CASE("batch lane: a batcher that waits for the lane starts when the batch holding it ends") {
  asio::io_context io;
  TwoOnOneLane t(io);
  std::optional<int> a_out, b_out;
  asio::co_spawn(io, call(t.a, 1, a_out), asio::detached);
  run_until(io, [&] { return t.a_batches == 1; });
  asio::co_spawn(io, call(t.b, 2, b_out), asio::detached);
  io.poll();
  CHECK(t.b_batches == 0);  // the lane is held by a's batch
  CHECK_FALSE(b_out);
  t.gate.cancel();  // a's batch ends: b starts next
  run_until(io, [&] { return a_out && b_out; });
  CHECK(a_out == 1);
  CHECK(b_out == 2);
  CHECK(t.b_batches == 1);
}

TEST_CASE("batch lane: a batch whose event loop shuts down leaves the lane without starting the batcher waiting for it") {
  EndingContext io;
  TwoOnOneLane t(io);
  std::optional<int> a_out, b_out;
  asio::co_spawn(io, call(t.a, 1, a_out), asio::detached);
  run_until(io, [&] { return t.a_batches == 1; });
  // b's caller runs on another loop (as a second worker's request does), so that it
  // outlives the batchers' loop and its call stays queued in b.
  asio::io_context caller_loop;
  asio::co_spawn(caller_loop, call(t.b, 2, b_out, /*remote=*/true), asio::detached);
  caller_loop.poll();  // b's call is posted to b's inbox on the batchers' loop
  io.poll();           // and queued there: b waits in the lane that a's batch holds
  REQUIRE(t.b->queued() == 1);
  REQUIRE(t.b_batches == 0);
  // The batchers' loop ends with a's batch suspended: its frame is destroyed, and with it
  // its room in the lane. b must not be started on the loop that is going away (its batch
  // would never run, and would hold the lane for good): the room is free instead.
  io.shutdown();
  CHECK(t.b_batches == 0);
  CHECK_FALSE(a_out);
  CHECK_FALSE(b_out);
  CHECK(t.lane->try_enter());
  // Teardown: b's call is still queued, its slot holding a timer of caller_loop. Answer it
  // (as failed) and let its caller finish on its own loop, so that nothing of caller_loop
  // is left for the batchers' loop to destroy after caller_loop is gone.
  auto left = t.b->take(8);
  REQUIRE(left.size() == 1);
  t.b->settle(left);
  caller_loop.run();
  CHECK(b_out == -1);
}
