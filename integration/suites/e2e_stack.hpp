#pragma once
// The whole reference stack for end-to-end suites, as real processes on real PostgreSQL:
//
//   client ─▶ idemproxy ─▶ order API ─(outbox)─▶ relay ─▶ payments, inventory
//
// Each test builds its own OrderStack (a few hundred milliseconds) and uses fresh tenants,
// since the database is shared with every other suite: rows are always counted per tenant.
// The backend processes run with --enable-fault-injection, so tests can steer them with
// X-Fault headers and the services' /_faults endpoint (docs/demo.md lists them).
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "support/harness.hpp"

namespace idem::it::e2e {

// IDEM_ORDER_BACKEND_BIN, else the path the build compiled in.
std::string order_backend_binary();

// One `idem_order_backend <command>` process. Servers listen on 127.0.0.1 and report their
// port ("LISTENING <port>"); the relay reports "RELAY RUNNING".
class BackendProcess {
 public:
  BackendProcess(std::string command, std::vector<std::string> args);
  ~BackendProcess();
  BackendProcess(BackendProcess&&) noexcept;
  BackendProcess& operator=(BackendProcess&&) noexcept;

  std::uint16_t port() const { return port_; }  // 0 for the relay
  std::string url() const;                      // http://127.0.0.1:<port>

  // Starts the process again with the same arguments, on the same port (after a crash).
  void restart();
  // SIGKILL and reap.
  void kill();
  bool running();
  Process& process() { return *process_; }
  std::string log_tail(std::size_t lines = 40) const;

 private:
  void start();

  std::string command_;
  std::vector<std::string> args_;
  std::uint16_t port_ = 0;
  std::unique_ptr<Process> process_;
};

struct StackOptions {
  // The route's retention, also given to the API as --operation-retention, unless
  // api_retention says otherwise (the API only uses it for requests without the record's
  // lifetime headers).
  std::string retention = "24h";
  std::string api_retention;
  std::string lease = "1s";
  std::string wait = "300ms";
  // The relay sends every delivery twice (fault injection).
  bool deliver_twice = false;
  // The API records every arrival in demo_orders.arrivals (fault injection).
  bool record_arrivals = false;
  // The route's `completion`: "sidecar" or "backend" (the API completes the record in the
  // transaction of the order, docs/backend.md).
  std::string completion = "sidecar";
  // The route's store.statuses, when not the default.
  std::vector<std::string> store_statuses;
  // More of the route's YAML (async, replay, on_unknown_outcome, …), indented by 4 spaces.
  std::string route_yaml;
  // The API's --slow-order-time: how long an order of a SLOW-… item takes.
  std::string slow_order_time;
  // More of the sidecar's top-level YAML (encryption, tracing, …).
  std::string sidecar_yaml;
  // More sidecar routes beside the order route, each on a path of its own (the API serves
  // the same create at /v1/orders and /v2/orders too).
  std::vector<RouteOptions> extra_routes;
  // The sidecar's admin listener (host:port), for /metrics; empty: off.
  std::string admin_listen;
};

// The sidecar route of config/demo.yaml, with the test's timings.
RouteOptions order_route(const StackOptions& options);

class OrderStack {
 public:
  explicit OrderStack(StackOptions options = {});
  ~OrderStack();

  BackendProcess& payments() { return *payments_; }
  BackendProcess& inventory() { return *inventory_; }
  BackendProcess& api() { return *api_; }
  BackendProcess& relay() { return *relay_; }
  Sidecar& sidecar() { return *sidecar_; }
  // The options the sidecar was started with: a second replica of the same stack.
  const SidecarOptions& sidecar_options() const { return sidecar_options_; }

  // A client of the sidecar (each thread needs its own).
  HttpClient client() { return HttpClient(sidecar_->port()); }
  // A client of the order API itself, bypassing the sidecar.
  HttpClient api_client() { return HttpClient(api_->port()); }

 private:
  StackOptions options_;
  std::unique_ptr<BackendProcess> payments_;
  std::unique_ptr<BackendProcess> inventory_;
  std::unique_ptr<BackendProcess> api_;
  std::unique_ptr<BackendProcess> relay_;
  SidecarOptions sidecar_options_;
  std::unique_ptr<Sidecar> sidecar_;
};

// What one tenant left in PostgreSQL, across idemproxy's table and the three services.
struct Counts {
  std::int64_t orders = 0;
  std::int64_t idempotency_rows = 0;
  std::int64_t idempotency_completed = 0;
  std::int64_t outbox = 0;
  std::int64_t outbox_delivered = 0;
  std::int64_t charges = 0;
  std::int64_t reservations = 0;
};
Counts counts(Db& db, const std::string& tenant);

// The part of the counts that one logical operation must leave exactly once: its order,
// its idempotency row, its outbox event, its charge and its reservation.
struct Footprint {
  std::int64_t orders = 0;
  std::int64_t idempotency_rows = 0;
  std::int64_t outbox = 0;
  std::int64_t charges = 0;
  std::int64_t reservations = 0;
  bool operator==(const Footprint&) const = default;
};
inline constexpr Footprint kOneOperation{1, 1, 1, 1, 1};
inline Footprint footprint(const Counts& c) {
  return {c.orders, c.idempotency_rows, c.outbox, c.charges, c.reservations};
}
// doctest prints both sides of a failed CHECK with this.
inline std::ostream& operator<<(std::ostream& os, const Footprint& f) {
  return os << "{orders " << f.orders << ", idempotency rows " << f.idempotency_rows
            << ", outbox " << f.outbox << ", charges " << f.charges << ", reservations "
            << f.reservations << "}";
}

// Retries the request until its answer is no longer 409 idempotency_in_progress (a live
// lease of a dead owner), as a client honouring Retry-After would, only faster.
HttpResponse retry_until_settled(OrderStack& stack, const std::string& body,
                                 const Headers& headers);

// Waits until the relay marked `events` outbox events of the tenant delivered (and none is
// dead), then returns the counts. The relay is asynchronous: never assert its effects
// without this.
Counts wait_for_delivery(Db& db, const std::string& tenant, std::int64_t events,
                         Millis timeout = 15s);

// A valid order body; `checkout` empty: none.
std::string order_body(const std::string& checkout = "", std::int64_t amount = 1000,
                       const std::string& coupon = "");

// A string member of a JSON body ("" when absent or not a string).
std::string json_member(const std::string& body, const std::string& member);
inline std::string json_string(const HttpResponse& res, const std::string& member) {
  return json_member(res.body, member);
}

// The tenant's orders as stored, oldest first.
struct OrderRow {
  std::string order_id;
  std::int64_t attempt = 0;
  std::optional<std::string> operation_id;
  std::optional<std::string> retired_operation_id;
  std::optional<std::string> checkout_id;
};
std::vector<OrderRow> orders_of(Db& db, const std::string& tenant);

}  // namespace idem::it::e2e
