#include "order_api.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/json/array.hpp>
#include <boost/json/parse.hpp>
#include <spdlog/spdlog.h>

#include "common/text.hpp"
#include "order_request.hpp"

namespace idem::demo {

// What the sidecar (or a direct caller) told us in headers.
struct OrderApi::Arrival {
  enum class Fault { none, rollback, crash_after_commit, delay_after_commit };

  std::string tenant;
  std::optional<std::string> operation_id;
  std::int64_t attempt = 0;  // 0: no sidecar in front (no operation id)
  std::optional<std::int64_t> fencing_token;  // X-Idempotency-Fencing-Token, if sent
  // The record's lifetime from the sidecar's database clock (X-Idempotency-Record-Created,
  // -Expires): what tells a new generation of a key from a retry (docs/backend.md).
  std::optional<std::string> record_created;
  std::optional<std::string> record_expires;
  // X-Idempotency-Record, on routes with completion: backend: the record this request's
  // transaction completes (idemproxy_complete, migration 0004 of the sidecar).
  std::optional<std::string> record;
  Millis demo_delay{0};
  Fault fault = Fault::none;
  Millis fault_delay{0};
};

// One order as stored; every answer about an order is built from this, never from the
// request, so the first answer and every later one are the same bytes.
struct OrderApi::OrderRow {
  std::string order_id;
  std::string tenant_id;
  std::optional<std::string> checkout_id;
  std::string customer_id;
  std::string currency;
  std::int64_t amount = 0;
  std::int64_t discount = 0;
  std::int64_t total = 0;
  std::optional<std::string> coupon;
  std::string items_json;
  std::string created_at;
  std::int64_t attempt = 0;
  bool operation_expired = false;
  std::string body;  // the 201 answer's body (demo_orders.order_body), rendered once
};

namespace {

using Arrival = OrderApi::Arrival;
using OrderRow = OrderApi::OrderRow;
using namespace std::chrono_literals;

// ---------------------------------------------------------------------------- SQL
// Every statement addresses orders by tenant: an order id or operation id from another
// tenant finds nothing. Times are decided by PostgreSQL's clock (now()), the same clock
// the sidecar uses for its records.

constexpr const char* kOrderByOperation = "order_by_operation";
constexpr const char* kRetireOperation = "retire_operation";
constexpr const char* kRecordAttempt = "record_attempt";
constexpr const char* kRecordArrival = "record_arrival";
constexpr const char* kCoupon = "coupon";
constexpr const char* kCreateOrder = "create_order";
constexpr const char* kCreateOrderThenFail = "create_order_then_fail";
constexpr const char* kOrderByCheckout = "order_by_checkout";
constexpr const char* kOrderById = "order_by_id";

// Column order is the contract with decode_order(), over an order aliased `o`. created_at
// and the body are rendered by the database, once, so every answer about an order shows
// the same text. `expired_at_or_before`: the instant at which the operation id counts as
// passed (an SQL expression).
std::string order_columns(std::string_view expired_at_or_before = "now()") {
  return R"sql(
  o.order_id::text, o.tenant_id, o.checkout_id, o.customer_id, o.currency, o.amount,
  o.discount, o.total, o.coupon, o.items::text,
  to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
  o.attempt, coalesce(o.operation_expires_at <= )sql" +
         std::string(expired_at_or_before) + R"sql(, false),
  demo_orders.order_body(ROW(o.*)::demo_orders.orders))sql";
}

// An arrival whose record was created at or after the expiry stored for its operation id
// belongs to a new generation of the key ($3: X-Idempotency-Record-Created). Without the
// header (an older sidecar, a direct call) the API's own window decides: now().
constexpr std::string_view kGenerationBoundary = "coalesce($3::timestamptz, now())";

constexpr std::string_view kOrderByOperationWhere =
    " FROM demo_orders.orders o WHERE o.tenant_id = $1 AND o.operation_id = $2";

// The retention of the operation passed: the id now belongs to whatever new operation the
// sidecar forwards under it. The old order keeps it for audits in retired_operation_id.
// Guarded by the expiry so that two arrivals racing here retire it once.
constexpr const char* kRetireOperationSql = R"sql(
UPDATE demo_orders.orders
SET retired_operation_id = operation_id, operation_id = NULL
WHERE tenant_id = $1 AND operation_id = $2
  AND operation_expires_at <= coalesce($3::timestamptz, now()))sql";

// A later attempt of the operation reached us: remember it, and keep the operation id
// valid as long as the sidecar's record may still forward it (its expiry as of this claim,
// $5; without the header, a full retention from now). "attempt < $3" is the fence: a
// straggler of an older attempt matches nothing and changes nothing.
constexpr const char* kRecordAttemptSql = R"sql(
UPDATE demo_orders.orders
SET attempt = $3::bigint,
    operation_expires_at = GREATEST(operation_expires_at,
                                    coalesce($5::timestamptz,
                                             now() + $4::bigint * interval '1 millisecond'))
WHERE tenant_id = $1 AND operation_id = $2 AND attempt < $3::bigint)sql";

constexpr const char* kRecordArrivalSql = R"sql(
INSERT INTO demo_orders.arrivals (tenant_id, operation_id, attempt, fencing_token)
VALUES ($1, $2, $3::bigint, $4::bigint))sql";

constexpr const char* kCouponSql =
    "SELECT percent_off, expires_at <= now() FROM demo_orders.coupons WHERE code = $1";

