#pragma once
// The admin listener's request handler (served by its own server::Server on its own port):
//
//   GET /healthz                                   the process is alive (200, no I/O)
//   GET /readyz                                    store reachable and schema current (200),
//                                                  otherwise 503 with a JSON reason
//   GET /metrics                                   Prometheus text format 0.0.4
//   GET    /admin/records/{tenant}/{scope}/{key}   one record's state, never its body
//   DELETE /admin/records/{tenant}/{scope}/{key}   purges that record (204; 404 if absent)
//
// Path parts are percent-decoded one segment at a time, so a scope such as "POST /orders"
// travels as "POST%20%2Forders". /admin/... needs `Authorization: Bearer <admin.token>`, or,
// when the token is empty, a loopback client; the probes and /metrics are open, as load
// balancers and Prometheus expect.
//
// Threading: like the gateway, a Handler lives on one event loop (the Store it is given
// belongs to that loop); only set_draining() may be called from another thread.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/types.hpp"
#include "observability/metrics.hpp"
#include "server/server.hpp"
#include "store/store.hpp"

namespace idem::pg {
class Pool;
}

namespace idem::admin {

struct Readiness {
  bool ready = false;
  // Stable, machine-readable: ready | schema_newer_compatible (both ready) | draining |
  // store_unavailable | store_timeout | store_busy | store_error | schema_behind |
  // schema_incompatible | schema_mismatch
  std::string reason;
  std::string detail;  // for people; never holds a connection string or a password
};

// Answers "can this process serve protected requests now?". Must bound its own duration.
using ReadinessProbe = std::function<asio::awaitable<Readiness>()>;

struct Dependencies {
  // Record lookups, purges, the in-progress gauge. With the replay cache in front of it
  // (gateway::CachingStore), a purge also forgets the record in this process.
  store::Store* store = nullptr;
  obs::Metrics* metrics = nullptr;
  ReadinessProbe readiness;        // empty: /readyz only reflects draining
  // admin.token as configured now; "" = loopback clients only. Called per request, so a
  // reload rotates the token without a restart.
  std::function<std::string()> token;
  // Bound on each store call the handler makes (record calls, the scrape-time sample).
  Millis store_deadline{1000};
};

class Handler {
 public:
  explicit Handler(Dependencies deps);
  ~Handler();
  Handler(const Handler&) = delete;
  Handler& operator=(const Handler&) = delete;

  // The server::Handler. Never throws for expected conditions.
  asio::awaitable<server::Response> handle(server::Request& request,
                                           const server::RequestContext& context);

  // From SIGTERM on, /readyz answers 503 "draining" so load balancers stop routing here
  // while in-flight requests finish. Thread-safe.
  void set_draining() noexcept;

 private:
  asio::awaitable<server::Response> readyz(const server::Request& request);
  asio::awaitable<server::Response> metrics(const server::Request& request);
  asio::awaitable<server::Response> records(const server::Request& request,
                                            const server::RequestContext& context,
                                            std::string_view rest);
  asio::awaitable<void> sample_in_progress_oldest();

  Dependencies deps_;
  std::atomic<bool> draining_{false};
  bool sampling_ = false;  // a scrape-time sample is in flight (event-loop thread only)
};

// Readiness against PostgreSQL: runs store::kSchemaQuery on `pool` and compares the
// applied migrations with the embedded ones, all within `deadline` (the call is cancelled
// when it passes; the pool then discards that connection). On a newer schema that allows
// this binary it is ready (reason "schema_newer_compatible"), logs that once and sets
// idemproxy_schema_newer_compatible; `metrics` may be null.
ReadinessProbe pg_readiness(std::shared_ptr<pg::Pool> pool, Millis deadline, obs::Metrics* metrics);

// Runs `op` with a deadline: nullopt if the deadline passed first. The loser is cancelled
// through its cancellation slot and awaited before this returns, so nothing `op`
// references is used after the caller resumes. T must be default-constructible.
template <class T>
asio::awaitable<std::optional<T>> within(Millis deadline, asio::awaitable<T> op) {
  using namespace asio::experimental::awaitable_operators;
  asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
  // Everything named: GCC 12 mishandles temporaries built inside a co_await expression.
  auto expiry = timer.async_wait(asio::use_awaitable);
  auto race = std::move(op) || std::move(expiry);
  auto first = co_await std::move(race);
  if (first.index() == 0) co_return std::optional<T>(std::move(std::get<0>(first)));
  co_return std::nullopt;
}

namespace detail {

// RFC 3986 percent-decoding of one path segment. '+' stays '+' (it means space only in
// forms). nullopt on a malformed escape or a decoded NUL, which no record key can hold.
std::optional<std::string> percent_decode(std::string_view segment);

struct RecordPath {
  std::string tenant;
  std::string scope;
  std::string key;
};

// "{tenant}/{scope}/{key}" (what follows /admin/records/): exactly three non-empty
// segments, each decoded. nullopt otherwise.
std::optional<RecordPath> parse_record_path(std::string_view rest);

// Constant-time in the length and content of both strings (compares their SHA-256).
bool token_equals(std::string_view presented, std::string_view expected);

// The token of "Authorization: Bearer <token>" (scheme case-insensitive), or nullopt.
std::optional<std::string_view> bearer_token(std::string_view authorization);

bool is_loopback(const asio::ip::address& address);

}  // namespace detail
}  // namespace idem::admin
