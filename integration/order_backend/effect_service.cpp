#include "effect_service.hpp"

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/array.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <spdlog/spdlog.h>

#include "order_request.hpp"

namespace idem::demo {
namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

constexpr const char* kRecord = "record_effect";
constexpr const char* kFind = "find_effect";

// The delivery is counted and the effect inserted in one statement (one transaction):
// the inbox row and the effect cannot disagree. ON CONFLICT DO NOTHING makes the key the
// arbiter: a duplicate inserts nothing and reads the first result in a new statement
// (which, unlike this one, sees a concurrent first delivery's commit).
constexpr const char* kRecordChargeSql = R"sql(
WITH delivery AS (
  INSERT INTO demo_payments.processed_events AS e (event_id, tenant_id, idempotency_key)
  VALUES ($1::uuid, $2, $3)
  ON CONFLICT (event_id) DO UPDATE
    SET deliveries = e.deliveries + 1, last_delivered_at = now()
)
INSERT INTO demo_payments.charges
  (tenant_id, idempotency_key, order_id, customer_id, amount, currency, first_event_id)
VALUES ($2, $3, $4::uuid, $5, $6::bigint, $7, $1::uuid)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING charge_id::text, order_id::text, customer_id, amount::text, currency,
          to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))sql";

constexpr const char* kFindChargeSql = R"sql(
SELECT charge_id::text, order_id::text, customer_id, amount::text, currency,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
FROM demo_payments.charges
WHERE tenant_id = $1 AND idempotency_key = $2)sql";

constexpr const char* kRecordReservationSql = R"sql(
WITH delivery AS (
  INSERT INTO demo_inventory.processed_events AS e (event_id, tenant_id, idempotency_key)
  VALUES ($1::uuid, $2, $3)
  ON CONFLICT (event_id) DO UPDATE
    SET deliveries = e.deliveries + 1, last_delivered_at = now()
)
INSERT INTO demo_inventory.reservations
  (tenant_id, idempotency_key, order_id, items, first_event_id)
VALUES ($2, $3, $4::uuid, $5::jsonb, $1::uuid)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING reservation_id::text, order_id::text, items::text,
          to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))sql";

constexpr const char* kFindReservationSql = R"sql(
SELECT reservation_id::text, order_id::text, items::text,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
FROM demo_inventory.reservations
WHERE tenant_id = $1 AND idempotency_key = $2)sql";

// One delivery, as the request states it.
struct Effect {
  std::string tenant;
  std::string key;
  std::string event_id;
  std::string order_id;
  // payment
  std::string customer_id;
  std::int64_t amount = 0;
  std::string currency;
  // reservation
  std::vector<OrderItem> items;
};

// A charge or a reservation as stored, and as every answer about it shows it.
struct Stored {
  json::object body;
  // What a duplicate must agree on: the first delivery's parameters.
  std::string order_id;
  std::string fingerprint;
};

std::string payment_fingerprint(std::string_view customer, std::int64_t amount,
                                std::string_view currency) {
  return std::string(customer) + '\n' + std::to_string(amount) + '\n' + std::string(currency);
}

// Items as stored (jsonb reorders members) back to the canonical request form.
std::vector<OrderItem> stored_items(std::string_view text) {
  std::vector<OrderItem> items;
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  if (ec || !v.is_array()) return items;
  for (const auto& item : v.get_array()) {
    const auto* o = item.if_object();
    if (o == nullptr) continue;
    const auto* sku = o->if_contains("sku");
    const auto* qty = o->if_contains("qty");
    if (sku && sku->is_string() && qty && qty->is_int64()) {
      items.push_back({std::string(sku->get_string()), qty->get_int64()});
    }
  }
  return items;
}

std::optional<Stored> decode(EffectKind kind, const pg::Result& r) {
  Stored s;
  if (kind == EffectKind::payment) {
    if (r.columns() != 6) return std::nullopt;
    const auto amount = r.int64(0, 3);
    if (!amount) return std::nullopt;
    s.order_id = r.value(0, 1);
    s.fingerprint = payment_fingerprint(r.value(0, 2), *amount, r.value(0, 4));
    s.body = {{"charge_id", r.value(0, 0)},   {"order_id", r.value(0, 1)},
              {"customer_id", r.value(0, 2)}, {"amount", *amount},
              {"currency", r.value(0, 4)},    {"status", "captured"},
              {"created_at", r.value(0, 5)}};
  } else {
    if (r.columns() != 4) return std::nullopt;
    const auto items = stored_items(r.value(0, 2));
    s.order_id = r.value(0, 1);
    s.fingerprint = items_json(items);
    s.body = {{"reservation_id", r.value(0, 0)},
              {"order_id", r.value(0, 1)},
              {"items", json::parse(s.fingerprint)},
              {"status", "reserved"},
              {"created_at", r.value(0, 3)}};
  }
  return s;
}

