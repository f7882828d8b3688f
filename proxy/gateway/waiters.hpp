#pragma once
// In-process wake-up for duplicates that wait on an owner running in this same process.
// Owners call notify() after they complete, release or give up a claim; waiters then
// re-read the row at once instead of at their next poll. Waiters whose owner is another
// replica never hear from this and rely on polling; a lost wake-up therefore only costs
// latency, never correctness (the row in PostgreSQL decides).
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/types.hpp"

namespace idem::gateway {

class WaiterRegistry;

// A waiter's wake-up signal: a timer on the waiter's own executor that notify() cancels
// by posting to that executor (timers are not thread-safe).
class Waiter {
 public:
  Waiter(WaiterRegistry& registry, std::string key, asio::any_io_executor executor);
  ~Waiter();
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  // Suspends until notified or until `until`, whichever is first. Returns true when
  // notified (a notification that came before this call counts, once).
  asio::awaitable<bool> wait_until(SteadyClock::time_point until);

 private:
  friend class WaiterRegistry;
  struct Signal {
    explicit Signal(asio::any_io_executor ex) : timer(ex) {}
    asio::steady_timer timer;
    bool fired = false;
  };
  WaiterRegistry& registry_;
  std::string key_;
  asio::any_io_executor executor_;
  std::shared_ptr<Signal> signal_;
};

class WaiterRegistry {
 public:
  void notify(const std::string& key);
  std::size_t waiting(const std::string& key) const;

 private:
  friend class Waiter;
  struct Entry {
    asio::any_io_executor executor;
    std::weak_ptr<Waiter::Signal> signal;
  };
  void add(const std::string& key, const asio::any_io_executor& ex,
           const std::shared_ptr<Waiter::Signal>& s);
  void remove(const std::string& key, const Waiter::Signal* s);

  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::vector<Entry>> entries_;
};

}  // namespace idem::gateway
