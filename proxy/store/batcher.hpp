#pragma once
// Natural batching of concurrent store calls on one event loop (internal to store/).
//
// A call is queued; if its lane has room (fewer than `max_in_flight` batches running), a
// batch starts at once with everything queued (up to `max_size`), so at low load a lone
// call goes out alone after one pass of the event loop, with no timer. While a batch is in flight the
// calls that arrive meanwhile queue up and leave together as the next batch, the moment
// the running one is done: the busier the store, the larger the batches, and never a
// wait for a batch to fill.
//
// The runner decides each slot: it sets `out` (the call's answer) or `alone` (the batch
// could not decide this call: the caller runs it on its own, e.g. after the batch's
// statement failed). A slot it leaves undecided, or every slot of a runner that threw,
// gets `failure`. A caller is woken as soon as its slot is decided.
//
// A lane is the right to run batches, shared by the batchers whose batches must not
// overlap: the claims and the completions of one store share one lane, so that one write
// cycle carries both and the next waits for it; the busier the store, the larger each
// cycle (with a lane each, a claim cycle and a completion cycle ran at once, each about
// half as large: docs/performance.md, "One write lane"). A batcher whose lane is full
// waits in the lane and starts when a batch of any batcher on it ends. By default each
// batcher has a lane of its own.
//
// Lifetimes: the Batcher lives in a shared_ptr; a running batch holds it. A slot is
// shared by its caller and the batch, so neither outlives the other's writes. A caller
// whose coroutine ends while its slot is still queued (cancelled, or its io_context shut
// down) takes the slot out of the queue (on the home thread, for a remote caller: until
// then the slot may still be taken into a batch). Items therefore own their data: a
// runner never reads a caller's memory.
//
// A Batcher has a home: the event loop its batches run on (with that loop's pool). Its
// queue and batches belong to the home thread, like the pool: no locks. Calls may come
// from other event loops too (one batcher per process, so that the calls of every worker
// share a batch: larger batches, fewer statements and commits): a `remote` call's slot is
// queued by a handler posted to the home loop, and its caller is woken by a handler posted
// back to the caller's own loop. Only the slot crosses threads; `decided` (written last by
// the home thread, with release order) tells the caller that `out` and `alone` are final.
// Items must then own what they carry: a remote caller may be gone while its slot runs.
// Crossings are coalesced: remote calls land in an inbox (a mutex, held for a push or a
// swap) that one posted handler drains, and the callers of one loop that a batch decides
// are woken by one handler posted to that loop. A post to a sleeping loop costs it a
// wake-up (an epoll_ctl on its interrupter and a context switch): with two workers,
// coalescing took context switches per new key from 1.84 to 1.66 (docs/performance.md,
// "The sidecar's CPU per new key").
#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/types.hpp"

namespace idem::store::detail {

// The batches that may run at once, for the batchers that share it. Home thread only.
class BatchLane {
 public:
  explicit BatchLane(std::size_t max_in_flight = 1)
      : max_(max_in_flight < 1 ? 1 : max_in_flight) {}

  bool try_enter() {
    if (in_flight_ >= max_) return false;
    ++in_flight_;
    return true;
  }
  // A batcher that found the lane full: `start` runs when a batch ends.
  void wait(std::function<void()> start) { waiting_.push_back(std::move(start)); }
  // `hand_on`: start the waiting batchers (false when the leaving batch's event loop is
  // shutting down; they stay registered).
  void leave(bool hand_on = true) {
    --in_flight_;
    if (!hand_on) return;
    auto waiting = std::move(waiting_);
    waiting_.clear();
    for (auto& start : waiting) start();  // the first takes the room, the others wait again
  }

 private:
  std::size_t max_;
  std::size_t in_flight_ = 0;
  std::vector<std::function<void()>> waiting_;
};

template <class Item, class Out>
class Batcher : public std::enable_shared_from_this<Batcher<Item, Out>> {
 public:
  struct Slot {
    Slot(Batcher* b, asio::any_io_executor ex, Item i, bool remote_call)
        : owner(b), item(std::move(i)), remote(remote_call), wake(std::move(ex)) {}
    Batcher* const owner;  // alive while the slot is queued or in a batch (they hold it)
    Item item;
    std::optional<Out> out;
    bool alone = false;
    const bool remote;        // the caller is on another event loop than the batcher's home
    bool queued = false;      // home thread only
    bool abandoned = false;   // home thread only: the caller left before it was queued
    bool woken = false;       // home thread only
    std::atomic<bool> decided{false};
    asio::steady_timer wake;  // the caller's: cancelled (on the caller's loop) once decided
  };
  using SlotPtr = std::shared_ptr<Slot>;
  // One batch, in queue order. Must not throw past its first suspension in a way that
  // loses slots: undecided slots get `failure` anyway.
  using Runner = std::function<asio::awaitable<void>(std::vector<SlotPtr>&)>;

