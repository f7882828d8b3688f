#include "relay.hpp"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <spdlog/spdlog.h>

#include "upstream/client.hpp"

namespace idem::demo {
namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

constexpr const char* kClaim = "relay_claim";
constexpr const char* kDelivered = "relay_delivered";
constexpr const char* kRetryLater = "relay_retry_later";
constexpr const char* kDead = "relay_dead";

// SKIP LOCKED makes concurrent relays take disjoint batches without waiting on each
// other; the lease set here outlives this statement's transaction, so the claim holds
// while the events are delivered, and lapses by itself if this relay dies.
constexpr const char* kClaimSql = R"sql(
UPDATE demo_orders.outbox
SET claimed_until = now() + $1::bigint * interval '1 millisecond',
    attempts = attempts + 1
WHERE event_id IN (
  SELECT event_id FROM demo_orders.outbox
  WHERE delivered_at IS NULL AND dead_at IS NULL
    AND available_at <= now()
    AND (claimed_until IS NULL OR claimed_until <= now())
  ORDER BY available_at
  LIMIT $2::bigint
  FOR UPDATE SKIP LOCKED)
RETURNING event_id::text, tenant_id, event_type, payload::text, attempts)sql";

// "delivered_at IS NULL": if our lease lapsed and another relay finished the event first,
// its mark stands; ours changes nothing.
constexpr const char* kDeliveredSql = R"sql(
UPDATE demo_orders.outbox
SET delivered_at = now(), claimed_until = NULL, last_error = NULL
WHERE event_id = $1::uuid AND delivered_at IS NULL)sql";

constexpr const char* kRetryLaterSql = R"sql(
UPDATE demo_orders.outbox
SET claimed_until = NULL,
    available_at = now() + $2::bigint * interval '1 millisecond',
    last_error = $3
WHERE event_id = $1::uuid AND delivered_at IS NULL)sql";

constexpr const char* kDeadSql = R"sql(
UPDATE demo_orders.outbox
SET dead_at = now(), claimed_until = NULL, last_error = $2
WHERE event_id = $1::uuid AND delivered_at IS NULL)sql";

struct Event {
  std::string id;
  std::string tenant;
  std::string type;
  std::string payload;
  std::int64_t attempts = 0;
};

// One HTTP call an event asks for.
struct Delivery {
  upstream::Pool* target = nullptr;
  std::string path;
  std::string key;
  std::string body;
};

enum class Verdict { delivered, retry, permanent };

struct DeliveryResult {
  Verdict verdict = Verdict::delivered;
  std::string error;  // for last_error and the log
};

// What an answer means for the event: only an answer that retrying cannot change is
// permanent. 408 and 429 say "later"; 5xx may be transient; no answer at all is unknown,
// so the effect may or may not have happened, and retrying with the same key is safe.
DeliveryResult judge(const upstream::Outcome& outcome, const std::string& what) {
  if (outcome.failure != upstream::Failure::none) {
    return {Verdict::retry, what + ": " + upstream::to_string(outcome.failure)};
  }
  const unsigned status = outcome.response.result_int();
  if (status >= 200 && status < 300) return {Verdict::delivered, {}};
  const std::string error = what + ": HTTP " + std::to_string(status);
  if (status >= 500 || status == 408 || status == 429) return {Verdict::retry, error};
  return {Verdict::permanent, error + " " + outcome.response.body().substr(0, 200)};
}

