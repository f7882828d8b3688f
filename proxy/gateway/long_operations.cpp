// Long operations and uncertain outcomes (docs/http.md, "Long operations"): a replay that
// re-fetches its resource, and a takeover that first asks the backend whether the earlier
// attempt's operation happened. Both are requests of idemproxy's own to the one upstream,
// made with the client's credentials; neither forwards the client's body.
#include <algorithm>
#include <array>

#include <spdlog/spdlog.h>

#include "gateway/exchange.hpp"
#include "gateway/headers.hpp"
#include "idempotency/fingerprint.hpp"

namespace idem::gateway {
namespace {

using obs::Outcome;

// The client's header fields a lookup of idemproxy's own must not carry: those about the
// client's body (there is none) and its conditions (a lookup is unconditional: a 304 or 412
// would say nothing about the operation).
bool lookup_drops(std::string_view name, const settings::RouteSettings& rs) {
  static constexpr std::array<std::string_view, 9> kDropped = {
      "Content-Length", "Content-Type", "Content-Encoding", "Transfer-Encoding", "Expect",
      "Range",          "If-Range",     "Trailer",          "Content-MD5"};
  if (iequals(name, rs.key.header)) return true;
  if (name.size() > 3 && iequals(name.substr(0, 3), "If-")) return true;
  return std::any_of(kDropped.begin(), kDropped.end(),
                     [&](std::string_view d) { return iequals(d, name); });
}

// A GET (or the route's reconcile method) of `target` with the client's own credentials:
// every header the client sent but those lookup_drops() names, as a client's own GET of
// the target through idemproxy would carry them. `span`: the lookup's own span, the
// backend's parent.
upstream::Request lookup_request(const Gateway::Exchange& x, std::string_view method,
                                 std::string_view target, const obs::SpanId& span) {
  const auto& rs = *x.route->settings;
  upstream::Request up;
  up.method_string(method);
  up.version(11);
  up.target(x.runtime->settings().upstream.base_path + std::string(target));
  for (const auto& f : x.request.base()) {
    if (!lookup_drops(f.name_string(), rs)) up.insert(f.name_string(), f.value());
  }
  strip_hop_by_hop(up.base());
  up.set("X-Forwarded-For", forwarded_for(x));
  // A lookup belongs to the request's trace: its span is a child of the server span.
  set_trace_headers(up.base(), x, span);
  up.prepare_payload();
  return up;
}

// The fields that describe a representation: a re-fetched replay takes them from the
// fetch, not from the record.
bool describes_representation(std::string_view name) {
  static constexpr std::array<std::string_view, 7> kFields = {
      "Content-Type", "Content-Length", "Content-Encoding", "Content-Language",
      "ETag",         "Last-Modified",  "Content-Location"};
  return std::any_of(kFields.begin(), kFields.end(),
                     [&](std::string_view f) { return iequals(f, name); });
}

// The lookup's client span (refetch or reconcile), as forward's: a child of the server
// span, the backend's status when it answered, what the lookup concluded.
void lookup_span(Gateway::Exchange& x, const char* name, std::int64_t start_ns, const obs::SpanId& id,
                 std::string_view said, std::int64_t attempt = 0) {
  if (!x.record_spans) return;
  add_span(x, name, obs::SpanKind::client, start_ns, id, said == "failed");
  auto& span = x.spans.back();
  span.attributes.emplace_back(std::string("idemproxy.") + name, std::string(said));
  if (x.upstream.failure == upstream::Failure::none) {
    span.int_attributes.emplace_back("http.response.status_code", x.upstream.response.result_int());
  }
  if (attempt > 0) span.int_attributes.emplace_back("idemproxy.attempt", attempt);
}

std::string reconcile_target(const settings::ReconcileSettings& rc, std::string_view op_id) {
  std::string target = rc.path;
  const auto at = target.find("{operation_id}");
  target.replace(at, std::string_view("{operation_id}").size(), op_id);
  return target;
}

}  // namespace

std::string refetch_target_of(const Gateway::Exchange& x, const store::Record& record) {
  if (!record.response) return {};
  const auto host = x.request.base().find(http::field::host);
  return refetch_target(record.response->resource_id,
                        host == x.request.base().end() ? std::string_view() : std::string_view(host->value()),
                        x.route->settings->refetch_hosts);
}

asio::awaitable<idempotency::Event> Gateway::refetch(Exchange& x) {
  const auto target = refetch_target_of(x, *x.row);
  const auto span = obs::new_span_id();
  const auto span_start = obs::unix_now_ns();
  const auto t0 = SteadyClock::now();
  x.upstream = co_await deps_.upstream->send(lookup_request(x, "GET", target, span));
  x.upstream_seconds = (x.upstream_seconds < 0 ? 0 : x.upstream_seconds) + seconds_since(t0);
  idempotency::Refetched r;
  if (x.upstream.failure == upstream::Failure::none) {
    const int status = static_cast<int>(x.upstream.response.result_int());
    if (status >= 200 && status < 300) r.result = idempotency::RefetchResult::fetched;
    if (status >= 400 && status < 500) r.result = idempotency::RefetchResult::refused;
  }
  const std::string_view said = r.result == idempotency::RefetchResult::fetched   ? "fetched"
                                : r.result == idempotency::RefetchResult::refused ? "refused"
                                                                                  : "failed";
  deps_.metrics->refetch(said);
  lookup_span(x, "refetch", span_start, span, said);
  co_return r;
}

// The replay of a re-fetched record: its first status and its other recorded fields, with
// the representation the backend holds now. A refusal goes out as the backend sent it, so
// a client that may no longer see the resource learns exactly that; a failure is a problem
// with nothing of the record in it.
server::Response Gateway::refetch_answer(Exchange& x, idempotency::Answer answer) {
  using idempotency::Answer;
  if (answer == Answer::refetch_refused) {
    x.outcome = Outcome::rejected;
    x.code = "replay_refused";
    return to_client(std::move(x.upstream.response), x);
  }
  if (answer == Answer::refetch_failed) {
    x.outcome = Outcome::replay_failed;
    x.code = "replay_refetch_failed";
    spdlog::warn("replay re-fetch failed (route {}, key_hash {}): {}", x.route->settings->name,
                 x.key_hash,
                 x.upstream.failure == upstream::Failure::none
                     ? std::to_string(x.upstream.response.result_int())
                     : std::string(upstream::to_string(x.upstream.failure)));
    auto res = problem(x, http::status::bad_gateway, x.code, "Replay unavailable",
                       "this key's operation completed, but its resource could not be fetched "
                       "from the upstream; retry with the same key");
    res.set(http::field::retry_after, retry_after_seconds(x.route->settings->retry_after));
    return res;
  }
  const store::StoredResponse& stored = *x.row->response;
  x.outcome = Outcome::replayed;
  x.attempt = x.row->attempt;
  x.key_expires_at_us = x.row->expires_at_us;
  server::Response res{static_cast<http::status>(stored.status), x.version};
  for (const auto& h : stored.headers) {
    if (!describes_representation(h.name)) res.insert(h.name, h.value);
  }
  for (const auto& f : x.upstream.response.base()) {
    if (describes_representation(f.name_string()) && !iequals(f.name_string(), "Content-Length")) {
      res.insert(f.name_string(), f.value());
    }
  }
  res.set(std::string(kReplayedHeader), "true");
  res.set(std::string(kReplayBodyHeader), "current");
  res.body() = std::move(x.upstream.response.body());
  res.keep_alive(x.keep_alive);
  res.prepare_payload();
  return res;
}

// Asked as the new owner (its attempt and fencing token go along), before anything is
// forwarded. A 2xx is the operation's answer as the backend would have sent it, and is
// recorded as such; a 404 says it did not happen.
asio::awaitable<idempotency::Event> Gateway::reconcile(Exchange& x, store::Ownership owner) {
  const auto& rs = *x.route->settings;
  x.owner = owner;
  x.attempt = owner.attempt;
  if (x.operation_id.empty()) {
    x.operation_id = idempotency::operation_id(x.tenant, x.claim.id.endpoint, x.key);
  }
  const auto span = obs::new_span_id();
  const auto span_start = obs::unix_now_ns();
  auto req = lookup_request(x, rs.reconcile.method, reconcile_target(rs.reconcile, x.operation_id), span);
  set_owner_headers(req.base(), x.operation_id, owner, std::string());
  const auto t0 = SteadyClock::now();
  x.upstream = co_await deps_.upstream->send(std::move(req));
  x.upstream_seconds = (x.upstream_seconds < 0 ? 0 : x.upstream_seconds) + seconds_since(t0);
  idempotency::Reconciled r;
  if (x.upstream.failure == upstream::Failure::none) {
    const int status = static_cast<int>(x.upstream.response.result_int());
    if (status >= 200 && status < 300) r.result = idempotency::ReconcileResult::found;
    if (status == 404) r.result = idempotency::ReconcileResult::not_found;
  }
  const std::string_view said = r.result == idempotency::ReconcileResult::found ? "found"
                                : r.result == idempotency::ReconcileResult::not_found
                                    ? "not_found"
                                    : "failed";
  deps_.metrics->reconciliation(said);
  lookup_span(x, "reconcile", span_start, span, said, owner.attempt);
  spdlog::info("reconciled an unknown outcome (route {}, key_hash {}, attempt {}): {}", rs.name,
               x.key_hash, owner.attempt, said);
  co_return r;
}

}  // namespace idem::gateway