  struct Options {
    std::size_t max_size = 32;
    std::size_t max_in_flight = 1;
    // A remote call that finds the batcher idle (nothing queued, nothing in flight, and
    // its last batch a lone call: no load) is sent back to run alone on its own loop at
    // once: a lone call goes out alone anyway, and the round trip through the home loop
    // would only add two thread wake-ups to it. Under load, the moment between two
    // batches when nothing is pending is no reason to go alone.
    bool remote_alone_when_idle = true;
  };

  // `lane`: shared with other batchers of the same home loop, or null for a lane of its
  // own of `options.max_in_flight` batches.
  Batcher(asio::any_io_executor home, Options options, Runner runner, Out failure,
          std::shared_ptr<BatchLane> lane = nullptr)
      : home_(std::move(home)),
        options_(options),
        runner_(std::move(runner)),
        failure_(std::move(failure)),
        lane_(lane ? std::move(lane) : std::make_shared<BatchLane>(options.max_in_flight)) {}

  // The call's answer, or nullopt: run it alone. `cancelled` is what a caller whose wait
  // was cancelled gets (its call may still run, as a call cancelled in flight may).
  // `remote`: the caller runs on another event loop than home.
  asio::awaitable<std::optional<Out>> submit(Item item, Out cancelled, bool remote = false) {
    // Read on any thread: a hint (two remote calls may both see 0 and go alone, which
    // only costs them the batch), never a decision about a call's answer.
    if (remote && options_.remote_alone_when_idle && pending_.load(std::memory_order_relaxed) == 0 &&
        last_size_.load(std::memory_order_relaxed) <= 1) {
      co_return std::nullopt;
    }
    pending_.fetch_add(1, std::memory_order_relaxed);
    auto ex = co_await asio::this_coro::executor;
    auto slot = std::make_shared<Slot>(this, ex, std::move(item), remote);
    slot->wake.expires_at(asio::steady_timer::time_point::max());
    QueueGuard guard{this->shared_from_this(), slot};
    if (remote) {
      post_to_inbox(slot);
    } else {
      enqueue(slot);
    }
    error_code ec;
    co_await slot->wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (!slot->decided.load(std::memory_order_acquire)) {
      co_return std::optional<Out>(std::move(cancelled));  // guard unqueues
    }
    if (slot->alone) co_return std::nullopt;
    co_return std::move(slot->out);
  }

  // Decides a slot early (the runner found it must run alone) and wakes its caller.
  // Home thread.
  static void run_alone(const SlotPtr& slot) {
    slot->alone = true;
    finish(slot);
  }

  std::size_t queued() const noexcept { return queue_.size(); }

  // Takes up to `max` queued calls out of the queue, for another batcher's batch to carry
  // (one write cycle: claims and completions in one transaction). Home thread. The taker
  // decides them and then calls settle().
  std::vector<SlotPtr> take(std::size_t max) {
    std::vector<SlotPtr> taken;
    while (!queue_.empty() && taken.size() < max) {
      taken.push_back(std::move(queue_.front()));
      queue_.pop_front();
      taken.back()->queued = false;
    }
    // These calls leave in another batcher's batch: that is this batcher's last batch too
    // (the load hint of remote_alone_when_idle).
    if (!taken.empty()) last_size_.store(taken.size(), std::memory_order_relaxed);
    return taken;
  }

  // Answers and wakes the callers of taken slots: an undecided one gets `failure`, as in
  // a batch of this batcher's own. Home thread.
  void settle(std::vector<SlotPtr>& taken) {
    RemoteWakes wakes;
    for (auto& s : taken) {
      if (!s->out && !s->alone) s->out = failure_;
      finish(s, &wakes);
    }
    wakes.post();
  }

 private:
  // On the caller's side: a call that ends undecided (its wait was cancelled, or its
  // loop shut down) takes its slot out of the queue, on the home thread for a remote one.
  struct QueueGuard {
    std::shared_ptr<Batcher> self;
    SlotPtr slot;
    ~QueueGuard() {
      if (slot->decided.load(std::memory_order_acquire)) return;
      if (slot->remote) {
        asio::post(self->home_, [self = self, slot = slot] { self->unqueue(slot); });
      } else {
        self->unqueue(slot);
      }
    }
  };