// The request, checked. A Response means it is refused.
std::variant<Effect, Response> read_effect(EffectKind kind, const Request& req) {
  Effect e;
  const auto tenant = single_header(req, "X-Tenant-Id");
  const auto key = single_header(req, "Idempotency-Key");
  const auto event = single_header(req, "X-Event-Id");
  if (!tenant || !is_token(*tenant, 255) || !key || !is_token(*key, 255) || !event ||
      !is_uuid(*event)) {
    return problem(req, http::status::bad_request, "invalid_request", "Invalid request",
                   "X-Tenant-Id, Idempotency-Key and X-Event-Id (a UUID) are required");
  }
  e.tenant = std::string(*tenant);
  e.key = std::string(*key);
  e.event_id = std::string(*event);

  boost::system::error_code ec;
  const json::value doc = json::parse(req.body(), ec);
  const auto* o = ec ? nullptr : doc.if_object();
  const auto* order_id = o ? o->if_contains("order_id") : nullptr;
  if (order_id == nullptr || !order_id->is_string() || !is_uuid(order_id->get_string())) {
    return problem(req, http::status::bad_request, "invalid_request", "Invalid request",
                   "the body must be a JSON object with an order_id (a UUID)");
  }
  e.order_id = std::string(order_id->get_string());

  if (kind == EffectKind::payment) {
    const auto* customer = o->if_contains("customer_id");
    const auto* amount = o->if_contains("amount");
    const auto* currency = o->if_contains("currency");
    if (!customer || !customer->is_string() || !amount || !amount->is_int64() ||
        amount->get_int64() <= 0 || !currency || !currency->is_string()) {
      return problem(req, http::status::bad_request, "invalid_request", "Invalid charge",
                     "customer_id (string), amount (positive integer) and currency are required");
    }
    e.customer_id = std::string(customer->get_string());
    e.amount = amount->get_int64();
    e.currency = std::string(currency->get_string());
  } else {
    const auto* items = o->if_contains("items");
    if (!items || !items->is_array()) {
      return problem(req, http::status::bad_request, "invalid_request", "Invalid reservation",
                     "items (an array of {sku, qty}) is required");
    }
    e.items = stored_items(json::serialize(*items));
    if (e.items.size() != items->get_array().size() || e.items.empty()) {
      return problem(req, http::status::bad_request, "invalid_request", "Invalid reservation",
                     "every item needs a sku (string) and a qty (integer)");
    }
  }
  return e;
}

}  // namespace

EffectService::EffectService(std::shared_ptr<pg::Pool> pool, EffectServiceOptions options)
    : pool_(std::move(pool)), options_(options) {}

std::vector<pg::PreparedStatement> EffectService::statements(EffectKind kind) {
  if (kind == EffectKind::payment) {
    return {{kRecord, kRecordChargeSql}, {kFind, kFindChargeSql}};
  }
  return {{kRecord, kRecordReservationSql}, {kFind, kFindReservationSql}};
}

asio::awaitable<Response> EffectService::handle(Request& req) {
  std::string_view path = req.target();
  path = path.substr(0, path.find('?'));
  const std::string_view effect_path =
      options_.kind == EffectKind::payment ? "/charges" : "/reservations";
  const char* service = options_.kind == EffectKind::payment ? "payments" : "inventory";

  Response res;
  if (path == effect_path && req.method() == http::verb::post) {
    res = co_await record(req);
  } else if (path == "/healthz" && req.method() == http::verb::get) {
    res = json_response(req, http::status::ok, json::object{{"status", "ok"}});
  } else if (path == "/_faults" && options_.fault_injection) {
    res = faults(req);
  } else {
    res = problem(req, http::status::not_found, "not_found", "Not found",
                  "no such resource on this service");
  }
  spdlog::info("{}: {} {} -> {} (tenant {}, key {}, event {})", service,
               std::string(req.method_string()), std::string(path), res.result_int(),
               std::string(single_header(req, "X-Tenant-Id").value_or("-")),
               std::string(single_header(req, "Idempotency-Key").value_or("-")),
               std::string(single_header(req, "X-Event-Id").value_or("-")));
  co_return res;
}

