#pragma once
// The reference order API behind the sidecar (every operation: OrderApi::operations(),
// described for clients in openapi.yaml beside this file):
//
//   POST /orders        create an order and its OrderCreated outbox event, atomically
//                       (also POST /v1/orders and POST /v2/orders, the same create)
//   GET  /orders/{id}   read an order; only the tenant that owns it may see it
//   GET  /orders/by-operation/{operation_id}   the reconciliation lookup
//   GET  /healthz       liveness
//   GET|PUT /_faults    runtime fault switches (only with --enable-fault-injection)
//
// What makes it safe to re-execute (docs/demo.md has the full story):
//   * the forwarded X-Idempotency-Operation-Id is unique per tenant in `orders`, so an
//     attempt that reaches the API again (after a sidecar crash and takeover, or after an
//     answer that got lost) finds the order it created and returns it, byte for byte;
//   * an arrival under an operation id whose order was made from another request (the
//     sidecar released the key after a 5xx and the key came back with other parameters)
//     is refused with 422 operation_id_reused: one operation id, one order request;
//   * the attempt (X-Idempotency-Attempt) is stored with the order, and an arrival with a
//     lower one changes nothing;
//   * checkout_id is unique per tenant forever: a second order for one checkout is refused
//     with 409 checkout_already_ordered naming the existing order, whatever the key;
//   * the order, its outbox event and both uniqueness checks are one INSERT statement, so
//     they commit together or not at all; payments and inventory happen after commit,
//     through the outbox (relay.hpp);
//   * on routes with completion: backend (X-Idempotency-Record), the same statement also
//     completes the sidecar's idempotency record with the answer (idemproxy_complete), so
//     the three commit together, and an attempt a newer one superseded is refused by the
//     database (503 operation_superseded, nothing written);
//   * operation ids are told apart by generation with the record's lifetime the sidecar
//     forwards (X-Idempotency-Record-Created/-Expires; --operation-retention only for
//     callers without them);
//   * malformed requests answer with X-Idempotency-Directive: release, business
//     rejections with record (docs/backend.md).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "http_util.hpp"
#include "pg/pool.hpp"

namespace idem::demo {

struct OrderRequest;  // order_request.hpp

struct OrderApiOptions {
  // How long an operation id keeps meaning "this operation": from the order's creation,
  // extended by every later attempt. Set it to the sidecar route's `retention`: after
  // that the sidecar treats the same key (and so the same operation id) as a new
  // operation, and so must the API.
  Millis operation_retention{24LL * 3600 * 1000};
  // Honour X-Fault request headers and /_faults (tests only; see order_api.cpp).
  bool fault_injection = false;
  // Record every arrival from the sidecar in demo_orders.arrivals (tests only: the
  // fault-injection run checks that no two claims of a key shared a fencing token).
  bool record_arrivals = false;
  // Upper bound of X-Demo-Delay-Ms, the demo's "slow backend" switch.
  Millis max_demo_delay{30'000};
  // How long an order with an item whose SKU starts with "SLOW-" takes before it is
  // written: the reference backend's long operation (the sidecar's `async` routes).
  Millis slow_order_time{3000};
};

// One operation the API serves: a method and a path template whose "{name}" segment
// stands for any one non-empty segment.
struct ApiOperation {
  std::string_view method;
  std::string_view path;
  bool fault_injection_only = false;  // served only with --enable-fault-injection
};

// Exit status of the process when a test asks it to crash after commit.
inline constexpr int kCrashExitCode = 99;

class OrderApi {
 public:
  OrderApi(std::shared_ptr<pg::Pool> pool, OrderApiOptions options);

  // Prepared on every pooled connection (pg::PoolOptions::statements).
  static std::vector<pg::PreparedStatement> statements();

  // Every operation handle() serves, the table it dispatches by: what openapi.yaml must
  // document (integration/suites/e2e_openapi_test.cpp holds the two to each other).
  static std::span<const ApiOperation> operations();

  // The HTTP handler (http_server.hpp). Never throws for expected conditions.
  asio::awaitable<Response> handle(Request& req);

  struct Arrival;  // what the request's headers say; defined in order_api.cpp
  struct OrderRow;

  // The runtime switches of PUT /_faults, for every POST /orders until changed: the
  // fault-injection run (scripts/chaos) turns them on and off while clients keep going.
  //   {"fail_next": N, "fail_every": K, "fail_mode": "before_commit" | "after_commit",
  //    "fail_status": 503, "delay_ms": M, "delay_mode": "before_commit" | "after_commit"}
  // fail_next fails the next N requests, fail_every every K-th one (0: off).
  // "before_commit" answers fail_status without writing anything; "after_commit" does the
  // work (creates or finds the order, committed) and then answers fail_status instead of
  // 201, the answer that a real service loses when it fails after its commit. delay_ms
  // holds every request before its work or before its answer.
  struct Faults {
    int fail_next = 0;
    int fail_every = 0;
    bool fail_after_commit = false;
    unsigned fail_status = 503;
    Millis delay{0};
    bool delay_after_commit = false;
  };

 private:
  asio::awaitable<Response> dispatch(Request& req, std::size_t operation, std::string_view parameter);
  asio::awaitable<Response> create(Request& req);
  asio::awaitable<Response> create_or_find(Request& req, const Arrival& a,
                                           const OrderRequest& order);
  asio::awaitable<Response> get(Request& req, std::string_view id);
  asio::awaitable<Response> by_operation(Request& req, std::string_view operation_id);
  Response faults(Request& req);

  std::shared_ptr<pg::Pool> pool_;
  OrderApiOptions options_;
  Faults faults_;                  // one io_context thread: no lock needed
  std::uint64_t fail_counter_ = 0;  // POST /orders seen while fail_every is set
};

}  // namespace idem::demo
