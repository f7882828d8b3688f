#include "admin/admin.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <array>
#include <chrono>
#include <ctime>

#include <boost/beast/core/string.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/text.hpp"
#include "common/time_text.hpp"
#include "idempotency/fingerprint.hpp"

namespace idem::admin {
namespace {

using obs::StoreOp;
namespace json = boost::json;

// Enough to tell records apart by eye and match them across replicas' views, too short to
// be useful to anyone trying to reproduce a request.
constexpr std::size_t kFingerprintPrefix = 16;

double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// Admin answers describe live state: no intermediary or client should reuse one.
void no_store(server::Response& res) { res.set(http::field::cache_control, "no-store"); }

server::Response json_response(const server::Request& req, http::status status,
                               const json::value& body) {
  server::Response res{status, req.version()};
  res.set(http::field::content_type, "application/json");
  no_store(res);
  res.body() = json::serialize(body);
  res.body() += '\n';
  res.keep_alive(req.keep_alive());
  return res;
}

server::Response problem(const server::Request& req, http::status status, std::string_view code,
                         std::string_view title, std::string_view detail) {
  auto res = server::make_problem(status, code, title, detail, req.version(), req.keep_alive());
  no_store(res);
  return res;
}

server::Response not_found(const server::Request& req) {
  return problem(req, http::status::not_found, "not_found", "Not Found",
                 "the admin listener serves /healthz, /readyz, /metrics and "
                 "/admin/records/{tenant}/{scope}/{key}");
}

server::Response method_not_allowed(const server::Request& req, std::string_view allow) {
  auto res = problem(req, http::status::method_not_allowed, "method_not_allowed",
                     "Method Not Allowed", "allowed here: " + std::string(allow));
  res.set(http::field::allow, allow);
  return res;
}

server::Response store_failed(const server::Request& req, std::string_view what) {
  auto res = problem(req, http::status::service_unavailable, "idempotency_store_unavailable",
                     "Idempotency store unavailable", what);
  res.set(http::field::retry_after, "1");
  return res;
}

bool is_read(http::verb m) { return m == http::verb::get || m == http::verb::head; }

json::value timestamp_or_null(std::int64_t epoch_us) {
  if (epoch_us == 0) return nullptr;
  return json::value(rfc3339_from_us(epoch_us));
}

// What an operator may see of a record: its state and timing, never the stored body or
// the values of stored headers (they may carry customer data or credentials).
json::object describe(const store::RecordId& id, const store::Record& rec) {
  json::object o;
  o["tenant"] = id.tenant;
  o["scope"] = id.endpoint;
  o["key"] = id.key;
  o["key_hash"] = idempotency::log_hash(id.tenant, id.key);  // as in the access log
  o["state"] = rec.state == store::State::completed ? "completed" : "in_progress";
  o["attempt"] = rec.attempt;
  o["fencing_token"] = rec.fence;
  o["created_at"] = timestamp_or_null(rec.created_at_us);
  o["completed_at"] = timestamp_or_null(rec.completed_at_us);
  o["expires_at"] = timestamp_or_null(rec.expires_at_us);
  o["lease_expires_at"] = timestamp_or_null(rec.lease_expires_at_us);
  o["lease_expired"] = rec.state == store::State::in_progress && rec.lease_expired;
  o["expired"] = rec.expired;
  o["fingerprint_prefix"] = rec.fingerprint.substr(0, kFingerprintPrefix);
  o["principal_bound"] = !rec.principal.empty();
  if (rec.response) {
    const auto& r = *rec.response;
    o["response_status"] = r.status;
    o["response_body_bytes"] = r.body.size();
    o["response_body_omitted"] = r.body_omitted;
    json::array names;
    for (const auto& h : r.headers) names.emplace_back(h.name);
    o["replay_header_names"] = std::move(names);
    if (r.trace_id.empty()) {
      o["trace_id"] = nullptr;
    } else {
      o["trace_id"] = r.trace_id;
    }
  } else {
    o["response_status"] = nullptr;
    o["response_body_bytes"] = nullptr;
    o["response_body_omitted"] = false;
    o["replay_header_names"] = json::array();
    o["trace_id"] = nullptr;
  }
  return o;
}

std::string peer_text(const server::RequestContext& ctx) {
  return ctx.peer.address().to_string();
}

}  // namespace

// ---------------------------------------------------------------------------------------
// detail

namespace detail {

std::optional<std::string> percent_decode(std::string_view segment) {
  std::string out;
  out.reserve(segment.size());
  for (std::size_t i = 0; i < segment.size(); ++i) {
    char c = segment[i];
    if (c == '%') {
      const int byte = text::percent_byte(segment, i);
      if (byte < 0) return std::nullopt;
      c = static_cast<char>(byte);
      i += 2;
    }
    if (c == '\0') return std::nullopt;
    out += c;
  }
  return out;
}

std::optional<RecordPath> parse_record_path(std::string_view rest) {
  std::array<std::string, 3> parts;
  std::size_t n = 0;
  std::size_t start = 0;
  for (;;) {
    const auto slash = rest.find('/', start);
    const auto raw = rest.substr(start, slash == std::string_view::npos ? slash : slash - start);
    if (raw.empty() || n == parts.size()) return std::nullopt;
    auto decoded = percent_decode(raw);
    if (!decoded || decoded->empty()) return std::nullopt;
    parts[n++] = std::move(*decoded);
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  if (n != parts.size()) return std::nullopt;
  return RecordPath{std::move(parts[0]), std::move(parts[1]), std::move(parts[2])};
}

bool token_equals(std::string_view presented, std::string_view expected) {
  // Hashing first makes the comparison independent of both lengths: CRYPTO_memcmp is
  // constant-time only over equal-length inputs, and an early length check would leak
  // the token's length.
  unsigned char a[EVP_MAX_MD_SIZE];
  unsigned char b[EVP_MAX_MD_SIZE];
  unsigned int la = 0;
  unsigned int lb = 0;
  if (EVP_Digest(presented.data(), presented.size(), a, &la, EVP_sha256(), nullptr) != 1 ||
      EVP_Digest(expected.data(), expected.size(), b, &lb, EVP_sha256(), nullptr) != 1 ||
      la != lb) {
    return false;
  }
  return CRYPTO_memcmp(a, b, la) == 0;
}

std::optional<std::string_view> bearer_token(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer";
  while (!authorization.empty() && authorization.front() == ' ') authorization.remove_prefix(1);
  if (authorization.size() <= kScheme.size() ||
      !beast::iequals(authorization.substr(0, kScheme.size()), kScheme) ||
      authorization[kScheme.size()] != ' ') {
    return std::nullopt;
  }
  auto token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
  if (token.empty()) return std::nullopt;
  return token;
}

bool is_loopback(const asio::ip::address& address) {
  if (address.is_v6()) {
    const auto v6 = address.to_v6();
    // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d.
    if (v6.is_v4_mapped()) {
      return asio::ip::make_address_v4(asio::ip::v4_mapped, v6).is_loopback();
    }
    return v6.is_loopback();
  }
  return address.is_loopback();
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Handler

Handler::Handler(Dependencies deps) : deps_(std::move(deps)) {}
Handler::~Handler() = default;

void Handler::set_draining() noexcept { draining_.store(true, std::memory_order_relaxed); }

asio::awaitable<server::Response> Handler::handle(server::Request& request,
                                                  const server::RequestContext& context) {
  const std::string_view target = request.target();
  const std::string_view path = target.substr(0, target.find('?'));
  const auto method = request.method();

  if (path == "/healthz") {
    // Liveness only: no I/O, so a slow database never gets a healthy process restarted.
    if (!is_read(method)) co_return method_not_allowed(request, "GET, HEAD");
    co_return json_response(request, http::status::ok, json::object{{"status", "alive"}});
  }
  if (path == "/readyz") {
    if (!is_read(method)) co_return method_not_allowed(request, "GET, HEAD");
    co_return co_await readyz(request);
  }
  if (path == "/metrics") {
    if (!is_read(method)) co_return method_not_allowed(request, "GET, HEAD");
    co_return co_await metrics(request);
  }
  if (path == "/admin" || path.starts_with("/admin/")) {
    // Authorization comes before routing, so the API's shape is not revealed to a client
    // that may not use it.
    const std::string token = deps_.token ? deps_.token() : std::string();
    if (token.empty()) {
      if (!detail::is_loopback(context.peer.address())) {
        spdlog::warn("admin: refused a request from {}: admin.token is empty, loopback only",
                     peer_text(context));
        co_return problem(request, http::status::forbidden, "admin_forbidden", "Forbidden",
                          "admin.token is not set, so /admin/ answers loopback clients only");
      }
    } else {
      std::optional<std::string_view> presented;
      if (request.count(http::field::authorization) == 1) {
        presented = detail::bearer_token(request[http::field::authorization]);
      }
      if (!presented || !detail::token_equals(*presented, token)) {
        spdlog::warn("admin: refused a request from {}: {}", peer_text(context),
                     presented ? "wrong bearer token" : "no bearer token");
        auto res = problem(request, http::status::unauthorized, "admin_unauthorized",
                           "Unauthorized", "send Authorization: Bearer <admin.token>");
        res.set(http::field::www_authenticate, "Bearer realm=\"idemproxy-admin\"");
        co_return res;
      }
    }
    constexpr std::string_view kRecords = "/admin/records/";
    if (path.starts_with(kRecords)) {
      co_return co_await records(request, context, path.substr(kRecords.size()));
    }
  }
  co_return not_found(request);
}

asio::awaitable<server::Response> Handler::readyz(const server::Request& request) {
  Readiness r;
  if (draining_.load(std::memory_order_relaxed)) {
    r.reason = "draining";
    r.detail = "shutting down: no new connections, in-flight requests are finishing";
  } else if (deps_.readiness) {
    r = co_await deps_.readiness();
  } else {
    r.ready = true;
    r.reason = "ready";
  }
  if (r.ready && r.detail.empty()) {
    co_return json_response(request, http::status::ok, json::object{{"status", "ready"}});
  }
  if (r.ready) {
    co_return json_response(request, http::status::ok,
                            json::object{{"status", "ready"}, {"reason", r.reason}, {"detail", r.detail}});
  }
  co_return json_response(
      request, http::status::service_unavailable,
      json::object{{"status", "not_ready"}, {"reason", r.reason}, {"detail", r.detail}});
}

asio::awaitable<void> Handler::sample_in_progress_oldest() {
  // The gauge is also refreshed by the retention task, but only once per cleanup
  // interval; sampling here keeps it as fresh as the scrape. One sample at a time: a
  // second concurrent scrape renders the value the first one is about to replace.
  if (sampling_ || deps_.store == nullptr) co_return;
  sampling_ = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{sampling_};

  auto op = deps_.store->oldest_in_progress_age();
  auto r = co_await within(deps_.store_deadline, std::move(op));
  if (!r) {
    deps_.metrics->store_error("timeout");
    co_return;
  }
  if (!*r) {
    deps_.metrics->store_error(obs::store_error_kind(r->error()));
    co_return;
  }
  const auto& age = r->value();
  deps_.metrics->set_in_progress_oldest(age ? std::chrono::duration<double>(*age).count() : 0.0);
}

asio::awaitable<server::Response> Handler::metrics(const server::Request& request) {
  co_await sample_in_progress_oldest();
  server::Response res{http::status::ok, request.version()};
  res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
  no_store(res);
  res.body() = deps_.metrics->render_prometheus();
  res.keep_alive(request.keep_alive());
  co_return res;
}

asio::awaitable<server::Response> Handler::records(const server::Request& request,
                                                   const server::RequestContext& context,
                                                   std::string_view rest) {
  const auto method = request.method();
  if (!is_read(method) && method != http::verb::delete_) {
    co_return method_not_allowed(request, "GET, HEAD, DELETE");
  }
  auto parsed = detail::parse_record_path(rest);
  if (!parsed) {
    co_return problem(request, http::status::bad_request, "admin_bad_path", "Bad Request",
                      "expected /admin/records/{tenant}/{scope}/{key}, each part non-empty and "
                      "percent-encoded (a scope such as \"POST /orders\" is POST%20%2Forders)");
  }
  const store::RecordId id{std::move(parsed->tenant), std::move(parsed->scope),
                           std::move(parsed->key)};
  const auto t0 = SteadyClock::now();

  if (is_read(method)) {
    auto op = deps_.store->read(id);
    auto r = co_await within(deps_.store_deadline, std::move(op));
    deps_.metrics->store_duration(StoreOp::read, seconds_since(t0));
    if (!r || !*r) {
      deps_.metrics->store_error(r ? obs::store_error_kind(r->error()) : "timeout");
      co_return store_failed(request, "the record could not be read; retry shortly");
    }
    const auto& row = r->value();
    if (!row) {
      co_return problem(request, http::status::not_found, "record_not_found", "Record not found",
                        "no record with this tenant, scope and key");
    }
    co_return json_response(request, http::status::ok, describe(id, *row));
  }

  auto op = deps_.store->purge(id);
  auto r = co_await within(deps_.store_deadline, std::move(op));
  deps_.metrics->store_duration(StoreOp::purge, seconds_since(t0));
  if (!r || !*r) {
    deps_.metrics->store_error(r ? obs::store_error_kind(r->error()) : "timeout");
    // Unknown whether the DELETE committed; purging again is harmless.
    co_return store_failed(request, "the record could not be purged (it may or may not be "
                                    "gone); retry the DELETE");
  }
  if (!r->value()) {
    co_return problem(request, http::status::not_found, "record_not_found", "Record not found",
                      "no record with this tenant, scope and key");
  }
  // Audit trail without the raw key: the same hash the access line carries.
  spdlog::info("admin: purged a record (scope \"{}\", key_hash {}) at the request of {}",
               id.endpoint, idempotency::log_hash(id.tenant, id.key), peer_text(context));
  server::Response res{http::status::no_content, request.version()};
  no_store(res);
  res.keep_alive(request.keep_alive());
  co_return res;
}

}  // namespace idem::admin