// The order and its event in one statement, which PostgreSQL runs as one transaction:
// both rows commit, or neither does. ON CONFLICT DO NOTHING without a target covers both
// unique constraints (operation id and checkout); a loser gets no row back and finds out
// which one it hit in new statements (each sees the winner's commit under READ COMMITTED).
// The event carries what the relay needs, so the relay never reads the orders table.
constexpr std::string_view kCreateOrderCte = R"sql(
WITH new_order AS (
  INSERT INTO demo_orders.orders
    (tenant_id, operation_id, operation_expires_at, attempt, checkout_id,
     customer_id, currency, amount, discount, total, coupon, items)
  VALUES ($1, $2::text,
          CASE WHEN $2::text IS NULL THEN NULL
               ELSE coalesce($12::timestamptz, now() + $3::bigint * interval '1 millisecond')
          END,
          $4::bigint, $5, $6, $7, $8::bigint, $9::bigint, $8::bigint - $9::bigint,
          $10, $11::jsonb)
  ON CONFLICT DO NOTHING
  RETURNING *
), created_event AS (
  INSERT INTO demo_orders.outbox (tenant_id, order_id, event_type, payload)
  SELECT tenant_id, order_id, 'OrderCreated',
         jsonb_build_object('order_id', order_id, 'customer_id', customer_id,
                            'currency', currency, 'total', total, 'items', items)
  FROM new_order
)
)sql";

// Fault injection only (X-Fault: rollback): the same statement, whose result then fails
// on purpose. The error comes after both INSERTs ran, from a value only the inserted row
// has (so the planner cannot raise it early), and aborts the statement: PostgreSQL rolls
// back the order and its event, exactly as a failure before COMMIT would.
constexpr std::string_view kFailAfterInsert =
    "SELECT ('fault injection: failing before the commit of order ' || order_id)::bigint "
    "FROM new_order";
constexpr std::string_view kInjectedFailureSqlstate = "22P02";  // invalid_text_representation

// The same statement for completion: backend routes: the idempotency record is completed
// with the very answer this order gets, in the same statement and so the same
// transaction ($13: X-Idempotency-Record). If a newer attempt owns the record,
// idemproxy_complete() raises IP001 and the order and its event roll back with it. Run
// unprepared: it names a function of the sidecar's schema, which may be created after this
// process started.
std::string create_recorded_sql() {
  return std::string(kCreateOrderCte) + "SELECT " + order_columns() +
         R"sql(,
  idemproxy_complete($1, $13, 201,
      jsonb_build_array(jsonb_build_array('Content-Type', 'application/json'),
                        jsonb_build_array('Location', '/orders/' || o.order_id::text)),
      convert_to(demo_orders.order_body(ROW(o.*)::demo_orders.orders), 'UTF8'),
      '/orders/' || o.order_id::text)
FROM new_order o)sql";
}

// An earlier attempt made the order; this one owns the record: complete it with the
// order's answer (unprepared, as above).
constexpr const char* kCompleteExistingSql = R"sql(
SELECT idemproxy_complete($1, $2, 201,
    jsonb_build_array(jsonb_build_array('Content-Type', 'application/json'),
                      jsonb_build_array('Location', $4::text)),
    convert_to($3, 'UTF8'), $4))sql";

// idemproxy_complete()'s "a newer attempt owns the record" (the sidecar's migration 0004).
constexpr std::string_view kFencedSqlstate = "IP001";

constexpr const char* kOrderByCheckoutSql =
    "SELECT order_id::text FROM demo_orders.orders WHERE tenant_id = $1 AND checkout_id = $2";

// A read of an order shows where it is now: "confirmed" once its outbox event was
// delivered (charged and reserved), else "created" as in the create's answer. This is the
// representation a re-fetched replay (replay.mode: refetch) brings back.
constexpr std::string_view kOrderDeliveredColumn =
    ", EXISTS (SELECT 1 FROM demo_orders.outbox e WHERE e.order_id = o.order_id AND "
    "e.delivered_at IS NOT NULL)";

constexpr std::string_view kOrderByIdWhere =
    " FROM demo_orders.orders o WHERE o.order_id = $1::uuid AND o.tenant_id = $2";

// ------------------------------------------------------------------------- helpers

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

asio::awaitable<void> sleep_for(Millis duration) {
  asio::steady_timer timer(co_await asio::this_coro::executor, duration);
  co_await timer.async_wait(use_tuple);
}

std::optional<std::string> optional_text(const pg::Result& r, int row, int col) {
  if (r.is_null(row, col)) return std::nullopt;
  return std::string(r.value(row, col));
}

// `extra`: columns after the order's (the completion's digest).
std::optional<OrderRow> decode_order(const pg::Result& r, int row, int extra = 0) {
  if (r.columns() != 14 + extra) return std::nullopt;
  OrderRow o;
  o.order_id = r.value(row, 0);
  o.tenant_id = r.value(row, 1);
  o.checkout_id = optional_text(r, row, 2);
  o.customer_id = r.value(row, 3);
  o.currency = r.value(row, 4);
  const auto amount = r.int64(row, 5);
  const auto discount = r.int64(row, 6);
  const auto total = r.int64(row, 7);
  o.coupon = optional_text(r, row, 8);
  o.items_json = r.value(row, 9);
  o.created_at = r.value(row, 10);
  const auto attempt = r.int64(row, 11);
  const auto expired = r.boolean(row, 12);
  o.body = r.value(row, 13);
  if (!amount || !discount || !total || !attempt || !expired) return std::nullopt;
  o.amount = *amount;
  o.discount = *discount;
  o.total = *total;
  o.attempt = *attempt;
  o.operation_expired = *expired;
  return o;
}

// 201 for the attempt that created the order and for every later attempt that finds it:
// a re-executed attempt must be indistinguishable from the first, or the client could
// tell that a crash happened in between.
// An order as clients see it: the body the database rendered (no operation id or attempt:
// those differ between attempts of one operation, and every attempt must answer with the
// same bytes).
Response order_response(const Request& req, http::status status, const OrderRow& o) {
  Response res{status, req.version()};
  res.set(http::field::content_type, "application/json");
  res.body() = o.body;
  res.keep_alive(req.keep_alive());
  res.prepare_payload();
  return res;
}

