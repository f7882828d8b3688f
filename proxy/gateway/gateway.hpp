#pragma once
// The request path: match route → validate tenant and key → fingerprint → claim →
// forward → record → respond. The decisions come from idempotency/ (pure code); this
// adapter performs them against the Store and the upstream Client, and is the only
// place where a request's idempotency actions turn into I/O.
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "gateway/replay_cache.hpp"
#include "gateway/router.hpp"
#include "gateway/waiters.hpp"
#include "observability/metrics.hpp"
#include "server/server.hpp"
#include "store/store.hpp"
#include "upstream/client.hpp"

namespace idem::gateway {

struct Dependencies {
  asio::any_io_executor executor;          // the worker's event loop
  std::shared_ptr<RuntimeHolder> runtime;  // current configuration snapshot
  store::Store* store = nullptr;           // this worker's store
  upstream::Client* upstream = nullptr;    // this worker's upstream pool
  WaiterRegistry* waiters = nullptr;       // process-wide
  obs::Metrics* metrics = nullptr;         // process-wide
  ReplayCache* replay_cache = nullptr;     // process-wide; nullptr = no cache
};

class Gateway {
 public:
  explicit Gateway(Dependencies deps);

  // The server's Handler. Never throws for expected conditions.
  asio::awaitable<server::Response> handle(server::Request& request,
                                           const server::RequestContext& context);

  // How many owner requests are between claim and their final store write (drain waits
  // for these on shutdown).
  std::size_t owners_in_flight() const noexcept { return owners_in_flight_; }

  struct Exchange;  // one request's state; defined in gateway.cpp

 private:
  asio::awaitable<server::Response> protected_request(Exchange& x);
  asio::awaitable<server::Response> run_as_owner(Exchange& x, std::int64_t attempt);
  asio::awaitable<server::Response> pass_through(Exchange& x);
  asio::awaitable<upstream::Outcome> forward(Exchange& x, std::int64_t attempt);

  Dependencies deps_;
  std::size_t owners_in_flight_ = 0;
};

}  // namespace idem::gateway