upstream::PoolOptions pool_options(const HttpUrl& url, const RelayOptions& options) {
  upstream::PoolOptions o;
  o.host = url.host;
  o.port = url.port;
  o.connect_timeout = std::min(options.request_timeout, Millis(2'000));
  o.response_timeout = options.request_timeout;
  o.max_response_body = 1 << 20;
  o.max_idle = 8;
  return o;
}

}  // namespace

struct Relay::Impl : std::enable_shared_from_this<Impl> {
  asio::any_io_executor executor;
  std::shared_ptr<pg::Pool> db;
  RelayOptions options;
  upstream::Pool payments;
  upstream::Pool inventory;
  asio::steady_timer idle;
  bool stopping = false;
  bool stopped = false;

  Impl(asio::any_io_executor ex, std::shared_ptr<pg::Pool> pool, RelayOptions o)
      : executor(ex),
        db(std::move(pool)),
        options(std::move(o)),
        payments(ex, pool_options(options.payments, options)),
        inventory(ex, pool_options(options.inventory, options)),
        idle(ex) {}

  static asio::awaitable<void> run_owned(std::shared_ptr<Impl> self) {
    co_await self->run();  // the frame holds `self`: the relay outlives its loop
  }

  asio::awaitable<void> pause(Millis d) {
    if (stopping) co_return;
    idle.expires_after(d);
    co_await idle.async_wait(use_tuple);  // stop() cancels it
  }

  asio::awaitable<void> run() {
    spdlog::info("relay: started (batch {}, poll every {} ms, {} cop{} per delivery)",
                 options.batch, options.poll_interval.count(), options.copies_per_delivery,
                 options.copies_per_delivery == 1 ? "y" : "ies");
    while (!stopping) {
      const std::string lease = std::to_string(options.claim_lease.count());
      const std::string batch = std::to_string(options.batch);
      std::vector<pg::Param> params{pg::Param::text(lease), pg::Param::text(batch)};
      auto claimed = co_await db->execute(kClaim, std::move(params));
      if (!claimed) {
        spdlog::error("relay: claiming events failed: {} ({})", claimed.error().message(),
                      db->last_error_message());
        co_await pause(options.poll_interval);
        continue;
      }
      const int rows = claimed->rows();
      for (int i = 0; i < rows; ++i) {
        Event event;
        event.id = claimed->value(i, 0);
        event.tenant = claimed->value(i, 1);
        event.type = claimed->value(i, 2);
        event.payload = claimed->value(i, 3);
        event.attempts = claimed->int64(i, 4).value_or(1);
        // Claimed events are finished even when stopping: each is bounded by the request
        // timeouts, and releasing them half-done would only delay them by the lease.
        co_await process(event);
      }
      // A full batch suggests more are due: claim again at once.
      if (static_cast<std::size_t>(rows) < options.batch) {
        co_await pause(options.poll_interval);
      }
    }
    stopped = true;
    spdlog::info("relay: stopped");
  }

  std::optional<std::vector<Delivery>> deliveries_for(const Event& event) {
    if (event.type != "OrderCreated") return std::nullopt;
    boost::system::error_code ec;
    const json::value payload = json::parse(event.payload, ec);
    const auto* o = ec ? nullptr : payload.if_object();
    if (o == nullptr || !o->contains("order_id") || !o->at("order_id").is_string()) {
      return std::nullopt;
    }
    const std::string order_id(o->at("order_id").get_string());
    // Missing members travel as null: the service refuses them (permanently), which puts
    // a malformed event in plain sight instead of guessing values.
    const auto member = [o](std::string_view name) {
      const auto* v = o->if_contains(name);
      return v ? *v : json::value(nullptr);
    };
    json::object charge{{"order_id", order_id},
                        {"customer_id", member("customer_id")},
                        {"amount", member("total")},
                        {"currency", member("currency")}};
    json::object reservation{{"order_id", order_id}, {"items", member("items")}};
    std::vector<Delivery> out;
    out.push_back({&payments, options.payments.path_prefix + "/charges", order_id + ":charge",
                   json::serialize(charge)});
    out.push_back({&inventory, options.inventory.path_prefix + "/reservations",
                   order_id + ":reserve", json::serialize(reservation)});
    return out;
  }

  asio::awaitable<DeliveryResult> send(const Event& event, const Delivery& d) {
    upstream::Request request{http::verb::post, d.path, 11};
    request.set(http::field::content_type, "application/json");
    request.set("Idempotency-Key", d.key);
    request.set("X-Event-Id", event.id);
    request.set("X-Tenant-Id", event.tenant);
    request.body() = d.body;
    upstream::Outcome outcome = co_await d.target->send(std::move(request));
    co_return judge(outcome, "POST " + d.path + " (" + d.key + ")");
  }

  asio::awaitable<void> process(const Event& event) {
    auto deliveries = deliveries_for(event);
    if (!deliveries) {
      const std::string reason = "cannot deliver event type " + event.type + " with this payload";
      co_await mark(kDead, event, reason, std::nullopt);
      co_return;
    }
    for (const Delivery& d : *deliveries) {
      for (int copy = 0; copy < options.copies_per_delivery; ++copy) {
        DeliveryResult result = co_await send(event, d);
        if (result.verdict == Verdict::delivered) continue;
        if (result.verdict == Verdict::permanent) {
          co_await mark(kDead, event, result.error, std::nullopt);
          co_return;
        }
        // Exponential backoff from the event's attempt count, so it survives restarts.
        const auto exponent = std::clamp<std::int64_t>(event.attempts - 1, 0, 20);
        const Millis backoff =
            std::min(options.max_backoff, options.retry_backoff * (std::int64_t{1} << exponent));
        co_await mark(kRetryLater, event, result.error, backoff);
        co_return;
      }
    }
    const std::string no_error;
    co_await mark(kDelivered, event, no_error, std::nullopt);
  }

  // Records the event's fate. If this write fails the lease lapses and the event is
  // delivered again: at least once, never lost.
  asio::awaitable<void> mark(const char* statement, const Event& event, const std::string& error,
                             std::optional<Millis> backoff) {
    std::vector<pg::Param> params{pg::Param::text(event.id)};
    const std::string backoff_ms = backoff ? std::to_string(backoff->count()) : std::string();
    if (statement == kRetryLater) params.push_back(pg::Param::text(backoff_ms));
    if (statement != kDelivered) params.push_back(pg::Param::text(error));
    auto r = co_await db->execute(statement, std::move(params));
    if (!r) {
      spdlog::error("relay: recording event {} failed ({}): it will be delivered again", event.id,
                    r.error().message());
      co_return;
    }
    if (statement == kDelivered) {
      spdlog::info("relay: delivered {} {} (tenant {}, attempt {})", event.type, event.id,
                   event.tenant, event.attempts);
    } else if (statement == kRetryLater) {
      spdlog::warn("relay: {} {} failed (attempt {}): {}; retrying in {} ms", event.type, event.id,
                   event.attempts, error, backoff->count());
    } else {
      spdlog::error("relay: {} {} is dead: {}", event.type, event.id, error);
    }
  }
};

Relay::Relay(asio::any_io_executor executor, std::shared_ptr<pg::Pool> pool, RelayOptions options)
    : impl_(std::make_shared<Impl>(std::move(executor), std::move(pool), std::move(options))) {}

Relay::~Relay() { stop(); }

std::vector<pg::PreparedStatement> Relay::statements() {
  return {{kClaim, kClaimSql},
          {kDelivered, kDeliveredSql},
          {kRetryLater, kRetryLaterSql},
          {kDead, kDeadSql}};
}

void Relay::start() {
  asio::co_spawn(impl_->executor, Impl::run_owned(impl_), [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      spdlog::critical("relay: the loop failed: {}", ex.what());
    }
    // A relay that silently stopped relaying would leave every order unpaid.
    std::_Exit(1);
  });
}

void Relay::stop() {
  impl_->stopping = true;
  impl_->idle.cancel();
}

bool Relay::stopped() const { return impl_->stopped; }

}  // namespace idem::demo