  // Remote side: the first call into an empty inbox posts the handler that drains it;
  // later ones ride along. A call withdrawn before the drain is marked abandoned by
  // unqueue() (posted after its push), and the drain drops it.
  void post_to_inbox(const SlotPtr& slot) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(inbox_mutex_);
      first = inbox_.empty();
      inbox_.push_back(slot);
    }
    if (first) asio::post(home_, [self = this->shared_from_this()] { self->drain_inbox(); });
  }

  void drain_inbox() {
    std::vector<SlotPtr> arrived;
    {
      std::lock_guard<std::mutex> lock(inbox_mutex_);
      arrived.swap(inbox_);
    }
    for (const auto& slot : arrived) enqueue(slot);
  }

  void enqueue(const SlotPtr& slot) {
    if (slot->abandoned) {
      pending_.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    slot->queued = true;
    queue_.push_back(slot);
    start();
  }

  void unqueue(const SlotPtr& slot) {
    if (!slot->queued) {
      slot->abandoned = true;  // if its enqueue is still on its way, it finds this
      return;
    }
    slot->queued = false;
    pending_.fetch_sub(1, std::memory_order_relaxed);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (*it == slot) {
        queue_.erase(it);
        break;
      }
    }
  }

  // The remote callers a batch decided, by their loop: one posted handler per loop wakes
  // them all (a handful of loops at most, so a vector).
  struct RemoteWakes {
    std::vector<std::pair<asio::any_io_executor, std::vector<SlotPtr>>> by_loop;
    void add(const SlotPtr& slot) {
      const auto& ex = slot->wake.get_executor();
      for (auto& [loop, slots] : by_loop) {
        if (loop == ex) {
          slots.push_back(slot);
          return;
        }
      }
      by_loop.emplace_back(ex, std::vector<SlotPtr>{slot});
    }
    void post() {
      for (auto& [loop, slots] : by_loop) {
        asio::post(loop, [woken = std::move(slots)] {
          for (const auto& s : woken) s->wake.cancel();
        });
      }
      by_loop.clear();
    }
  };

  // Publishes the decision and wakes the caller on its own loop: at once, or through
  // `wakes` (posted by the caller of finish) for a remote caller when given.
  static void finish(const SlotPtr& slot, RemoteWakes* wakes = nullptr) {
    if (slot->woken) return;
    slot->woken = true;
    slot->owner->pending_.fetch_sub(1, std::memory_order_relaxed);
    slot->decided.store(true, std::memory_order_release);
    if (!slot->remote) {
      slot->wake.cancel();
    } else if (wakes != nullptr) {
      wakes->add(slot);
    } else {
      asio::post(slot->wake.get_executor(), [slot] { slot->wake.cancel(); });
    }
  }

  void start() {
    if (waiting_for_lane_) return;  // started when the lane has room
    if (!lane_->try_enter()) {
      // Full: a running batch of this batcher takes the call when it loops, one of another
      // batcher on the lane leaves it queued, and then this batcher starts next.
      waiting_for_lane_ = true;
      lane_->wait([weak = this->weak_from_this()] {
        auto self = weak.lock();
        if (!self) return;
        self->waiting_for_lane_ = false;
        if (!self->queue_.empty()) self->start();
      });
      return;
    }
    asio::co_spawn(home_, drive(this->shared_from_this(), home_), [](std::exception_ptr) {});
  }

  // Runs batches while calls are queued; holds its room in the lane for the whole loop.
  static asio::awaitable<void> drive(std::shared_ptr<Batcher> self, asio::any_io_executor ex) {
    // Leaves the lane however the loop ends; only a loop that ran out of calls hands the
    // lane on. A frame destroyed while suspended (its event loop shut down) starts nothing:
    // there is no loop left to run it.
    struct InFlight {
      Batcher& b;
      bool done = false;
      ~InFlight() { b.lane_->leave(done); }
    } in_flight{*self};
    // One pass of the event loop first: calls that are ready to run in the same pass
    // (other requests' claims) join this batch instead of starting the next one.
    co_await asio::post(ex, asio::use_awaitable);
    for (;;) {
      std::vector<SlotPtr> batch = self->take(self->options_.max_size);
      if (batch.empty()) {
        in_flight.done = true;
        co_return;
      }
      try {
        co_await self->runner_(batch);
      } catch (...) {
        // Nothing may escape into the event loop; the slots fail below.
      }
      self->settle(batch);
    }
  }

  asio::any_io_executor home_;
  Options options_;
  Runner runner_;
  Out failure_;
  std::deque<SlotPtr> queue_;
  std::mutex inbox_mutex_;       // guards inbox_ only; taken by remote callers and home
  std::vector<SlotPtr> inbox_;   // remote calls not yet queued (post_to_inbox)
  std::shared_ptr<BatchLane> lane_;
  bool waiting_for_lane_ = false;  // home thread: waiting in lane_ for room
  // Slots submitted and not yet decided or withdrawn, from every loop (the idle hint).
  std::atomic<std::size_t> pending_{0};
  std::atomic<std::size_t> last_size_{0};  // calls in the last batch taken (the load hint)
};

}  // namespace idem::store::detail
