#include "gateway/waiters.hpp"

#include <algorithm>

#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace idem::gateway {

Waiter::Waiter(WaiterRegistry& registry, std::string key, asio::any_io_executor executor)
    : registry_(registry),
      key_(std::move(key)),
      executor_(std::move(executor)),
      signal_(std::make_shared<Signal>(executor_)) {
  registry_.add(key_, executor_, signal_);
}

Waiter::~Waiter() { registry_.remove(key_, signal_.get()); }

asio::awaitable<bool> Waiter::wait_until(SteadyClock::time_point until) {
  if (!signal_->fired) {
    signal_->timer.expires_at(until);
    error_code ec;
    co_await signal_->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  const bool fired = signal_->fired;
  signal_->fired = false;
  co_return fired;
}

void WaiterRegistry::add(const std::string& key, const asio::any_io_executor& ex,
                         const std::shared_ptr<Waiter::Signal>& s) {
  std::lock_guard lock(mutex_);
  entries_[key].push_back(Entry{ex, s});
}

void WaiterRegistry::remove(const std::string& key, const Waiter::Signal* s) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  auto& list = it->second;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [s](const Entry& e) {
                              auto locked = e.signal.lock();
                              return !locked || locked.get() == s;
                            }),
             list.end());
  if (list.empty()) entries_.erase(it);
}

void WaiterRegistry::notify(const std::string& key) {
  std::vector<Entry> targets;
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    targets = it->second;
  }
  for (auto& entry : targets) {
    // The signal may die before the posted handler runs; the weak_ptr makes that harmless.
    asio::post(entry.executor, [weak = entry.signal] {
      if (auto s = weak.lock()) {
        s->fired = true;
        s->timer.cancel();
      }
    });
  }
}

std::size_t WaiterRegistry::waiting(const std::string& key) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.size();
}

}  // namespace idem::gateway
