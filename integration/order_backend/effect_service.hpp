#pragma once
// The fake downstream services the relay delivers to: a payment service that charges and
// an inventory service that reserves stock. Each records its effect ONCE per
// (tenant, Idempotency-Key) in PostgreSQL and answers a duplicate with the first result,
// which is the contract the relay's at-least-once delivery relies on.
//
//   payments:   POST /charges       {"order_id","customer_id","amount","currency"}
//   inventory:  POST /reservations  {"order_id","items":[{"sku","qty"}]}
//   both:       GET /healthz
//
// Headers: X-Tenant-Id, Idempotency-Key (the relay derives it from the order:
// "<order_id>:charge", "<order_id>:reserve"), X-Event-Id (the outbox event's id; every
// delivery of it is counted in processed_events, in the same statement as the effect).
// A duplicate whose parameters differ from the first is refused (422
// idempotency_key_reused): one key, one operation.
//
// With --enable-fault-injection only, GET/PUT /_faults steer failures and slowness:
//   {"fail_next": N, "fail_mode": "before_effect" | "after_effect", "fail_status": 503,
//    "delay_ms": M}
// "after_effect" records the effect and then fails the answer: the caller cannot tell
// whether it happened, and must deliver again.
#include <memory>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "http_util.hpp"
#include "pg/pool.hpp"

namespace idem::demo {

enum class EffectKind { payment, reservation };

struct EffectServiceOptions {
  EffectKind kind = EffectKind::payment;
  bool fault_injection = false;
};

class EffectService {
 public:
  EffectService(std::shared_ptr<pg::Pool> pool, EffectServiceOptions options);

  static std::vector<pg::PreparedStatement> statements(EffectKind kind);

  asio::awaitable<Response> handle(Request& req);

 private:
  struct Faults {
    int fail_next = 0;
    bool fail_after_effect = false;
    unsigned fail_status = 503;
    Millis delay{0};
  };

  asio::awaitable<Response> record(Request& req);
  Response faults(Request& req);

  std::shared_ptr<pg::Pool> pool_;
  EffectServiceOptions options_;
  Faults faults_;  // one io_context thread: no lock needed
};

}  // namespace idem::demo