// `recorded`: the digest idemproxy_complete() returned, when this answer is the one the
// idempotency record holds (completion: backend), for the sidecar to confirm.
Response created(const Request& req, const OrderRow& o, std::string_view recorded = {}) {
  Response res = order_response(req, http::status::created, o);
  res.set(http::field::location, "/orders/" + o.order_id);
  if (!recorded.empty()) res.set("X-Idempotency-Recorded", recorded);
  return res;
}

std::string short_id(const std::optional<std::string>& id) {
  return id ? id->substr(0, 12) : std::string("-");
}

// A newer attempt owns the operation's record: this request's transaction was refused and
// nothing was written. Its sidecar is stale; "release" tells it not to remember this.
Response superseded(const Request& req, const Arrival& a) {
  spdlog::warn("order-api: attempt {} of operation {} no longer owns its record: refused, "
               "nothing written", a.attempt, short_id(a.operation_id));
  Response res = problem(req, http::status::service_unavailable, "operation_superseded",
                         "Operation superseded",
                         "a newer attempt of this operation owns its idempotency record; "
                         "nothing was written");
  res.set(http::field::retry_after, "1");
  res.set("X-Idempotency-Directive", "release");
  return res;
}

// The directive tells the sidecar what to remember whatever its route's `store` lists say
// (docs/backend.md): a malformed request failed before anything was owned and must not
// stick to the key (the corrected request, with the same key, must run); a deterministic
// business rejection is the operation's answer and is replayed.
Response with_directive(Response res, std::string_view directive) {
  res.set("X-Idempotency-Directive", directive);
  return res;
}

Response business_rejection(const Request& req, http::status status, std::string_view code,
                            std::string_view title, const std::string& detail,
                            json::object extra = {}) {
  return with_directive(problem(req, status, code, title, detail, std::move(extra)), "record");
}

Response rejection(const Request& req, const Rejection& r) {
  auto res = problem(req, static_cast<http::status>(r.status), r.code, r.title, r.detail);
  return with_directive(std::move(res), r.status == 400 ? "release" : "record");
}

// The database did not answer (or not as expected). Nothing was committed that a retry
// could duplicate: a retry finds the order through the operation id if it was. 503 is
// not recorded by the sidecar, which releases the key so the client can retry.
Response unavailable(const Request& req, pg::Pool& pool, const error_code& ec) {
  spdlog::error("order-api: database call failed: {} ({})", ec.message(),
                pool.last_error_message());
  Response res = problem(req, http::status::service_unavailable, "store_unavailable",
                         "Order store unavailable",
                         "the order database could not be reached; retry with the same key");
  res.set(http::field::retry_after, "1");
  return res;
}

// "application/json", in any case, with or without parameters such as charset.
bool is_json(std::string_view content_type) {
  const std::string_view type = text::trim_ows(content_type.substr(0, content_type.find(';')));
  return text::iequals(type, "application/json");
}


bool has_media_type(std::string_view content_type, std::string_view wanted) {
  const std::string_view type = text::trim_ows(content_type.substr(0, content_type.find(';')));
  return text::iequals(type, wanted);
}

// The request's headers, checked. A Response means the request is refused.
std::variant<Arrival, Response> read_arrival(const Request& req, const OrderApiOptions& options) {
  Arrival a;
  bool repeated = false;
  const auto tenant = single_header(req, "X-Tenant-Id", &repeated);
  if (!tenant || repeated || !is_token(*tenant, 255)) {
    return problem(req, http::status::unauthorized, "tenant_missing", "Tenant missing",
                   "X-Tenant-Id must be set once, to 1-255 visible ASCII characters");
  }
  a.tenant = std::string(*tenant);

  // Set by the sidecar, which removes any value a client sent. Without it (a direct call)
  // the order is still protected by checkout_id, not by an idempotency key.
  if (const auto op = single_header(req, "X-Idempotency-Operation-Id", &repeated)) {
    const auto attempt_text = single_header(req, "X-Idempotency-Attempt");
    const std::int64_t attempt = attempt_text ? parse_int(*attempt_text).value_or(0) : 0;
    if (repeated || op->size() != 64 || !text::is_lower_hex(*op) || attempt < 1) {
      return problem(req, http::status::bad_request, "invalid_request",
                     "Invalid idempotency headers",
                     "X-Idempotency-Operation-Id must be 64 lowercase hex characters and "
                     "X-Idempotency-Attempt a positive integer");
    }
    a.operation_id = std::string(*op);
    a.attempt = attempt;
    if (const auto token = single_header(req, "X-Idempotency-Fencing-Token")) {
      const auto value = parse_int(*token);
      if (!value || *value < 1) {
        return problem(req, http::status::bad_request, "invalid_request",
                       "Invalid idempotency headers",
                       "X-Idempotency-Fencing-Token must be a positive integer");
      }
      a.fencing_token = *value;
    }
    // Passed to PostgreSQL as timestamptz; refused here unless they look like the RFC 3339
    // UTC stamps the sidecar sends, so a bad value cannot fail a statement later.
    const auto stamp = [](std::string_view v) {
      return !v.empty() && v.size() <= 40 &&
             v.find_first_not_of("0123456789-:.TZ") == std::string_view::npos;
    };
    for (auto [name, field] : {std::pair{"X-Idempotency-Record-Created", &a.record_created},
                               std::pair{"X-Idempotency-Record-Expires", &a.record_expires}}) {
      if (const auto v = single_header(req, name)) {
        if (!stamp(*v)) {
          return problem(req, http::status::bad_request, "invalid_request",
                         "Invalid idempotency headers",
                         std::string(name) + " must be an RFC 3339 UTC timestamp");
        }
        *field = std::string(*v);
      }
    }
    if (const auto record = single_header(req, "X-Idempotency-Record")) {
      if (record->empty() || record->size() > 4096) {
        return problem(req, http::status::bad_request, "invalid_request",
                       "Invalid idempotency headers", "X-Idempotency-Record is malformed");
      }
      a.record = std::string(*record);
    }
  }

  // Part of the demo, not a fault: it makes "in progress" visible with curl.
  if (const auto delay = single_header(req, "X-Demo-Delay-Ms")) {
    const auto ms = parse_int(*delay);
    if (!ms || Millis(*ms) > options.max_demo_delay) {
      return problem(req, http::status::bad_request, "invalid_request", "Invalid demo delay",
                     "X-Demo-Delay-Ms must be an integer from 0 to " +
                         std::to_string(options.max_demo_delay.count()));
    }
    a.demo_delay = Millis(*ms);
  }

  // Fault switches: honoured only when the process was started with
  // --enable-fault-injection, which scripts/demo never passes. Otherwise the header is
  // ignored (and logged), so a stray header can never break the demo.
  if (const auto fault = single_header(req, "X-Fault")) {
    if (!options.fault_injection) {
      spdlog::warn("order-api: ignoring X-Fault: fault injection is not enabled");
      return a;
    }
    constexpr std::string_view delay_prefix = "delay-after-commit=";
    if (*fault == "rollback") {
      a.fault = Arrival::Fault::rollback;
    } else if (*fault == "crash-after-commit") {
      a.fault = Arrival::Fault::crash_after_commit;
    } else if (fault->starts_with(delay_prefix)) {
      const auto ms = parse_int(fault->substr(delay_prefix.size()));
      if (!ms || *ms > 60'000) {
        return problem(req, http::status::bad_request, "invalid_fault", "Invalid fault",
                       "delay-after-commit takes milliseconds, at most 60000");
      }
      a.fault = Arrival::Fault::delay_after_commit;
      a.fault_delay = Millis(*ms);
    } else {
      return problem(req, http::status::bad_request, "invalid_fault", "Invalid fault",
                     "X-Fault: rollback | crash-after-commit | delay-after-commit=<ms>");
    }
  }
  return a;
}

