#pragma once
// The outbox relay: moves committed events from demo_orders.outbox to the services that
// act on them, at least once.
//
//   claim    one statement: UPDATE ... WHERE event_id IN (SELECT ... FOR UPDATE SKIP LOCKED)
//            sets a lease (claimed_until) on a batch of due events. Concurrent relays skip
//            each other's rows, and no transaction stays open across HTTP calls: the
//            lease, not a row lock, keeps the claim while the event is delivered.
//   deliver  OrderCreated -> POST /charges      Idempotency-Key: <order_id>:charge
//                         -> POST /reservations Idempotency-Key: <order_id>:reserve
//            with X-Event-Id: <event_id> and X-Tenant-Id. The keys depend only on the
//            order, so every redelivery, by any relay, asks for the same effect.
//   mark     delivered_at once every delivery answered 2xx; otherwise available_at moves
//            forward with exponential backoff (5xx, timeouts, refused connections), or
//            dead_at is set for an answer that retrying cannot change (other 4xx).
//
// A relay that dies mid-delivery loses nothing: its lease lapses and the event is
// claimed again. That, and a "delivered" mark that cannot be written, is why delivery is
// at least once and the services deduplicate by key (and count deliveries by event id).
//
// It runs as its own process (`idem_order_backend relay`): it scales and fails apart from
// the API, and several may run at once.
#include <cstddef>
#include <memory>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "http_util.hpp"
#include "pg/pool.hpp"

namespace idem::demo {

struct RelayOptions {
  HttpUrl payments;
  HttpUrl inventory;
  std::size_t batch = 32;
  Millis poll_interval{200};   // when nothing is due
  Millis claim_lease{30'000};  // must exceed a batch's worth of request timeouts
  Millis request_timeout{5'000};
  Millis retry_backoff{1'000};  // first retry; doubles per attempt
  Millis max_backoff{60'000};
  // Fault injection (tests only): send every delivery this many times. 2 proves that the
  // services deduplicate: still exactly one charge and one reservation per order.
  int copies_per_delivery = 1;
};

class Relay {
 public:
  Relay(asio::any_io_executor executor, std::shared_ptr<pg::Pool> pool, RelayOptions options);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  static std::vector<pg::PreparedStatement> statements();

  // Starts the claim-deliver loop on the executor.
  void start();
  // Claims nothing more; the events already claimed are finished (each bounded by the
  // request timeout). Then stopped() turns true.
  void stop();
  bool stopped() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace idem::demo
