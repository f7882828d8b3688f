#include "gateway/gateway.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include "gateway/examine.hpp"
#include "gateway/exchange.hpp"
#include "gateway/headers.hpp"
#include "gateway/inbound.hpp"
#include "idempotency/decision.hpp"
#include "idempotency/backend_completion.hpp"
#include "idempotency/key.hpp"
#include "common/json_text.hpp"
#include "common/time_text.hpp"
#include "observability/logging.hpp"

namespace idem::gateway {
namespace {

using idempotency::Step;
using obs::Outcome;
using obs::StoreOp;
using obs::store_error_kind;

// Tenants arrive from a trusted authenticating layer; anything but one short token of
// visible ASCII is a misconfiguration in front of us and must not scope a record.
bool valid_tenant(std::string_view t) {
  if (t.empty() || t.size() > 255) return false;
  return std::all_of(t.begin(), t.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

}  // namespace

double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

std::string retry_after_seconds(Millis d) {
  const auto secs = std::max<long long>(1, (d.count() + 999) / 1000);
  return std::to_string(secs);
}

Gateway::Gateway(Dependencies deps) : deps_(std::move(deps)) {}

server::Response problem(const Gateway::Exchange& x, http::status status, std::string_view code,
                         std::string_view title, std::string_view detail) {
  return server::make_problem(status, code, title, detail, x.version, x.keep_alive);
}

// The response the client sees from the upstream: per-hop fields belong to our hop, and
// the replay markers are idemproxy's alone (a backend's own would make this first answer
// read as a replay).
server::Response to_client(upstream::Response&& up, const Gateway::Exchange& x) {
  server::Response res = std::move(up);
  strip_hop_by_hop(res.base());
  strip_replay_markers(res.base());
  res.version(x.version);
  res.keep_alive(x.keep_alive);
  // A HEAD answer carries the length the GET would have; recomputing it from the empty
  // body would lie to the client.
  if (x.method != "HEAD") res.prepare_payload();
  return res;
}

// A recorded answer. `as_replay`: marked as one (a retry's answer); not marked when it is
// the operation's first answer to reach a client (a backend that recorded other than what
// it sent: the record wins).
server::Response replay(const store::StoredResponse& stored, const Gateway::Exchange& x,
                        bool as_replay) {
  server::Response res{static_cast<http::status>(stored.status), x.version};
  for (const auto& h : stored.headers) res.insert(h.name, h.value);
  if (as_replay) res.set(std::string(kReplayedHeader), "true");
  if (stored.body_omitted) res.set(std::string(kReplayBodyHeader), "omitted");
  res.body() = stored.body;
  res.keep_alive(x.keep_alive);
  res.prepare_payload();
  return res;
}

std::string forwarded_for(const Gateway::Exchange& x) {
  std::string chain;
  for (auto v : field_values(x.request.base(), "X-Forwarded-For")) {
    if (!chain.empty()) chain += ", ";
    chain += v;
  }
  if (!chain.empty()) chain += ", ";
  if (x.context.peer_address.empty()) {
    chain += x.context.peer.address().to_string();
  } else {
    chain += x.context.peer_address;
  }
  return chain;
}

namespace {

store::StoredResponse capture(const upstream::Response& res, const settings::RouteSettings& rs) {
  store::StoredResponse out;
  out.status = static_cast<int>(res.result_int());
  for (const auto& f : res.base()) {
    const std::string_view name = f.name_string();
    const auto is = [&](std::string_view m) { return iequals(m, name); };
    const bool marker = std::any_of(kReplayMarkers.begin(), kReplayMarkers.end(), is) ||
                        std::any_of(kBackendControls.begin(), kBackendControls.end(), is);
    const bool wanted = !marker &&
                        std::any_of(rs.replay_headers.begin(), rs.replay_headers.end(),
                                    [&](const std::string& h) { return iequals(h, name); });
    // Values are kept as the exact bytes the backend sent (store/header_codec.hpp).
    if (wanted) out.headers.push_back({std::string(name), std::string(f.value())});
    if (iequals(name, "Location") && out.resource_id.empty()) {
      out.resource_id = resource_id_from_location(f.value());
    }
  }
  if (res.body().size() > rs.max_stored_body) {
    out.body_omitted = true;
  } else {
    out.body = res.body();
  }
  return out;
}

// The request as every decision below reads it and as the backend receives it, made in
// one place before anything is decided (gateway/inbound.hpp).
// The routes' idempotency policy: the same for every client, so caches may keep it a while.
server::Response policy_answer(Gateway::Exchange& x) {
  x.outcome = Outcome::passthrough;
  x.code = "policy";
  server::Response res{http::status::ok, x.version};
  res.set(http::field::content_type, "application/json");
  res.set(http::field::cache_control, "max-age=60");
  res.body() = x.runtime->policy();
  res.keep_alive(x.keep_alive);
  res.prepare_payload();
  return res;
}

std::optional<server::Response> inbound_refusal(Gateway::Exchange& x) {
  const auto check = check_inbound(x.request.base(), x.method, x.path, *x.runtime, x.route);
  if (check.ok) return std::nullopt;
  x.outcome = Outcome::rejected;
  x.code = "bad_request";
  return problem(x, http::status::bad_request, x.code, "Bad Request", check.problem);
}

// tenant.from: jwt | mtls (identity/identity.hpp): the verified tenant and principal
// replace the identity headers before anything reads them; header mode does nothing here.
std::optional<server::Response> identity_refusal(Gateway::Exchange& x) {
  const auto* resolver = x.runtime->identity();
  if (!resolver) return std::nullopt;
  auto verified = resolver->resolve(x.request.base(), x.context.client_uris,
                                    std::chrono::system_clock::now());
  if (verified.ok) {
    resolver->apply(verified, x.request.base());
    return std::nullopt;
  }
  x.outcome = Outcome::rejected;
  x.code = verified.code;
  auto res = problem(x, verified.status, verified.code, verified.title, verified.detail);
  if (!verified.challenge.empty()) res.set(http::field::www_authenticate, verified.challenge);
  return res;
}

// Renews the owner's lease every lease/3 while the upstream call runs, so a slow but
// healthy backend is not mistaken for a crashed owner. Lives in its own coroutine so the
// forward is never delayed by a renewal round trip.
// Nearly every upstream call ends long before its first renewal is due, so the keeper
// starts as a bare timer; the renewal coroutine (a frame and a spawn per request) only
// exists for the calls that outlast lease/3.
struct LeaseKeeper {
  explicit LeaseKeeper(asio::any_io_executor ex) : timer(std::move(ex)) {}
  void stop() {
    stopped = true;
    timer.cancel();
  }
  asio::steady_timer timer;
  bool stopped = false;
};

// `backend_completes`: the backend may complete the record before it answers, after which a
// renewal matches nothing without anything being fenced; the renewals then simply stop.
std::shared_ptr<LeaseKeeper> start_lease_keeper(const Dependencies& deps, store::RecordId id,
                                                store::Ownership owner, Millis lease,
                                                bool backend_completes) {
  auto keeper = std::make_shared<LeaseKeeper>(deps.executor);
  const Millis period = std::max(Millis{50}, lease / 3);
  auto renewals = [keeper, store = deps.store, metrics = deps.metrics, id = std::move(id), owner,
                   lease, period, backend_completes]() -> asio::awaitable<void> {
    // The first renewal is due now: the timer below has already waited one period.
    for (bool due = true; !keeper->stopped; due = false) {
      if (!due) {
        keeper->timer.expires_after(period);
        error_code ec;
        co_await keeper->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        if (keeper->stopped) co_return;
      }
      const auto t0 = SteadyClock::now();
      auto renewed = co_await store->renew(id, owner.fence, lease);
      metrics->store_duration(StoreOp::renew, seconds_since(t0));
      if (keeper->stopped) co_return;  // completion won the race: nothing to renew
      if (!renewed) {
        // Transient: the next tick tries again; if the store stays away the lease
        // lapses and a retry takes over, which the attempt token makes safe.
        metrics->store_error(store_error_kind(renewed.error()));
        continue;
      }
      if (!*renewed) {
        if (backend_completes) co_return;  // completed by the backend, or fenced: the
                                           // answer's own step tells which
        // Another claim owns the row: our completion will be fenced too.
        metrics->fenced_write();
        spdlog::warn("lease renewal fenced: attempt {} (fencing token {}) no longer owns the record",
                     owner.attempt, owner.fence);
        co_return;
      }
      metrics->lease_renewal();
    }
  };
  keeper->timer.expires_after(period);
  keeper->timer.async_wait(
      [keeper, renewals = std::move(renewals)](const error_code& ec) mutable {
        if (ec || keeper->stopped) return;
        asio::co_spawn(keeper->timer.get_executor(), std::move(renewals), asio::detached);
      });
  return keeper;
}

}  // namespace

void set_trace_headers(http::fields& fields, const Gateway::Exchange& x, const obs::SpanId& parent) {
  fields.erase("traceparent");
  fields.erase("tracestate");
  fields.set("traceparent", obs::format_traceparent(x.trace.trace_id, parent, x.trace.flags));
  if (!x.trace.tracestate.empty()) fields.set("tracestate", obs::format_tracestate(x.trace.tracestate));
}

void add_span(Gateway::Exchange& x, std::string name, obs::SpanKind kind, std::int64_t start_ns,
              const obs::SpanId& id, bool error) {
  obs::Span span;
  span.trace_id = x.trace.trace_id;
  span.span_id = id;
  span.parent = x.trace.server_span;
  span.name = std::move(name);
  span.kind = kind;
  span.start_unix_ns = start_ns;
  span.end_unix_ns = obs::unix_now_ns();
  span.error = error;
  x.spans.push_back(std::move(span));
}

namespace {

// Continues the client's trace (or starts one) before anything else reads the request:
// every answer, refusals included, is logged with its trace id.
// The sampling decision for a trace idemproxy starts: a share `sample` of them.
bool sample_new_trace(double sample) {
  if (sample >= 1) return true;
  if (sample <= 0) return false;
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0, 1)(rng) < sample;
}

void start_trace(Gateway::Exchange& x, bool exporting) {
  const auto& base = x.request.base();
  // The span starts when the request's first byte arrived, on the wall clock.
  x.started_unix_ns = obs::unix_now_ns() -
                      std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() -
                                                                           x.context.received_at)
                          .count();
  x.trace = obs::continue_trace(field_values(base, "traceparent"), field_values(base, "tracestate"),
                                exporting && sample_new_trace(x.runtime->settings().tracing.sample));
  x.trace_id = obs::to_hex(x.trace.trace_id);
  x.record_spans = exporting && x.trace.sampled();
  if (x.record_spans) x.spans.reserve(6);
}

// The store steps the spans name (claim, wait, complete); forward has its own, in
// forward(). A claim that lost, a takeover and a replacement are all "claim", told apart
// by idemproxy.step.
void step_span(Gateway::Exchange& x, Step step, std::int64_t start_ns, const idempotency::Event& event) {
  const char* name = nullptr;
  const char* detail = nullptr;
  switch (step) {
    case Step::claim: name = "claim"; detail = "insert"; break;
    case Step::take_over: name = "claim"; detail = "take_over"; break;
    case Step::replace: name = "claim"; detail = "replace"; break;
    case Step::wait: name = "wait"; break;
    case Step::complete: name = "complete"; break;
    default: return;
  }
  add_span(x, name, obs::SpanKind::internal, start_ns, obs::new_span_id(),
           std::holds_alternative<idempotency::StoreFailed>(event));
  if (detail != nullptr) x.spans.back().attributes.emplace_back("idemproxy.step", detail);
}

// The server span, parent of the others, and the hand-off to the exporter's queue.
void finish_trace(Gateway::Exchange& x, std::string_view route, int status) {
  obs::Span span;
  span.trace_id = x.trace.trace_id;
  span.span_id = x.trace.server_span;
  span.parent = x.trace.client_parent;
  span.name = x.method + " " + (x.route ? x.route->settings->path : std::string("unmatched"));
  span.kind = obs::SpanKind::server;
  span.start_unix_ns = x.started_unix_ns;
  span.end_unix_ns = obs::unix_now_ns();
  span.error = status >= 500;
  span.attributes = {{"http.request.method", x.method},
                     {"idemproxy.route", std::string(route)},
                     {"idemproxy.outcome", std::string(obs::to_string(x.outcome))}};
  if (!x.key_hash.empty()) span.attributes.emplace_back("idemproxy.key_hash", x.key_hash);
  if (!x.record_trace_id.empty()) span.attributes.emplace_back("idemproxy.record_trace_id", x.record_trace_id);
  span.int_attributes = {{"http.response.status_code", status}};
  if (x.attempt > 0) span.int_attributes.emplace_back("idemproxy.attempt", x.attempt);
  x.spans.push_back(std::move(span));
}

}  // namespace

namespace {

// The way a request takes once matched, decided before any I/O: shared by handle() and
// examine() (idemproxy explain), so that what explain says is what the sidecar does.
enum class Way { answered, operation_status, protected_route, pass_through };
struct Entry {
  Way way = Way::pass_through;
  std::optional<server::Response> answer;  // Way::answered
  std::optional<StatusMatch> status;       // Way::operation_status
};

Entry enter(Gateway::Exchange& x) {
  Entry e;
  if (auto refused = inbound_refusal(x)) {
    e.way = Way::answered;
    e.answer = std::move(refused);
  } else if (!x.route && x.method == "GET" && !x.runtime->settings().policy_path.empty() &&
             x.path == x.runtime->settings().policy_path) {
    // Public: what the routes ask of clients, before any identity is required.
    e.way = Way::answered;
    e.answer = policy_answer(x);
  } else if (auto unverified = identity_refusal(x)) {
    e.way = Way::answered;
    e.answer = std::move(unverified);
  } else if (auto status = x.route ? std::nullopt : x.runtime->match_status(x.method, x.path)) {
    e.way = Way::operation_status;
    e.status = std::move(status);
  } else if (x.route) {
    e.way = Way::protected_route;
  } else if (x.runtime->settings().unmatched == settings::Unmatched::reject) {
    x.outcome = Outcome::rejected;
    e.way = Way::answered;
    e.answer = problem(x, http::status::not_found, "route_not_found", "No route matches",
                       "no configured route matches this method and path");
    x.code = "route_not_found";
  }
  return e;
}

}  // namespace

asio::awaitable<server::Response> Gateway::handle(server::Request& request,
                                                  const server::RequestContext& context) {
  Exchange x{request, context, deps_.runtime->load()};
  x.version = request.version();
  x.keep_alive = request.keep_alive();
  x.method = std::string(request.method_string());
  {
    const auto parts = split_target(request.target());
    x.path = std::string(parts.path);
    x.query = std::string(parts.query);
  }
  server::Response res;
  x.route = x.runtime->match(x.method, x.path);
  start_trace(x, deps_.tracer != nullptr);
  auto entry = enter(x);
  switch (entry.way) {
    case Way::answered:
      res = std::move(*entry.answer);
      break;
    case Way::operation_status:
      res = co_await operation_status(x, *entry.status);
      break;
    case Way::protected_route:
      res = co_await protected_request(x);
      break;
    case Way::pass_through:
      res = co_await pass_through(x);
      break;
  }

  const double total = seconds_since(context.received_at);
  const std::string_view route_name = x.route ? std::string_view(x.route->settings->name)
                                              : std::string_view("unmatched");
  deps_.metrics->request(route_name, x.outcome, total);
  obs::AccessRecord rec;
  rec.route = x.route ? route_name : std::string_view();
  rec.method = x.method;
  rec.path = x.path;
  rec.outcome = obs::to_string(x.outcome);
  rec.status = static_cast<int>(res.result_int());
  rec.duration_ms = total * 1000.0;
  rec.upstream_ms = x.upstream_seconds < 0 ? -1 : x.upstream_seconds * 1000.0;
  rec.store_ms = x.store_seconds < 0 ? -1 : x.store_seconds * 1000.0;
  rec.attempt = x.attempt;
  rec.key_hash = x.key_hash;
  rec.code = x.code;
  rec.from_cache = x.from_cache;
  rec.fenced = x.fenced;
  rec.trace_id = x.trace_id;
  rec.record_trace_id = x.record_trace_id;
  if (x.record_spans) {
    finish_trace(x, route_name, static_cast<int>(res.result_int()));
    deps_.tracer->submit(std::move(x.spans));
  }
  // The line joins the others of this pass of the event loop; the first one of a pass
  // schedules the write of them all (one write(2) for many requests under load).
  if (obs::log_access_batched(rec)) asio::post(deps_.executor, [] { obs::flush_access_log(); });
  co_return res;
}

asio::awaitable<server::Response> Gateway::pass_through(Exchange& x) {
  x.outcome = Outcome::passthrough;
  auto out = co_await forward(x, nullptr);
  switch (out.failure) {
    case upstream::Failure::none:
      co_return to_client(std::move(out.response), x);
    case upstream::Failure::connect_failed:
      x.code = "upstream_unavailable";
      co_return problem(x, http::status::bad_gateway, x.code, "Upstream unavailable",
                        "the upstream refused the connection; the request was not sent");
    case upstream::Failure::timeout:
    case upstream::Failure::broken:
      x.code = "upstream_timeout";
      co_return problem(x, http::status::gateway_timeout, x.code, "Upstream timeout",
                        "the upstream did not answer in time; the outcome is unknown");
    case upstream::Failure::response_too_large:
    case upstream::Failure::bad_response:
      break;
  }
  x.code = "upstream_invalid_response";
  co_return problem(x, http::status::bad_gateway, x.code, "Invalid upstream response",
                    "the upstream's response was malformed or larger than allowed");
}

asio::awaitable<upstream::Outcome> Gateway::forward(Exchange& x, const store::Ownership* owner) {
  const auto& up_settings = x.runtime->settings().upstream;
  upstream::Request up;
  up.method_string(x.request.method_string());
  up.version(11);
  // "*" (OPTIONS) names the server as a whole, so no base path goes in front of it.
  const std::string_view target = x.request.target();
  up.target(target == "*" ? std::string(target) : up_settings.base_path + std::string(target));
  for (const auto& f : x.request.base()) up.insert(f.name_string(), f.value());
  strip_hop_by_hop(up.base());
  // Append the client's address to any chain set by proxies in front of us.
  up.set("X-Forwarded-For", forwarded_for(x));
  // The backend's parent is the sidecar's own forward span, in the client's trace (or a
  // new one); the client's fields are replaced, an invalid tracestate is not passed on.
  const auto forward_span = obs::new_span_id();
  set_trace_headers(up.base(), x, forward_span);
  const auto forward_start = obs::unix_now_ns();
  if (owner != nullptr) {
    if (x.operation_id.empty()) x.operation_id = idempotency::operation_id(x.tenant, x.claim.id.endpoint, x.key);
    const auto& rs = *x.route->settings;
    set_owner_headers(up.base(), x.operation_id, *owner,
                      rs.completion == settings::Completion::backend
                          ? idempotency::record_reference(owner->fence, rs.retention, rs.scope, x.key)
                          : std::string());
  }
  up.body() = std::move(x.request.body());
  up.prepare_payload();

  const auto t0 = SteadyClock::now();
  auto out = co_await deps_.upstream->send(std::move(up));
  const double took = seconds_since(t0);
  x.upstream_seconds = (x.upstream_seconds < 0 ? 0 : x.upstream_seconds) + took;
  deps_.metrics->upstream_duration(took);
  if (x.record_spans) {
    add_span(x, "forward", obs::SpanKind::client, forward_start, forward_span,
             out.failure != upstream::Failure::none);
    if (out.failure == upstream::Failure::none) {
      x.spans.back().int_attributes.emplace_back("http.response.status_code", out.response.result_int());
    }
  }
  co_return out;
}

server::Response store_unavailable(Gateway::Exchange& x, const error_code& ec) {
  const auto& rs = *x.route->settings;
  x.outcome = Outcome::store_unavailable;
  x.code = "idempotency_store_unavailable";
  spdlog::warn("store unavailable for route {}: {}", rs.name, ec.message());
  // A fenced owner reading the record did forward its attempt: say so.
  const bool forwarded = x.owner.fence != 0;
  auto res = problem(x, http::status::service_unavailable, x.code, "Idempotency store unavailable",
                     forwarded ? "the idempotency store could not be reached in time after the "
                                 "upstream answered; retry with the same key"
                               : "the idempotency store could not be reached in time; nothing "
                                 "was forwarded");
  res.set(http::field::retry_after, retry_after_seconds(rs.retry_after));
  return res;
}

namespace {

// --- The protocol's answers, each setting its outcome and problem code ---------------------


// An owner holds the upstream's answer but the record does not: the store failed, or the
// owner was fenced and the record holds nothing it may replay. The answer stays unsent, so
// that every client of this key sees what the record will say; `retry_after` is when a
// retry can find the key free or taken over.
server::Response unrecorded(Gateway::Exchange& x, std::string_view detail, Millis retry_after) {
  x.outcome = Outcome::store_unavailable;
  x.code = "idempotency_store_unavailable";
  auto res = problem(x, http::status::service_unavailable, x.code, "Idempotency store unavailable",
                     detail);
  res.set(http::field::retry_after, retry_after_seconds(retry_after));
  return res;
}

server::Response mismatch(Gateway::Exchange& x) {
  x.outcome = Outcome::key_reused;
  x.code = "idempotency_key_reused";
  return problem(x, static_cast<http::status>(x.route->settings->mismatch_status), x.code,
                 "Idempotency key reused",
                 "this key was already used with a different request; use a new key for a new "
                 "operation");
}

// same_payload_new_key: reject. The earlier key's operation is named by its id (never its
// key): the client's retry should have used that key, and GET of an async route's status
// path, or the admin API, finds its record by it.
server::Response payload_reused(Gateway::Exchange& x) {
  x.outcome = Outcome::rejected;
  x.code = "same_payload_new_key";
  const auto& seen = x.same_payload;
  auto res = problem(x, http::status::conflict, x.code, "Same payload, new key",
                     "a request with this payload came " + std::to_string(seen.age.count() / 1000) +
                         " s ago with another idempotency key; to retry that operation, send its "
                         "key again; nothing was forwarded");
  std::string& body = res.body();
  body.pop_back();  // the problem's closing brace: one member more
  body += ",\"earlier_operation_id\":";
  text::append_json_string(body, seen.earlier_operation_id);
  body += '}';
  res.prepare_payload();
  return res;
}

server::Response forbidden(Gateway::Exchange& x) {
  x.outcome = Outcome::rejected;
  x.code = "idempotency_key_forbidden";
  return problem(x, http::status::forbidden, x.code, "Idempotency key forbidden",
                 "this key belongs to an operation of another principal");
}

server::Response in_progress(Gateway::Exchange& x) {
  x.outcome = Outcome::in_progress;
  x.code = "idempotency_in_progress";
  auto res = problem(x, http::status::conflict, x.code, "Request in progress",
                     "a request with this key is still being processed; retry after the "
                     "indicated delay");
  res.set(http::field::retry_after, retry_after_seconds(x.route->settings->retry_after));
  return res;
}

server::Response replayed(Gateway::Exchange& x, const store::StoredResponse& stored,
                          std::int64_t attempt) {
  x.outcome = Outcome::replayed;
  x.attempt = attempt;
  return replay(stored, x);
}

// The access-log and metric name of a fenced owner's answer, from the outcome it ended in.
std::string_view fenced_answer(Outcome o) {
  switch (o) {
    case Outcome::replayed: return "replayed";
    case Outcome::in_progress: return "in_progress";
    case Outcome::key_reused: return "key_reused";
    case Outcome::rejected: return "forbidden";
    default: return "unavailable";
  }
}


// --- What the protocol sees of a row -------------------------------------------------------

// `has_resource`: the record names a resource this request may re-fetch (replay.mode:
// refetch), which depends on the retrying request's own Host.
idempotency::RowView view_of(const store::Record& r, const Gateway::Exchange& x) {
  idempotency::RowView v{r.fingerprint,      r.principal, r.state == store::State::completed,
                         r.attempt,          r.lease_expired, r.expired,
                         r.fence,            r.lease_remaining};
  v.has_resource = !refetch_target_of(x, r).empty();
  return v;
}

// Tenants arrive from a trusted authenticating layer; anything but one short token of
// visible ASCII is a misconfiguration in front of us and must not scope a record.
std::optional<server::Response> admit_tenant(Gateway::Exchange& x) {
  const auto tenants = field_values(x.request.base(), x.runtime->settings().tenant.header);
  if (tenants.size() != 1 || !valid_tenant(text::trim_ows(tenants.front()))) {
    x.code = "tenant_missing";
    return problem(x, http::status::unauthorized, x.code, "Tenant missing",
                   tenants.empty() ? "the tenant header is missing"
                                   : "the tenant header must be one value of 1-255 visible "
                                     "ASCII characters");
  }
  x.tenant = std::string(text::trim_ows(tenants.front()));
  return std::nullopt;
}

// The body, read once by the route's format (idempotency/body.hpp).
const idempotency::BodyParse& read_body(Gateway::Exchange& x) {
  if (!x.body) {
    std::optional<std::string_view> content_type;
    if (auto ct = x.request.base().find(http::field::content_type); ct != x.request.end()) {
      content_type = std::string_view(ct->value());
    }
    x.body = idempotency::parse_body(x.route->fingerprint.body(), content_type, x.request.body());
  }
  return *x.body;
}

idempotency::KeyParse read_key(Gateway::Exchange& x) {
  const auto& spec = x.route->key;
  const auto header_values = field_values(x.request.base(), spec.header);
  idempotency::KeySources in;
  in.header_values = header_values;
  in.query = x.query;
  if (spec.from == settings::KeySource::body && x.body && x.body->status == idempotency::BodyStatus::ok) {
    in.body = &x.body->body.model;
  }
  return idempotency::read_key(spec, in);
}

// A request on a `required: false` route that carries no key anywhere it could: passed
// through unprotected. A body key's absence is only known once the body reads; a body that
// does not read is refused (below) rather than guessed about.
bool carries_no_key(Gateway::Exchange& x) {
  const auto& spec = x.route->key;
  if (spec.from == settings::KeySource::header) return field_values(x.request.base(), spec.header).empty();
  if (spec.from == settings::KeySource::body && read_body(x).status != idempotency::BodyStatus::ok) return false;
  return read_key(x).status == idempotency::KeyStatus::missing;
}

std::optional<server::Response> admit_key(Gateway::Exchange& x) {
  const auto& rs = *x.route->settings;
  auto parsed = read_key(x);
  switch (parsed.status) {
    case idempotency::KeyStatus::ok: break;
    case idempotency::KeyStatus::missing:
      x.code = "idempotency_key_missing";
      return problem(x, http::status::bad_request, x.code, "Idempotency key missing",
                     parsed.reason.empty() ? "this route requires the " + rs.key.header + " header"
                                           : parsed.reason);
    case idempotency::KeyStatus::invalid:
      x.code = "idempotency_key_invalid";
      return problem(x, http::status::bad_request, x.code, "Idempotency key invalid", parsed.reason);
    case idempotency::KeyStatus::misplaced:
      x.code = "idempotency_key_misplaced";
      return problem(x, http::status::bad_request, x.code, "Idempotency key misplaced", parsed.reason);
    case idempotency::KeyStatus::ambiguous:
      x.code = "idempotency_key_ambiguous";
      return problem(x, http::status::bad_request, x.code, "Idempotency key ambiguous", parsed.reason);
  }
  x.key = std::move(parsed.key);
  x.key_hash = idempotency::log_hash(x.tenant, x.key);
  return std::nullopt;
}

std::optional<server::Response> admit_body(Gateway::Exchange& x) {
  const auto& body = read_body(x);
  if (body.status == idempotency::BodyStatus::ok) return std::nullopt;
  x.code = idempotency::problem_code(body.status);
  const auto status = static_cast<http::status>(idempotency::http_status(body.status));
  return problem(x, status, x.code, idempotency::problem_title(body.status), body.reason);
}

// The parts of the request the fingerprint covers; `scope_and_path` holds the text
// parts.scope views on a templated route, so it must outlive `parts`.
idempotency::RequestParts fingerprint_parts(const Gateway::Exchange& x, std::string& scope_and_path) {
  const auto& rs = *x.route->settings;
  idempotency::RequestParts parts;
  parts.method = x.method;
  scope_and_path = x.route->templated ? rs.scope + '\n' + x.path : std::string();
  parts.scope = x.route->templated ? std::string_view(scope_and_path) : std::string_view(rs.scope);
  for (const auto& name : x.route->fingerprint.header_names()) {
    const auto values = field_values(x.request.base(), name);
    if (values.empty()) {
      parts.header_values.emplace_back(std::nullopt);
      continue;
    }
    std::string joined;
    for (auto v : values) {
      if (!joined.empty()) joined += ", ";
      joined += v;
    }
    parts.header_values.emplace_back(std::move(joined));
  }
  parts.query = x.query;
  return parts;
}

void admit_fingerprint(Gateway::Exchange& x, const idempotency::RequestParts& parts) {
  // The model is read for nothing else afterwards (a body key was read before): the
  // fingerprint takes it rather than copying the parsed tree.
  x.fingerprint = x.keep_body_model
                      ? idempotency::fingerprint(x.route->fingerprint, parts, x.body->body)
                      : idempotency::fingerprint(x.route->fingerprint, parts, std::move(x.body->body));
}

// The memo's key for this request, when the memo may answer it: not for a key read from
// the body (the body is read before the key anyway), not for explain (it shows the parsed
// body), not for raw bodies (their fingerprint is already one hash of the bytes). Fills in
// the parts' raw Content-Type and body, which the key covers (the fingerprint of a body
// already read does not look at them).
std::optional<idempotency::MemoKey> memo_key_of(const Gateway::Exchange& x,
                                               idempotency::RequestParts& parts) {
  if (x.keep_body_model || x.body || x.route->key.from == settings::KeySource::body ||
      x.route->fingerprint.body().format == settings::BodyFormat::raw) {
    return std::nullopt;
  }
  if (auto ct = x.request.base().find(http::field::content_type); ct != x.request.end()) {
    parts.content_type = std::string_view(ct->value());
  }
  parts.body = x.request.body();
  return idempotency::memo_key(x.route->settings->name, x.tenant, parts);
}

std::optional<server::Response> admit_principal(Gateway::Exchange& x) {
  const auto& cfg = x.runtime->settings();
  x.check_principal = !cfg.tenant.principal_header.empty();
  if (!x.check_principal) return std::nullopt;
  const auto values = field_values(x.request.base(), cfg.tenant.principal_header);
  // Like the tenant, the principal is one value: with two, the backend and the record
  // could each take a different one.
  if (values.size() > 1) {
    x.code = "principal_invalid";
    return problem(x, http::status::unauthorized, x.code, "Principal invalid",
                   "the principal header must be sent once");
  }
  // Only a hash is stored: the record must not become a directory of user ids.
  x.principal = idempotency::sha256_hex(
      "idemproxy-principal\n" +
      std::string(values.empty() ? std::string_view() : text::trim_ows(values.front())));
  return std::nullopt;
}

// The body and the fingerprint, or the fingerprint from `memo` when this exact request
// (bytes, route, tenant) was fingerprinted before (idempotency/fingerprint_memo.hpp).
std::optional<server::Response> admit_content(Gateway::Exchange& x, idempotency::FingerprintMemo* memo,
                                              obs::Metrics* metrics) {
  const bool key_in_body = x.route->key.from == settings::KeySource::body;
  std::string scope_and_path;
  auto parts = fingerprint_parts(x, scope_and_path);
  const auto key = memo ? memo_key_of(x, parts) : std::nullopt;
  if (key) {
    const auto kept = memo->find(*key);
    if (metrics) metrics->fingerprint_memo_lookup(kept.has_value());
    if (kept) {
      x.fingerprint = std::string(*kept);
      return std::nullopt;
    }
  }
  if (auto refused = admit_body(x)) return refused;
  if (key_in_body) {
    if (auto refused = admit_key(x)) return refused;
  }
  admit_fingerprint(x, parts);
  if (key) memo->insert(*key, x.fingerprint);
  return std::nullopt;
}

// Validation before anything is claimed; its failures are never stored. On success the
// request has its record id, fingerprint and principal.
std::optional<server::Response> admit(Gateway::Exchange& x, idempotency::FingerprintMemo* memo = nullptr,
                                      obs::Metrics* metrics = nullptr) {
  const auto& rs = *x.route->settings;
  x.outcome = Outcome::rejected;
  if (auto refused = admit_tenant(x)) return refused;
  // A key in the header or the query is checked before the body is read (docs/http.md's
  // order); a key in the body can only be read from the body.
  if (x.route->key.from != settings::KeySource::body) {
    if (auto refused = admit_key(x)) return refused;
  }
  if (auto refused = admit_content(x, memo, metrics)) return refused;
  if (auto refused = admit_principal(x)) return refused;
  // Every protected request needs its operation id, for the replay cache's lookup or for
  // the forward's headers: made once here.
  x.operation_id = idempotency::operation_id(x.tenant, rs.scope, x.key);
  x.claim = store::ClaimRequest{store::RecordId{x.tenant, rs.scope, x.key}, x.fingerprint,
                                x.principal, rs.lease, rs.retention, x.operation_id};
  x.waiter_key = x.tenant + '\0' + rs.scope + '\0' + x.key;
  return std::nullopt;
}

}  // namespace

idempotency::FingerprintMemo& Gateway::fingerprint_memo(const std::shared_ptr<const Runtime>& runtime) {
  // A reload may change what a fingerprint reads (fields, defaults, body limits): the
  // memo's entries belong to one configuration. Holding it also keeps its address from
  // being reused by the next one.
  if (memo_runtime_ != runtime) {
    memo_.clear();
    memo_runtime_ = runtime;
  }
  return memo_;
}

std::optional<server::Response> Gateway::admit_identity(Exchange& x) {
  if (auto refused = admit_tenant(x)) return refused;
  return admit_principal(x);
}

asio::awaitable<server::Response> Gateway::protected_request(Exchange& x) {
  const auto& rs = *x.route->settings;
  // A key-less request on an optional route is not the store's business: it passes through
  // unprotected, whatever its tenant header says.
  if (!rs.key.required && carries_no_key(x)) co_return co_await pass_through(x);
  if (auto refused = admit(x, &fingerprint_memo(x.runtime), deps_.metrics)) co_return std::move(*refused);
  if (rs.async) co_return co_await run_async(x);
  co_return co_await run_protocol(x);
}

void Gateway::Exchange::continue_from(const Exchange& a) {
  route = a.route;
  version = a.version;
  keep_alive = a.keep_alive;
  method = a.method;
  path = a.path;
  query = a.query;
  tenant = a.tenant;
  key = a.key;
  fingerprint = a.fingerprint;
  principal = a.principal;
  check_principal = a.check_principal;
  claim = a.claim;
  waiter_key = a.waiter_key;
  key_hash = a.key_hash;
  outcome = a.outcome;
  // The request's trace goes on in the job: its forward, record and spans belong to it.
  trace = a.trace;
  trace_id = a.trace_id;
  record_spans = a.record_spans;
  started_unix_ns = a.started_unix_ns;
}

namespace {

// Counts an owner for the drain, from its forward until its answer.
struct OwnerCount {
  explicit OwnerCount(std::atomic<std::size_t>& n) : n(n) { n.fetch_add(1, std::memory_order_relaxed); }
  ~OwnerCount() { n.fetch_sub(1, std::memory_order_relaxed); }
  OwnerCount(const OwnerCount&) = delete;
  OwnerCount& operator=(const OwnerCount&) = delete;
  std::atomic<std::size_t>& n;
};

}  // namespace

// The driver: performs what the protocol asks (idempotency/protocol.hpp) and resumes it
// with the outcome, until it answers. Every decision is the protocol's; every I/O is here.
asio::awaitable<server::Response> Gateway::run_protocol(Exchange& x) {
  const auto& rs = *x.route->settings;
  idempotency::ProtocolOptions options{x.fingerprint, x.principal, x.check_principal, rs.wait};
  options.refetch = rs.replay_mode == settings::ReplayMode::refetch;
  options.reconcile = rs.on_unknown_outcome == settings::UnknownOutcome::reconcile;
  options.note_payload = rs.same_payload_new_key.has_value();
  options.reject_same_payload =
      rs.same_payload_new_key && rs.same_payload_new_key->action == settings::SamePayloadAction::reject;
  idempotency::Protocol protocol(options);
  std::optional<OwnerCount> owning;
  idempotency::Event event = idempotency::Begin{};
  for (;;) {
    const idempotency::Action a = protocol.resume(event, SteadyClock::now());
    const auto step_start = x.record_spans ? obs::unix_now_ns() : 0;
    switch (a.step) {
      case Step::claim: event = co_await claim(x); break;
      case Step::read: event = co_await read(x); break;
      case Step::take_over: event = co_await take_over(x, a.fence); break;
      case Step::replace: event = co_await replace(x, a.fence); break;
      case Step::watch:
        if (!x.waiter) x.waiter.emplace(*deps_.waiters, x.waiter_key, deps_.executor);
        event = idempotency::Watching{};
        break;
      case Step::wait:
        co_await x.waiter->wait_until(a.until);
        event = idempotency::Waited{};
        break;
      case Step::forward:
        if (!owning) owning.emplace(owners_in_flight_);
        if (x.async) x.async->forwarding(rs.async->after);
        event = co_await forward_as_owner(x, a.owner);
        break;
      case Step::release: event = co_await release(x, a.fence); break;
      case Step::expire_lease: event = co_await expire_lease(x, a.fence); break;
      case Step::complete: event = co_await complete(x, a.fence); break;
      case Step::refetch: event = co_await refetch(x); break;
      case Step::note_payload: event = co_await note_payload(x); break;
      case Step::reconcile:
        if (!owning) owning.emplace(owners_in_flight_);
        event = co_await reconcile(x, a.owner);
        break;
      case Step::answer:
        // A duplicate of a long operation is pointed at its status, as its first request
        // was: the same 202, not a 409.
        if (rs.async && a.answer == idempotency::Answer::in_progress && x.row &&
            a.fenced == idempotency::Fenced::no) {
          co_return co_await accepted(x, x.row->attempt, x.row->expires_at_us);
        }
        co_return answer(x, a);
    }
    if (x.record_spans) step_span(x, a.step, step_start, event);
  }
}

// ---- The protocol's steps, each performed and told back as an event -----------------------

asio::awaitable<idempotency::Event> Gateway::claim(Exchange& x) {
  const auto t0 = SteadyClock::now();
  auto claimed = co_await deps_.store->claim(x.claim);
  // A row from the replay cache cost no store call: neither timed nor counted as one.
  if (claimed && claimed->from_cache) {
    x.from_cache = true;
  } else {
    const double took = seconds_since(t0);
    x.store_seconds = (x.store_seconds < 0 ? 0 : x.store_seconds) + took;
    deps_.metrics->store_duration(StoreOp::claim, took);
    if (!claimed) {
      deps_.metrics->store_error(store_error_kind(claimed.error()));
      x.store_error = claimed.error();
    }
  }
  if (!claimed) co_return idempotency::StoreFailed{};
  if (claimed->won) co_return idempotency::Claimed{claimed->owner};
  idempotency::Claimed lost;
  if (claimed->row_read) {
    lost.row_read = true;
    x.row = std::move(claimed->row);
    if (x.row) lost.row = view_of(*x.row, x);
  }
  co_return lost;
}

asio::awaitable<idempotency::Event> Gateway::read(Exchange& x) {
  auto row = co_await timed(*deps_.metrics, x, StoreOp::read, deps_.store->read(x.claim.id));
  if (!row) co_return idempotency::StoreFailed{};
  x.row = std::move(*row);
  co_return idempotency::RowRead{x.row ? std::optional(view_of(*x.row, x)) : std::nullopt};
}

asio::awaitable<idempotency::Event> Gateway::take_over(Exchange& x, std::int64_t seen_fence) {
  const auto& rs = *x.route->settings;
  auto taken = co_await timed(*deps_.metrics, x, StoreOp::take_over,
                              deps_.store->take_over(x.claim.id, seen_fence, rs.lease));
  if (!taken) co_return idempotency::StoreFailed{};
  if (*taken) {
    deps_.metrics->takeover();
    spdlog::info("took over an expired lease (route {}, key_hash {}): attempt {} -> {}", rs.name,
                 x.key_hash, (*taken)->attempt - 1, (*taken)->attempt);
  }
  co_return idempotency::Acquired{*taken};
}

asio::awaitable<idempotency::Event> Gateway::replace(Exchange& x, std::int64_t seen_fence) {
  auto replaced = co_await timed(*deps_.metrics, x, StoreOp::replace,
                                 deps_.store->replace_expired(x.claim, seen_fence));
  if (!replaced) co_return idempotency::StoreFailed{};
  co_return idempotency::Acquired{*replaced};
}

// Forwards as the owner, renewing the lease while the upstream works.
asio::awaitable<idempotency::Event> Gateway::forward_as_owner(Exchange& x, store::Ownership owner) {
  const auto& rs = *x.route->settings;
  x.owner = owner;
  x.attempt = owner.attempt;
  const bool backend_completes = rs.completion == settings::Completion::backend;
  auto keeper = start_lease_keeper(deps_, x.claim.id, owner, rs.lease, backend_completes);
  x.upstream = co_await forward(x, &owner);
  keeper->stop();
  idempotency::Forwarded f;
  switch (x.upstream.failure) {
    case upstream::Failure::none:
      f.result = idempotency::UpstreamResult::answered;
      f.storable = storable(x);
      if (backend_completes) f.backend = backend_record(x);
      break;
    case upstream::Failure::connect_failed:
      f.result = idempotency::UpstreamResult::not_sent;
      break;
    case upstream::Failure::timeout:
    case upstream::Failure::broken:
      f.result = idempotency::UpstreamResult::unknown;
      break;
    case upstream::Failure::response_too_large:
    case upstream::Failure::bad_response:
      f.result = idempotency::UpstreamResult::invalid;
      break;
  }
  co_return f;
}

// The route's `store` lists decide whether an answer is recorded, unless the backend says
// otherwise for this one answer (X-Idempotency-Directive).
bool Gateway::storable(Exchange& x) {
  const auto& rs = *x.route->settings;
  const auto& res = x.upstream.response;
  const auto values = field_values(res.base(), kDirectiveHeader);
  const auto directive = idempotency::parse_directive(
      values.empty() ? std::nullopt : std::optional<std::string_view>(values.front()));
  if (values.size() > 1 || directive == idempotency::Directive::invalid) {
    deps_.metrics->directive("invalid");
    spdlog::warn("ignoring an invalid {} from the backend (route {}, key_hash {}); the route's "
                 "store lists decide", kDirectiveHeader, rs.name, x.key_hash);
  } else if (directive == idempotency::Directive::release) {
    deps_.metrics->directive("release");
    return false;
  } else if (directive == idempotency::Directive::record) {
    deps_.metrics->directive("record");
    return true;
  }
  return rs.store.stores(static_cast<int>(res.result_int()));
}

// What a backend that completes in its own transaction says it recorded: the digest of
// the answer, which must be the one of the answer it sent.
idempotency::BackendRecord Gateway::backend_record(Exchange& x) {
  const auto& res = x.upstream.response;
  const auto values = field_values(res.base(), kRecordedHeader);
  if (values.empty()) {
    deps_.metrics->backend_completion("absent");
    return idempotency::BackendRecord::none;
  }
  std::string_view location;
  if (auto it = res.find(http::field::location); it != res.end()) location = it->value();
  const auto digest = idempotency::answer_digest(static_cast<int>(res.result_int()),
                                                 resource_id_from_location(location), res.body());
  if (values.size() == 1 && text::trim_ows(values.front()) == digest) {
    deps_.metrics->backend_completion("confirmed");
    return idempotency::BackendRecord::confirmed;
  }
  deps_.metrics->backend_completion("differed");
  spdlog::warn("the backend recorded an answer other than the one it sent (route {}, attempt "
               "{}, key_hash {}); the record wins",
               x.route->settings->name, x.owner.attempt, x.key_hash);
  return idempotency::BackendRecord::differs;
}

// The owner's writes wake the duplicates waiting in this process, whatever their outcome:
// they re-read the row, which decides.
asio::awaitable<idempotency::Event> Gateway::release(Exchange& x, std::int64_t fence) {
  auto released = co_await timed(*deps_.metrics, x, StoreOp::release,
                                 deps_.store->release(x.claim.id, fence));
  deps_.waiters->notify(x.waiter_key);
  if (!released) {
    spdlog::warn("release failed ({}); the lease will lapse and a retry will take over",
                 released.error().message());
    co_return idempotency::StoreFailed{};
  }
  co_return idempotency::Written{*released};
}

asio::awaitable<idempotency::Event> Gateway::expire_lease(Exchange& x, std::int64_t fence) {
  auto expired = co_await timed(*deps_.metrics, x, StoreOp::expire_lease,
                                deps_.store->expire_lease(x.claim.id, fence));
  deps_.waiters->notify(x.waiter_key);
  if (!expired) co_return idempotency::StoreFailed{};
  co_return idempotency::Written{*expired};
}

asio::awaitable<idempotency::Event> Gateway::complete(Exchange& x, std::int64_t fence) {
  const auto& rs = *x.route->settings;
  if (!x.recorded) {
    x.recorded = capture(x.upstream.response, rs);  // a retry records the same
    x.recorded->trace_id = x.trace_id;
  }
  auto completed = co_await timed(*deps_.metrics, x, StoreOp::complete,
                                  deps_.store->complete(x.claim.id, fence, *x.recorded, rs.retention));
  deps_.waiters->notify(x.waiter_key);
  if (!completed) co_return idempotency::StoreFailed{};
  x.key_expires_at_us = completed->expires_at_us;
  co_return idempotency::Completed{completed->outcome};
}

// same_payload_new_key: the payload of this new attempt, noted under its tenant, endpoint
// and principal. A detection is counted and logged with both keys' hashes (never a key);
// warn and reject act on it in the answer.
asio::awaitable<idempotency::Event> Gateway::note_payload(Exchange& x) {
  const auto& rs = *x.route->settings;
  const auto& sp = *rs.same_payload_new_key;
  if (x.operation_id.empty()) x.operation_id = idempotency::operation_id(x.tenant, x.claim.id.endpoint, x.key);
  store::PayloadNote note;
  note.tenant = x.tenant;
  note.endpoint = x.claim.id.endpoint;
  note.principal = x.principal;
  note.fingerprint = x.fingerprint;
  note.operation_id = x.operation_id;
  note.key_hash = x.key_hash;
  note.window = sp.window;
  note.keep_earlier = sp.action == settings::SamePayloadAction::reject;
  auto seen = co_await timed(*deps_.metrics, x, StoreOp::note_payload, deps_.store->note_payload(note));
  if (!seen) co_return idempotency::StoreFailed{};
  if (seen->detected) {
    deps_.metrics->same_payload_new_key(rs.name);
    spdlog::warn("same payload as a request with another key {} ms earlier (route {}, key_hash {}, "
                 "earlier key_hash {}, earlier operation {}): a client that makes a new key per "
                 "retry; action {}",
                 seen->age.count(), rs.name, x.key_hash, seen->earlier_key_hash,
                 seen->earlier_operation_id.substr(0, 12),
                 sp.action == settings::SamePayloadAction::reject ? "reject"
                 : sp.action == settings::SamePayloadAction::warn ? "warn"
                                                                  : "count");
    x.same_payload = std::move(*seen);
  }
  co_return idempotency::PayloadNoted{x.same_payload.detected};
}

// ---- The answer ----------------------------------------------------------------------------

// Why: one switch over the protocol's answers keeps each answer's status, code and outcome
// in one place, next to the others it must stay consistent with.
server::Response Gateway::answer(Exchange& x, const idempotency::Action& a) {
  using idempotency::Answer;
  const auto& rs = *x.route->settings;
  server::Response res;
  switch (a.answer) {
    case Answer::replay:
      // A completed row always has a response; anything else is a store defect.
      if (!x.row || !x.row->response) {
        res = store_unavailable(x, make_error_code(errc::store_protocol));
        break;
      }
      res = replayed(x, *x.row->response, x.row->attempt);
      x.key_expires_at_us = x.row->expires_at_us;
      x.answer_from_record = true;
      break;
    case Answer::refetched:
    case Answer::refetch_refused:
    case Answer::refetch_failed:
      res = refetch_answer(x, a.answer);
      x.answer_from_record = true;
      break;
    case Answer::recorded:
      x.outcome = Outcome::created;
      res = to_client(std::move(x.upstream.response), x);
      break;
    case Answer::released:
      x.outcome = Outcome::released;
      res = to_client(std::move(x.upstream.response), x);
      break;
    case Answer::backend_recorded:
      if (!x.row || !x.row->response) {
        res = store_unavailable(x, make_error_code(errc::store_protocol));
        break;
      }
      x.outcome = Outcome::created;
      res = replay(*x.row->response, x, /*as_replay=*/false);
      x.key_expires_at_us = x.row->expires_at_us;
      break;
    case Answer::not_sent:
      x.outcome = Outcome::released;
      x.code = "upstream_unavailable";
      res = problem(x, http::status::bad_gateway, x.code, "Upstream unavailable",
                    "the upstream refused the connection; the request was not sent and the key "
                    "was released");
      break;
    case Answer::timed_out:
      x.outcome = Outcome::unknown_outcome;
      x.code = "upstream_timeout";
      res = problem(x, http::status::gateway_timeout, x.code, "Upstream timeout",
                    "the upstream did not answer in time; the outcome is unknown, retry with the "
                    "same key");
      break;
    case Answer::invalid_response:
      x.outcome = Outcome::unknown_outcome;
      x.code = "upstream_invalid_response";
      res = problem(x, http::status::bad_gateway, x.code, "Invalid upstream response",
                    "the upstream's response was malformed or larger than allowed; retry with "
                    "the same key");
      break;
    case Answer::mismatch: res = mismatch(x); break;
    case Answer::forbidden: res = forbidden(x); break;
    case Answer::in_progress:
      res = in_progress(x);
      if (x.row) x.key_expires_at_us = x.row->expires_at_us;
      break;
    case Answer::reconcile_failed:
      x.outcome = Outcome::unknown_outcome;
      x.code = "reconcile_failed";
      res = problem(x, http::status::service_unavailable, x.code, "Outcome not known yet",
                    "whether the earlier attempt of this operation happened could not be "
                    "learnt from the upstream; nothing was forwarded; retry with the same key "
                    "after the indicated delay");
      res.set(http::field::retry_after, retry_after_seconds(rs.retry_after));
      break;
    case Answer::unrecorded:
      spdlog::error("could not record the upstream response (route {}, attempt {}): {}", rs.name,
                    x.owner.attempt, x.store_error.message());
      // The row keeps its lease until it lapses; only then can a retry take over.
      res = unrecorded(x,
                       "the upstream answered but the answer could not be recorded; retry with "
                       "the same key after the indicated delay",
                       std::max(rs.lease, rs.retry_after));
      break;
    case Answer::fenced_unrecorded:
      res = unrecorded(x,
                       "another attempt took this key over and its record holds no answer yet; "
                       "retry with the same key after the indicated delay",
                       rs.retry_after);
      break;
    case Answer::payload_reused: res = payload_reused(x); break;
    case Answer::store_unavailable:
    case Answer::none:
      res = store_unavailable(x, x.store_error ? x.store_error
                                               : make_error_code(errc::store_protocol));
      break;
  }
  // warn: said on whatever this attempt answers (never recorded: a replay of this key
  // later is not the moment of the mistake).
  if (x.same_payload.detected && rs.same_payload_new_key &&
      rs.same_payload_new_key->action == settings::SamePayloadAction::warn) {
    res.set(std::string(kWarningHeader),
            "same_payload_new_key; earlier_operation_id=\"" + x.same_payload.earlier_operation_id + "\"");
  }
  if (a.fenced != idempotency::Fenced::no) note_fenced(x, a);
  // The key's lifetime as the record holds it (docs/http.md, "Key expiry"): set only from
  // a record this request read or wrote, never guessed.
  if (x.key_expires_at_us > 0) {
    res.set(std::string(kKeyExpiresHeader), imf_fixdate_from_us(x.key_expires_at_us));
  }
  // A replay names the original's trace, as recorded (none for a record written before
  // migration 0006 or by a completion: backend route); every other answer its own.
  if (x.answer_from_record) {
    if (x.row && x.row->response) x.record_trace_id = x.row->response->trace_id;
    if (!x.record_trace_id.empty()) res.set(std::string(kTraceIdHeader), x.record_trace_id);
  } else {
    res.set(std::string(kTraceIdHeader), x.trace_id);
  }
  return res;
}

// A fenced owner is counted and logged with what its client got instead of its own answer.
void Gateway::note_fenced(Exchange& x, const idempotency::Action& a) {
  deps_.metrics->fenced_write();
  std::string_view what = "completion";
  if (a.fenced == idempotency::Fenced::release) what = "release";
  if (a.fenced == idempotency::Fenced::lease_expiry) what = "lease expiry";
  std::string_view answered = x.code;
  if (a.from_record) {
    x.fenced = fenced_answer(x.outcome);
    deps_.metrics->fenced_answer(x.fenced);
    answered = x.fenced;
  }
  spdlog::warn("{} fenced: attempt {} (fencing token {}) no longer owns the record (route {}, "
               "key_hash {}); answered: {}",
               what, x.owner.attempt, x.owner.fence, x.route->settings->name, x.key_hash, answered);
}

}  // namespace idem::gateway