// ------------------------------------------------------------------ store calls

// The order an earlier attempt of this operation created, if its retention has not
// passed. An order whose operation expired has its id retired here, so that the insert
// that follows can reuse it for the new operation.
pg::Param optional_param(const std::optional<std::string>& s) {
  return s ? pg::Param::text(*s) : pg::Param::null_value();
}

asio::awaitable<result<std::optional<OrderRow>>> find_operation(pg::Pool& pool, const Arrival& a) {
  std::vector<pg::Param> params{pg::Param::text(a.tenant), pg::Param::text(*a.operation_id),
                                optional_param(a.record_created)};
  auto r = co_await pool.execute(kOrderByOperation, std::move(params));
  if (!r) co_return r.error();
  if (r->rows() == 0) co_return std::optional<OrderRow>{};
  auto row = decode_order(*r, 0);
  if (!row) co_return make_error_code(pg::errc::protocol);
  if (!row->operation_expired) co_return std::optional<OrderRow>{std::move(*row)};

  spdlog::info(
      "order-api: operation {} of tenant {} passed its retention; order {} keeps it "
      "as retired, this request is a new operation",
      short_id(a.operation_id), a.tenant, row->order_id);
  std::vector<pg::Param> retire{pg::Param::text(a.tenant), pg::Param::text(*a.operation_id),
                                optional_param(a.record_created)};
  auto retired = co_await pool.execute(kRetireOperation, std::move(retire));
  if (!retired) co_return retired.error();
  co_return std::optional<OrderRow>{};
}

// True when `row` is the order `order` describes: every field that makes the order what
// it is (the sidecar's fingerprint in config/demo.yaml covers the same ones).
bool same_order(const OrderRow& row, const OrderRequest& order) {
  if (row.customer_id != order.customer_id || row.currency != order.currency ||
      row.amount != order.amount || row.checkout_id != order.checkout_id ||
      row.coupon != order.coupon) {
    return false;
  }
  boost::system::error_code ec;
  const json::value stored = json::parse(row.items_json, ec);
  if (ec || !stored.is_array() || stored.get_array().size() != order.items.size()) return false;
  for (std::size_t i = 0; i < order.items.size(); ++i) {
    const auto* fields = stored.get_array()[i].if_object();
    const auto* sku = fields ? fields->if_contains("sku") : nullptr;
    const auto* qty = fields ? fields->if_contains("qty") : nullptr;
    if (sku == nullptr || !sku->is_string() || sku->get_string() != order.items[i].sku ||
        qty == nullptr || !qty->is_int64() || qty->get_int64() != order.items[i].qty) {
      return false;
    }
  }
  return true;
}

