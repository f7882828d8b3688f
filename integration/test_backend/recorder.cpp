#include "recorder.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/object.hpp>

namespace idem::test_backend {

namespace asio = boost::asio;
namespace json = boost::json;

Recorder::Recorder() : started_(std::chrono::steady_clock::now()) {}

std::int64_t Recorder::now_us() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               started_)
      .count();
}

std::shared_ptr<CallRecord> Recorder::record(std::string method, std::string target,
                                             HeaderList headers, std::string body) {
  auto call = std::make_shared<CallRecord>();
  call->seq = next_seq_++;
  call->method = std::move(method);
  call->target = std::move(target);
  call->headers = std::move(headers);
  call->body = std::move(body);
  call->arrived_us = now_us();
  calls_.push_back(call);
  return call;
}

void Recorder::mark_completed(CallRecord& call) const {
  call.completed = true;
  call.completed_us = now_us();
}

void Recorder::reset() { calls_.clear(); }

json::array Recorder::to_json() const {
  json::array out;
  out.reserve(calls_.size());
  for (const auto& call : calls_) {
    json::array headers;
    headers.reserve(call->headers.size());
    for (const auto& [name, value] : call->headers) {
      headers.push_back(json::array{json::string(name), json::string(value)});
    }
    json::object o;
    o["seq"] = call->seq;
    o["method"] = call->method;
    o["target"] = call->target;
    o["headers"] = std::move(headers);
    o["body"] = call->body;
    o["arrived_us"] = call->arrived_us;
    o["completed"] = call->completed;
    o["responded"] = call->responded;
    o["client_gone"] = call->client_gone;
    o["status"] = call->status;
    if (call->completed_us) {
      o["completed_us"] = *call->completed_us;
    } else {
      o["completed_us"] = nullptr;
    }
    out.push_back(std::move(o));
  }
  return out;
}

void Holds::wake(Waiter& w) {
  w.woken = true;
  w.timer.cancel();
}

asio::awaitable<void> Holds::wait(std::string name) {
  if (released_.contains(name)) {
    co_return;
  }
  auto waiter = std::make_shared<Waiter>(co_await asio::this_coro::executor);
  waiter->timer.expires_at(asio::steady_timer::time_point::max());
  waiting_.emplace(std::move(name), waiter);
  // The timer never fires on its own; release() or reset() cancels it. The flag guards
  // against a cancellation that was not ours (none exist today, but it costs nothing).
  while (!waiter->woken) {
    auto [ec] = co_await waiter->timer.async_wait(asio::as_tuple(asio::use_awaitable));
    (void)ec;
  }
}

std::size_t Holds::release(const std::string& name) {
  released_.insert(name);
  auto [first, last] = waiting_.equal_range(name);
  std::size_t woken = 0;
  for (auto it = first; it != last; ++it) {
    wake(*it->second);
    ++woken;
  }
  waiting_.erase(first, last);
  return woken;
}

void Holds::reset() {
  released_.clear();
  for (auto& [name, waiter] : waiting_) {
    wake(*waiter);
  }
  waiting_.clear();
}

}  // namespace idem::test_backend