namespace idem::gateway {

Examination examine(std::shared_ptr<const Runtime> runtime, server::Request& request,
                    const server::RequestContext& context) {
  Gateway::Exchange x{request, context, std::move(runtime)};
  x.keep_body_model = true;  // its canonical form is shown below
  x.version = request.version();
  x.keep_alive = request.keep_alive();
  x.method = std::string(request.method_string());
  const auto parts = split_target(request.target());
  x.path = std::string(parts.path);
  x.query = std::string(parts.query);
  x.route = x.runtime->match(x.method, x.path);

  Examination out;
  out.route = x.route;
  auto entry = enter(x);
  switch (entry.way) {
    case Way::answered:
      out.way = Examination::Way::answered;
      out.answer = std::move(entry.answer);
      out.code = std::string(x.code);
      return out;
    case Way::operation_status:
      out.way = Examination::Way::operation_status;
      return out;
    case Way::pass_through:
      out.way = Examination::Way::pass_through;
      return out;
    case Way::protected_route:
      break;
  }
  // The first steps of protected_request(), which then claims.
  if (!x.route->settings->key.required && carries_no_key(x)) {
    out.way = Examination::Way::pass_through_no_key;
    return out;
  }
  auto refused = admit(x);
  out.tenant = x.tenant;
  out.principal = x.principal;
  if (refused) {
    out.way = Examination::Way::answered;
    out.answer = std::move(refused);
    out.code = std::string(x.code);
    return out;
  }
  out.way = Examination::Way::protected_request;
  out.key = x.key;
  out.fingerprint = x.fingerprint;
  std::string scope_and_path;
  out.canonical = idempotency::canonical_form(x.route->fingerprint, fingerprint_parts(x, scope_and_path),
                                              x.body->body);
  out.operation_id = idempotency::operation_id(x.tenant, x.claim.id.endpoint, x.key);
  out.id = x.claim.id;
  return out;
}

}  // namespace idem::gateway