// An earlier attempt of this operation created `row`: answer with it. A later attempt is
// recorded (the fence for stragglers, and a fresh retention for the operation id). An
// earlier one changes nothing and gets the same answer: it is a straggler of an attempt the
// sidecar already superseded (which the sidecar fences), or a fresh claim after the sidecar
// released the key on a 5xx (attempts restart at 1); the order is the right answer to both.
//
// Unless the request describes another order: after a 5xx the sidecar frees the key, and
// the same key may come back with other parameters as a new operation, under the same
// operation id. If our 5xx came after our commit (a fault between commit and answer), the
// order of the first request exists; answering it to the second request would hand a
// client an order it did not ask for. That is refused (422, recorded by the sidecar like
// any business refusal) and nothing changes.
asio::awaitable<Response> answer_existing(pg::Pool& pool, const OrderApiOptions& options,
                                          const Request& req, const Arrival& a,
                                          const OrderRequest& order, const OrderRow& row) {
  if (!same_order(row, order)) {
    spdlog::warn("order-api: operation {} already has order {} made from another request",
                 short_id(a.operation_id), row.order_id);
    co_return business_rejection(req, http::status::unprocessable_entity, "operation_id_reused",
                      "Operation id reused",
                      "this operation id already has an order made from other parameters");
  }
  if (a.attempt > row.attempt) {
    const std::string attempt = std::to_string(a.attempt);
    const std::string retention = std::to_string(options.operation_retention.count());
    std::vector<pg::Param> params{pg::Param::text(a.tenant), pg::Param::text(*a.operation_id),
                                  pg::Param::text(attempt), pg::Param::text(retention),
                                  optional_param(a.record_expires)};
    auto updated = co_await pool.execute(kRecordAttempt, std::move(params));
    if (!updated) co_return unavailable(req, pool, updated.error());
    spdlog::info("order-api: attempt {} of operation {} found order {} (created by attempt {})",
                 a.attempt, short_id(a.operation_id), row.order_id, row.attempt);
  } else if (a.attempt < row.attempt) {
    spdlog::warn(
        "order-api: stale attempt {} of operation {} (order {} is at attempt {}): "
        "nothing changed",
        a.attempt, short_id(a.operation_id), row.order_id, row.attempt);
  }
  if (!a.record) co_return created(req, row);
  // completion: backend, and the order was made by an earlier attempt: this attempt owns
  // the record now, and completes it with the order's answer.
  const std::string location = "/orders/" + row.order_id;
  std::vector<pg::Param> params{pg::Param::text(a.tenant), pg::Param::text(*a.record),
                                pg::Param::text(row.body), pg::Param::text(location)};
  auto recorded = co_await pool.query(kCompleteExistingSql, std::move(params));
  if (!recorded) {
    if (pg::sqlstate(recorded.error()) == kFencedSqlstate) co_return superseded(req, a);
    co_return unavailable(req, pool, recorded.error());
  }
  if (recorded->rows() != 1) co_return unavailable(req, pool, make_error_code(pg::errc::protocol));
  co_return created(req, row, recorded->value(0, 0));
}

}  // namespace

// ---------------------------------------------------------------------- OrderApi

OrderApi::OrderApi(std::shared_ptr<pg::Pool> pool, OrderApiOptions options)
    : pool_(std::move(pool)), options_(options) {}

std::vector<pg::PreparedStatement> OrderApi::statements() {
  const std::string select_order = "SELECT " + order_columns();
  const std::string create(kCreateOrderCte);
  return {
      {kOrderByOperation,
       "SELECT " + order_columns(kGenerationBoundary) + std::string(kOrderByOperationWhere)},
      {kRetireOperation, kRetireOperationSql},
      {kRecordAttempt, kRecordAttemptSql},
      {kRecordArrival, kRecordArrivalSql},
      {kCoupon, kCouponSql},
      {kCreateOrder, create + select_order + " FROM new_order o"},
      {kCreateOrderThenFail, create + std::string(kFailAfterInsert)},
      {kOrderByCheckout, kOrderByCheckoutSql},
      {kOrderById, select_order + std::string(kOrderDeliveredColumn) + std::string(kOrderByIdWhere)},
  };
}

namespace {

enum class Handler { create, get_order, by_operation, healthz, faults };

struct Served {
  ApiOperation operation;
  Handler handler;
};

// What the API serves, and the only place handle() looks: a path is served exactly when it
// is here, so the table is the list openapi.yaml must document. /v1/orders and /v2/orders
// are the same create under other paths: the demo's Stripe-style (form) and Square-style
// (key in the body) routes of the sidecar.
constexpr Served kServed[] = {
    {{"POST", "/orders"}, Handler::create},
    {{"POST", "/v1/orders"}, Handler::create},
    {{"POST", "/v2/orders"}, Handler::create},
    {{"GET", "/orders/{order_id}"}, Handler::get_order},
    {{"GET", "/orders/by-operation/{operation_id}"}, Handler::by_operation},
    {{"GET", "/healthz"}, Handler::healthz},
    {{"GET", "/_faults", true}, Handler::faults},
    {{"PUT", "/_faults", true}, Handler::faults},
};

// True when `path` fits the template; `parameter` gets the segment a "{name}" stood for.
bool matches(std::string_view path_template, std::string_view path, std::string_view& parameter) {
  while (!path_template.empty() && !path.empty()) {
    if (path_template.front() != '/' || path.front() != '/') return false;
    path_template.remove_prefix(1);
    path.remove_prefix(1);
    const auto t = path_template.substr(0, path_template.find('/'));
    const auto p = path.substr(0, path.find('/'));
    if (t.starts_with('{')) {
      if (p.empty()) return false;
      parameter = p;
    } else if (t != p) {
      return false;
    }
    path_template.remove_prefix(t.size());
    path.remove_prefix(p.size());
  }
  return path_template.empty() && path.empty();
}

}  // namespace

std::span<const ApiOperation> OrderApi::operations() {
  static const auto table = [] {
    std::vector<ApiOperation> out;
    for (const auto& s : kServed) out.push_back(s.operation);
    return out;
  }();
  return table;
}

asio::awaitable<Response> OrderApi::dispatch(Request& req, std::size_t operation,
                                             std::string_view parameter) {
  switch (kServed[operation].handler) {
    case Handler::create: co_return co_await create(req);
    case Handler::get_order: co_return co_await get(req, parameter);
    case Handler::by_operation: co_return co_await by_operation(req, parameter);
    case Handler::healthz: co_return json_response(req, http::status::ok, json::object{{"status", "ok"}});
    case Handler::faults: co_return faults(req);
  }
  co_return problem(req, http::status::internal_server_error, "internal", "Internal error",
                    "no handler");
}

