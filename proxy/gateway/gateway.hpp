#pragma once
// The request path: match route → validate tenant and key → fingerprint → claim →
// forward → record → respond. Every decision of the protocol comes from idempotency/
// (protocol.hpp, a state machine of events and actions); this driver performs its actions
// against the Store and the upstream Client, and is the only place where a request's
// idempotency actions turn into I/O.
#include <atomic>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "gateway/router.hpp"
#include "gateway/waiters.hpp"
#include "idempotency/fingerprint_memo.hpp"
#include "idempotency/protocol.hpp"
#include "observability/metrics.hpp"
#include "server/server.hpp"
#include "store/store.hpp"
#include "upstream/client.hpp"

namespace idem::obs {
class SpanExporter;  // observability/tracing.hpp
}

namespace idem::gateway {

struct Dependencies {
  asio::any_io_executor executor;          // the worker's event loop
  std::shared_ptr<RuntimeHolder> runtime;  // current configuration snapshot
  store::Store* store = nullptr;           // this worker's store (with the replay cache in
                                           // front of it: gateway/caching_store.hpp)
  upstream::Client* upstream = nullptr;    // this worker's upstream pool
  WaiterRegistry* waiters = nullptr;       // process-wide
  obs::Metrics* metrics = nullptr;         // process-wide
  obs::SpanExporter* tracer = nullptr;     // process-wide; null: spans are not exported
};

class Gateway {
 public:
  explicit Gateway(Dependencies deps);

  // The server's Handler. Never throws for expected conditions.
  asio::awaitable<server::Response> handle(server::Request& request,
                                           const server::RequestContext& context);

  // How many owner requests are between claim and their final store write, including
  // operations that answered 202 and go on without their client. Read by the drain from
  // another thread.
  std::size_t owners_in_flight() const noexcept {
    return owners_in_flight_.load(std::memory_order_relaxed);
  }

  struct Exchange;  // one request's state (gateway/exchange.hpp)
  struct AsyncJob;  // a request on an async route, detached from its client

 private:
  asio::awaitable<server::Response> protected_request(Exchange& x);
  // The tenant (and principal, when configured) alone: all a status request needs.
  std::optional<server::Response> admit_identity(Exchange& x);
  // The driver of idempotency::Protocol, and the steps it performs.
  asio::awaitable<server::Response> run_protocol(Exchange& x);
  asio::awaitable<idempotency::Event> claim(Exchange& x);
  asio::awaitable<idempotency::Event> read(Exchange& x);
  asio::awaitable<idempotency::Event> take_over(Exchange& x, std::int64_t seen_fence);
  asio::awaitable<idempotency::Event> replace(Exchange& x, std::int64_t seen_fence);
  asio::awaitable<idempotency::Event> forward_as_owner(Exchange& x, store::Ownership owner);
  bool storable(Exchange& x);
  idempotency::BackendRecord backend_record(Exchange& x);
  asio::awaitable<idempotency::Event> release(Exchange& x, std::int64_t fence);
  asio::awaitable<idempotency::Event> expire_lease(Exchange& x, std::int64_t fence);
  asio::awaitable<idempotency::Event> complete(Exchange& x, std::int64_t fence);
  asio::awaitable<idempotency::Event> note_payload(Exchange& x);
  // Long operations (gateway/long_operations.cpp).
  asio::awaitable<idempotency::Event> refetch(Exchange& x);
  asio::awaitable<idempotency::Event> reconcile(Exchange& x, store::Ownership owner);
  server::Response refetch_answer(Exchange& x, idempotency::Answer answer);
  // Routes with `async` (gateway/async_operations.cpp).
  asio::awaitable<server::Response> run_async(Exchange& x);
  asio::awaitable<server::Response> accepted(Exchange& x, std::int64_t attempt,
                                             std::int64_t expires_at_us);
  asio::awaitable<server::Response> operation_status(Exchange& x, const StatusMatch& m);
  void note_background(const Exchange& x);

  server::Response answer(Exchange& x, const idempotency::Action& a);
  void note_fenced(Exchange& x, const idempotency::Action& a);
  asio::awaitable<server::Response> pass_through(Exchange& x);
  // owner == nullptr: an unprotected request (no operation id, attempt or fencing token).
  asio::awaitable<upstream::Outcome> forward(Exchange& x, const store::Ownership* owner);

  idempotency::FingerprintMemo& fingerprint_memo(const std::shared_ptr<const Runtime>& runtime);

  Dependencies deps_;
  std::atomic<std::size_t> owners_in_flight_{0};
  // This event loop's fingerprints of recent requests, for the configuration it was
  // filled under (fingerprint_memo()).
  idempotency::FingerprintMemo memo_;
  std::shared_ptr<const Runtime> memo_runtime_;
};

}  // namespace idem::gateway