asio::awaitable<Response> EffectService::record(Request& req) {
  auto parsed = read_effect(options_.kind, req);
  if (auto* refused = std::get_if<Response>(&parsed)) co_return std::move(*refused);
  const Effect& e = std::get<Effect>(parsed);

  // Faults are taken per request, before any await, so concurrent requests each see
  // their own share of fail_next.
  const Faults faults = faults_;
  const bool fail = faults_.fail_next > 0;
  if (fail) --faults_.fail_next;
  if (faults.delay > Millis::zero()) {
    asio::steady_timer timer(co_await asio::this_coro::executor, faults.delay);
    co_await timer.async_wait(use_tuple);
  }
  const auto injected_failure = [&] {
    spdlog::warn("fault injection: failing {} {} ({} the effect)", std::string(req.target()), e.key,
                 faults.fail_after_effect ? "after" : "before");
    return problem(req, static_cast<http::status>(faults.fail_status), "injected_fault",
                   "Injected fault", "fault injection");
  };
  if (fail && !faults.fail_after_effect) co_return injected_failure();

  const auto failed = [&](const error_code& ec) {
    spdlog::error("database call failed: {} ({})", ec.message(), pool_->last_error_message());
    Response res = problem(req, http::status::service_unavailable, "store_unavailable",
                           "Store unavailable", "the service's database could not be reached");
    res.set(http::field::retry_after, "1");
    return res;
  };

  const std::string amount = std::to_string(e.amount);
  const std::string items = items_json(e.items);
  std::vector<pg::Param> params{pg::Param::text(e.event_id), pg::Param::text(e.tenant),
                                pg::Param::text(e.key), pg::Param::text(e.order_id)};
  if (options_.kind == EffectKind::payment) {
    params.push_back(pg::Param::text(e.customer_id));
    params.push_back(pg::Param::text(amount));
    params.push_back(pg::Param::text(e.currency));
  } else {
    params.push_back(pg::Param::text(items));
  }
  auto inserted = co_await pool_->execute(kRecord, std::move(params));
  if (!inserted) co_return failed(inserted.error());
  bool first = inserted->rows() == 1;
  std::optional<Stored> stored;
  if (first) {
    stored = decode(options_.kind, *inserted);
  } else {
    std::vector<pg::Param> key{pg::Param::text(e.tenant), pg::Param::text(e.key)};
    auto found = co_await pool_->execute(kFind, std::move(key));
    if (!found) co_return failed(found.error());
    if (found->rows() == 1) stored = decode(options_.kind, *found);
  }
  if (!stored) co_return failed(make_error_code(pg::errc::protocol));

  if (fail) co_return injected_failure();  // the effect stays: the answer is what is lost

  if (!first) {
    const std::string fingerprint = options_.kind == EffectKind::payment
                                        ? payment_fingerprint(e.customer_id, e.amount, e.currency)
                                        : items;
    if (stored->order_id != e.order_id || stored->fingerprint != fingerprint) {
      co_return problem(req, http::status::unprocessable_entity, "idempotency_key_reused",
                        "Idempotency key reused", "this key was first used with other parameters");
    }
  }
  Response res = json_response(req, http::status::created, stored->body);
  if (!first) res.set("Idempotent-Replayed", "true");
  co_return res;
}

Response EffectService::faults(Request& req) {
  if (req.method() == http::verb::put) {
    boost::system::error_code ec;
    const json::value doc = json::parse(req.body(), ec);
    const auto* o = ec ? nullptr : doc.if_object();
    if (o == nullptr) {
      return problem(req, http::status::bad_request, "invalid_request", "Invalid faults",
                     "expected a JSON object");
    }
    Faults next;
    const auto* fail_next = o->if_contains("fail_next");
    const auto* mode = o->if_contains("fail_mode");
    const auto* status = o->if_contains("fail_status");
    const auto* delay = o->if_contains("delay_ms");
    if ((fail_next && (!fail_next->is_int64() || fail_next->get_int64() < 0)) ||
        (mode && (!mode->is_string() || (mode->get_string() != "before_effect" &&
                                         mode->get_string() != "after_effect"))) ||
        (status &&
         (!status->is_int64() || status->get_int64() < 400 || status->get_int64() > 599)) ||
        (delay && (!delay->is_int64() || delay->get_int64() < 0 || delay->get_int64() > 60'000))) {
      return problem(req, http::status::bad_request, "invalid_request", "Invalid faults",
                     "fail_next >= 0, fail_mode before_effect|after_effect, fail_status "
                     "400-599, delay_ms 0-60000");
    }
    if (fail_next) next.fail_next = static_cast<int>(fail_next->get_int64());
    if (mode) next.fail_after_effect = mode->get_string() == "after_effect";
    if (status) next.fail_status = static_cast<unsigned>(status->get_int64());
    if (delay) next.delay = Millis(delay->get_int64());
    faults_ = next;
  } else if (req.method() != http::verb::get) {
    return problem(req, http::status::method_not_allowed, "method_not_allowed",
                   "Method not allowed", "GET or PUT");
  }
  return json_response(
      req, http::status::ok,
      json::object{{"fail_next", faults_.fail_next},
                   {"fail_mode", faults_.fail_after_effect ? "after_effect" : "before_effect"},
                   {"fail_status", faults_.fail_status},
                   {"delay_ms", faults_.delay.count()}});
}

}  // namespace idem::demo