asio::awaitable<Response> OrderApi::handle(Request& req) {
  const auto started = SteadyClock::now();
  std::string_view path = req.target();
  path = path.substr(0, path.find('?'));

  // The served operation, or the methods this path does answer (405 names them).
  std::optional<std::size_t> found;
  std::string_view parameter;
  std::string allow;
  for (std::size_t i = 0; i < std::size(kServed) && !found; ++i) {
    const ApiOperation& op = kServed[i].operation;
    if ((op.fault_injection_only && !options_.fault_injection) || !matches(op.path, path, parameter)) {
      continue;
    }
    if (req.method_string() == op.method) {
      found = i;
    } else {
      allow += (allow.empty() ? "" : ", ") + std::string(op.method);
    }
  }
  Response res;
  if (found) {
    res = co_await dispatch(req, *found, parameter);
  } else if (!allow.empty()) {
    res = problem(req, http::status::method_not_allowed, "method_not_allowed",
                  "Method not allowed", "this resource answers " + allow);
    res.set(http::field::allow, allow);
  } else {
    res = problem(req, http::status::not_found, "not_found", "Not found",
                  "no such resource on the order API");
  }

  // One line per request. Tenant and ids, never bodies.
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - started);
  const auto op = single_header(req, "X-Idempotency-Operation-Id");
  spdlog::info("order-api: {} {} -> {} in {:.1f} ms (tenant {}, operation {}, attempt {})",
               std::string(req.method_string()), std::string(path), res.result_int(),
               static_cast<double>(elapsed.count()) / 1000.0,
               std::string(single_header(req, "X-Tenant-Id").value_or("-")),
               op ? std::string(op->substr(0, 12)) : std::string("-"),
               std::string(single_header(req, "X-Idempotency-Attempt").value_or("-")));
  co_return res;
}

asio::awaitable<Response> OrderApi::create(Request& req) {
  auto arrival = read_arrival(req, options_);
  if (auto* refused = std::get_if<Response>(&arrival)) co_return std::move(*refused);
  const Arrival& a = std::get<Arrival>(arrival);

  const auto type = single_header(req, "Content-Type");
  const bool form = type && has_media_type(*type, "application/x-www-form-urlencoded");
  const bool protobuf = type && has_media_type(*type, "application/x-protobuf");
  if (type && !is_json(*type) && !form && !protobuf) {
    co_return problem(req, http::status::unsupported_media_type, "unsupported_media_type",
                      "Unsupported media type",
                      "send the order as application/json, application/x-www-form-urlencoded "
                      "or application/x-protobuf");
  }
  auto parsed = form       ? parse_order_form(req.body())
                : protobuf ? parse_order_protobuf(req.body())
                           : parse_order_request(req.body());
  if (auto* refused = std::get_if<Rejection>(&parsed)) co_return rejection(req, *refused);
  const OrderRequest& order = std::get<OrderRequest>(parsed);

  // Runtime faults are taken before any await, so that concurrent requests each see
  // their own share of fail_next and fail_every.
  const Faults faults = faults_;
  bool fail = false;
  if (faults_.fail_next > 0) {
    --faults_.fail_next;
    fail = true;
  }
  if (faults_.fail_every > 0 && ++fail_counter_ % static_cast<unsigned>(faults_.fail_every) == 0) {
    fail = true;
  }
  const auto injected = [&](std::string_view when) {
    spdlog::warn("order-api: fault injection: failing operation {} with {} {} its commit",
                 short_id(a.operation_id), faults.fail_status, when);
    Response res = problem(req, static_cast<http::status>(faults.fail_status), "injected_fault",
                           "Injected fault", "fault injection: failed " + std::string(when) +
                                                 " the commit");
    res.set(http::field::retry_after, "1");
    return res;
  };
  if (options_.record_arrivals && a.operation_id) {
    // Parameters are views: the texts they point at must outlive the call.
    const std::string attempt = std::to_string(a.attempt);
    const std::string token = a.fencing_token ? std::to_string(*a.fencing_token) : "";
    std::vector<pg::Param> params{
        pg::Param::text(a.tenant), pg::Param::text(*a.operation_id), pg::Param::text(attempt),
        a.fencing_token ? pg::Param::text(token) : pg::Param::null_value()};
    auto recorded = co_await pool_->execute(kRecordArrival, std::move(params));
    if (!recorded) co_return unavailable(req, *pool_, recorded.error());
  }
  if (faults.delay > Millis::zero() && !faults.delay_after_commit) {
    co_await sleep_for(faults.delay);
  }
  if (fail && !faults.fail_after_commit) co_return injected("before");

  if (a.demo_delay > Millis::zero()) co_await sleep_for(a.demo_delay);
  // The long operation of the reference backend: an order of a SLOW-… item.
  const bool slow = std::any_of(order.items.begin(), order.items.end(),
                                [](const auto& item) { return item.sku.starts_with("SLOW-"); });
  if (slow) co_await sleep_for(options_.slow_order_time);
  Response res = co_await create_or_find(req, a, order);
  if (res.result() == http::status::created) {
    // The order is committed (made now or found); what follows strikes its answer only.
    if (faults.delay > Millis::zero() && faults.delay_after_commit) {
      co_await sleep_for(faults.delay);
    }
    if (fail) co_return injected("after");
  }
  co_return res;
}

