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
#include "idempotency/decision.hpp"
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
  // Who is reading the record: a request that lost the claim, or an owner whose write was
  // fenced (it may not become the owner again; it only answers from the record).
  enum class Role { duplicate, fenced_owner };
  // A row read ahead (with a lost claim, or by a fenced owner): nullopt = none read yet.
  using Prefetched = std::optional<std::optional<store::Record>>;
  struct Acquired {
    std::optional<store::Ownership> owner;  // set: this request owns the record now
    Prefetched row;                         // a lost claim's row, read along with it
  };

  asio::awaitable<server::Response> protected_request(Exchange& x);
  std::optional<server::Response> admit(Exchange& x);
  std::optional<server::Response> answer_from_cache(Exchange& x);
  asio::awaitable<server::Response> settle(Exchange& x, Role role, Prefetched prefetched);
  asio::awaitable<result<Acquired>> acquire(Exchange& x, idempotency::Action action,
                                            const store::Record* row);
  asio::awaitable<server::Response> run_as_owner(Exchange& x, store::Ownership owner);
  asio::awaitable<server::Response> unknown_outcome(Exchange& x, upstream::Failure failure);
  asio::awaitable<server::Response> release_answer(Exchange& x, upstream::Response&& up);
  asio::awaitable<server::Response> record_answer(Exchange& x, upstream::Response&& up);
  asio::awaitable<server::Response> answer_fenced(Exchange& x, std::string_view what,
                                                  Prefetched row);
  void log_fenced(const Exchange& x, std::string_view what, std::string_view answer) const;
  asio::awaitable<server::Response> pass_through(Exchange& x);
  // owner == nullptr: an unprotected request (no operation id, attempt or fencing token).
  asio::awaitable<upstream::Outcome> forward(Exchange& x, const store::Ownership* owner);

  Dependencies deps_;
  std::size_t owners_in_flight_ = 0;
};

}  // namespace idem::gateway