// The order of this operation: found (an earlier attempt made it) or created now, or the
// refusal that the body, the coupon or the checkout earns.
asio::awaitable<Response> OrderApi::create_or_find(Request& req, const Arrival& a,
                                                   const OrderRequest& order) {
  // Does this operation already have its order? Before any time- or data-dependent rule,
  // so that a retry after a lost answer gets the order, not a rule that changed since.
  if (a.operation_id) {
    auto existing = co_await find_operation(*pool_, a);
    if (!existing) co_return unavailable(req, *pool_, existing.error());
    if (*existing) co_return co_await answer_existing(*pool_, options_, req, a, order, **existing);
  }

  std::int64_t discount = 0;
  if (order.coupon) {
    std::vector<pg::Param> params{pg::Param::text(*order.coupon)};
    auto coupon = co_await pool_->execute(kCoupon, std::move(params));
    if (!coupon) co_return unavailable(req, *pool_, coupon.error());
    if (coupon->rows() == 0) {
      co_return business_rejection(req, http::status::unprocessable_entity, "coupon_unknown", "Unknown coupon",
                        "no coupon with this code exists");
    }
    const auto percent = coupon->int64(0, 0);
    const auto expired = coupon->boolean(0, 1);
    if (!percent || !expired) {
      co_return unavailable(req, *pool_, make_error_code(pg::errc::protocol));
    }
    if (*expired) {
      co_return business_rejection(req, http::status::unprocessable_entity, "coupon_expired", "Coupon expired",
                        "the coupon " + *order.coupon + " has expired");
    }
    discount = order.amount * *percent / 100;
  }

  const std::string retention = std::to_string(options_.operation_retention.count());
  const std::string attempt = std::to_string(a.attempt);
  const std::string amount = std::to_string(order.amount);
  const std::string discount_text = std::to_string(discount);
  const std::string items = items_json(order.items);
  const bool fail_before_commit = a.fault == Arrival::Fault::rollback;
  // completion: backend: the order, its event and the idempotency record in one statement.
  const bool record = a.record.has_value() && !fail_before_commit;
  static const std::string create_recorded = create_recorded_sql();

  // Two rounds at most: a conflict whose row is gone by the time we look (its operation
  // retired in between) is retried once; anything stranger is reported as unavailable.
  for (int round = 0; round < 2; ++round) {
    std::vector<pg::Param> params{pg::Param::text(a.tenant),
                                  optional_param(a.operation_id),
                                  pg::Param::text(retention),
                                  pg::Param::text(attempt),
                                  optional_param(order.checkout_id),
                                  pg::Param::text(order.customer_id),
                                  pg::Param::text(order.currency),
                                  pg::Param::text(amount),
                                  pg::Param::text(discount_text),
                                  optional_param(order.coupon),
                                  pg::Param::text(items),
                                  optional_param(a.record_expires)};
    if (record) params.push_back(pg::Param::text(*a.record));
    // Two statements, not one conditional co_await: GCC 12 mishandles the temporaries of
    // a co_await inside a conditional expression.
    result<pg::Result> inserted = make_error_code(pg::errc::protocol);
    if (record) {
      inserted = co_await pool_->query(create_recorded, std::move(params));
    } else {
      const char* statement = fail_before_commit ? kCreateOrderThenFail : kCreateOrder;
      inserted = co_await pool_->execute(statement, std::move(params));
    }
    if (!inserted) {
      // A newer attempt owns the record: the whole statement, order and event included,
      // rolled back.
      if (record && pg::sqlstate(inserted.error()) == kFencedSqlstate) co_return superseded(req, a);
      if (fail_before_commit && pg::sqlstate(inserted.error()) == kInjectedFailureSqlstate) {
        spdlog::warn("order-api: fault injection: the order was written and rolled back");
        co_return problem(req, http::status::internal_server_error, "injected_fault",
                          "Injected fault", "fault injection: rolled back before commit");
      }
      co_return unavailable(req, *pool_, inserted.error());
    }

    if (inserted->rows() == 1) {
      auto row = decode_order(*inserted, 0, record ? 1 : 0);
      if (!row) co_return unavailable(req, *pool_, make_error_code(pg::errc::protocol));
      const std::string digest = record ? std::string(inserted->value(0, 14)) : std::string();
      // Committed. Faults that strike between the commit and the answer:
      if (a.fault == Arrival::Fault::crash_after_commit) {
        spdlog::warn("order-api: fault injection: crashing after the commit of order {}",
                     row->order_id);
        spdlog::default_logger()->flush();
        std::_Exit(kCrashExitCode);
      }
      if (a.fault == Arrival::Fault::delay_after_commit) {
        co_await sleep_for(a.fault_delay);
      }
      co_return created(req, *row, digest);
    }

    // Lost a uniqueness race. The operation first: a concurrent attempt of the same
    // operation made the order (only possible around a takeover).
    if (a.operation_id) {
      auto existing = co_await find_operation(*pool_, a);
      if (!existing) co_return unavailable(req, *pool_, existing.error());
      if (*existing) co_return co_await answer_existing(*pool_, options_, req, a, order, **existing);
    }
    if (order.checkout_id) {
      std::vector<pg::Param> by_checkout{pg::Param::text(a.tenant),
                                         pg::Param::text(*order.checkout_id)};
      auto other = co_await pool_->execute(kOrderByCheckout, std::move(by_checkout));
      if (!other) co_return unavailable(req, *pool_, other.error());
      if (other->rows() == 1) {
        const std::string existing_id(other->value(0, 0));
        json::object extra{{"order_id", existing_id}, {"checkout_id", *order.checkout_id}};
        co_return business_rejection(req, http::status::conflict, "checkout_already_ordered",
                          "Checkout already ordered",
                          "checkout " + *order.checkout_id + " already has order " + existing_id +
                              "; a checkout is ordered at most once",
                          std::move(extra));
      }
    }
  }
  co_return unavailable(req, *pool_, make_error_code(pg::errc::protocol));
}

// GET shows the switches, PUT replaces them all (an empty object turns everything off).
Response OrderApi::faults(Request& req) {
  if (req.method() == http::verb::put) {
    boost::system::error_code ec;
    const json::value doc = json::parse(req.body(), ec);
    const auto* o = ec ? nullptr : doc.if_object();
    const auto count = [&](std::string_view name, std::int64_t max) -> std::optional<std::int64_t> {
      const auto* v = o->if_contains(name);
      if (v == nullptr) return 0;
      if (!v->is_int64() || v->get_int64() < 0 || v->get_int64() > max) return std::nullopt;
      return v->get_int64();
    };
    const auto mode = [&](std::string_view name) -> std::optional<bool> {  // after commit?
      const auto* v = o->if_contains(name);
      if (v == nullptr) return false;
      if (!v->is_string()) return std::nullopt;
      if (v->get_string() == "before_commit") return false;
      if (v->get_string() == "after_commit") return true;
      return std::nullopt;
    };
    std::optional<std::int64_t> fail_next, fail_every, status, delay;
    std::optional<bool> fail_after, delay_after;
    if (o != nullptr) {
      fail_next = count("fail_next", 1'000'000);
      fail_every = count("fail_every", 1'000'000);
      status = o->contains("fail_status") ? count("fail_status", 599) : 503;
      delay = count("delay_ms", 60'000);
      fail_after = mode("fail_mode");
      delay_after = mode("delay_mode");
    }
    if (!fail_next || !fail_every || !status || *status < 400 || !delay || !fail_after ||
        !delay_after) {
      return problem(req, http::status::bad_request, "invalid_request", "Invalid faults",
                     "a JSON object: fail_next >= 0, fail_every >= 0, fail_mode and delay_mode "
                     "before_commit|after_commit, fail_status 400-599, delay_ms 0-60000");
    }
    faults_ = Faults{.fail_next = static_cast<int>(*fail_next),
                     .fail_every = static_cast<int>(*fail_every),
                     .fail_after_commit = *fail_after,
                     .fail_status = static_cast<unsigned>(*status),
                     .delay = Millis(*delay),
                     .delay_after_commit = *delay_after};
    fail_counter_ = 0;
    spdlog::warn("order-api: fault injection: fail_next {}, fail_every {} ({} commit, status {}), "
                 "delay {} ms ({} commit)",
                 faults_.fail_next, faults_.fail_every, faults_.fail_after_commit ? "after" : "before",
                 faults_.fail_status, faults_.delay.count(),
                 faults_.delay_after_commit ? "after" : "before");
  }
  const auto when = [](bool after) { return after ? "after_commit" : "before_commit"; };
  return json_response(req, http::status::ok,
                       json::object{{"fail_next", faults_.fail_next},
                                    {"fail_every", faults_.fail_every},
                                    {"fail_mode", when(faults_.fail_after_commit)},
                                    {"fail_status", faults_.fail_status},
                                    {"delay_ms", faults_.delay.count()},
                                    {"delay_mode", when(faults_.delay_after_commit)}});
}

asio::awaitable<Response> OrderApi::get(Request& req, std::string_view id) {
  bool repeated = false;
  const auto tenant = single_header(req, "X-Tenant-Id", &repeated);
  if (!tenant || repeated || !is_token(*tenant, 255)) {
    co_return problem(req, http::status::unauthorized, "tenant_missing", "Tenant missing",
                      "X-Tenant-Id must be set once, to 1-255 visible ASCII characters");
  }
  // Another tenant's order and no order at all answer the same: existence is not leaked.
  const auto not_found = [&] {
    return problem(req, http::status::not_found, "order_not_found", "Order not found",
                   "no order with this id for this tenant");
  };
  if (!is_uuid(id)) co_return not_found();
  const std::string order_id(id);
  const std::string tenant_id(*tenant);
  std::vector<pg::Param> params{pg::Param::text(order_id), pg::Param::text(tenant_id)};
  auto r = co_await pool_->execute(kOrderById, std::move(params));
  if (!r) co_return unavailable(req, *pool_, r.error());
  if (r->rows() == 0) co_return not_found();
  auto row = decode_order(*r, 0, 1);
  const auto delivered = r->boolean(0, 14);
  if (!row || !delivered) co_return unavailable(req, *pool_, make_error_code(pg::errc::protocol));
  // An authenticating layer in front may name the customer a request acts for: then only
  // that customer's orders are readable (what a re-fetched replay is re-authorized by).
  repeated = false;
  if (const auto customer = single_header(req, "X-Customer-Id", &repeated);
      repeated || (customer && *customer != row->customer_id)) {
    co_return problem(req, http::status::forbidden, "order_forbidden", "Order forbidden",
                      "this order belongs to another customer");
  }
  if (*delivered) {
    // The body names its status once, as this exact member (strings in it are escaped).
    constexpr std::string_view created = R"("status":"created")";
    if (const auto at = row->body.find(created); at != std::string::npos) {
      row->body.replace(at, created.size(), R"("status":"confirmed")");
    }
  }
  co_return order_response(req, http::status::ok, *row);
}

// GET /orders/by-operation/{operation_id}: the reconciliation lookup (the sidecar's
// on_unknown_outcome: reconcile). Found, it answers exactly what the create answered (201,
// Location, the order's bytes), which the sidecar records as the operation's answer; the
// asking attempt becomes the order's attempt, so an older attempt still in flight finds a
// newer one ahead of it. Not found (or another tenant's): 404, nothing written.
asio::awaitable<Response> OrderApi::by_operation(Request& req, std::string_view operation_id) {
  auto arrival = read_arrival(req, options_);
  if (auto* refused = std::get_if<Response>(&arrival)) co_return std::move(*refused);
  Arrival a = std::get<Arrival>(std::move(arrival));
  const auto not_found = [&] {
    return problem(req, http::status::not_found, "operation_not_found", "Operation not found",
                   "no order of this tenant was made by this operation");
  };
  if (operation_id.size() != 64 || !text::is_lower_hex(operation_id)) co_return not_found();
  // The sidecar names the operation in its headers too; a lookup may only ask for its own.
  if (a.operation_id && *a.operation_id != operation_id) co_return not_found();
  a.operation_id = std::string(operation_id);
  auto existing = co_await find_operation(*pool_, a);
  if (!existing) co_return unavailable(req, *pool_, existing.error());
  if (!*existing) co_return not_found();
  const OrderRow& row = **existing;
  if (a.attempt > row.attempt) {
    const std::string attempt = std::to_string(a.attempt);
    const std::string retention = std::to_string(options_.operation_retention.count());
    std::vector<pg::Param> params{pg::Param::text(a.tenant), pg::Param::text(*a.operation_id),
                                  pg::Param::text(attempt), pg::Param::text(retention),
                                  optional_param(a.record_expires)};
    auto updated = co_await pool_->execute(kRecordAttempt, std::move(params));
    if (!updated) co_return unavailable(req, *pool_, updated.error());
  }
  spdlog::info("order-api: reconciliation of operation {} (attempt {}) found order {}",
               short_id(a.operation_id), a.attempt, row.order_id);
  co_return created(req, row);
}

}  // namespace idem::demo
