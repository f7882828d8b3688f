#pragma once
// One request's state on its way through the gateway, and the answers every part of the
// request path builds the same way. Private to gateway/ (gateway.cpp drives the protocol;
// long_operations.cpp adds re-fetch, reconciliation, 202 and the status resource).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <exception>

#include <boost/asio/steady_timer.hpp>

#include "gateway/gateway.hpp"
#include "idempotency/body.hpp"
#include "observability/metrics.hpp"
#include "observability/tracing.hpp"

namespace idem::gateway {

// Everything one request accumulates on its way through; also feeds the access log.
struct Gateway::Exchange {
  server::Request& request;
  const server::RequestContext& context;
  std::shared_ptr<const Runtime> runtime;
  const CompiledRoute* route = nullptr;
  unsigned version = 11;
  bool keep_alive = true;
  std::string method;
  std::string path;
  std::string query;

  std::string tenant;
  // The body as the route's format reads it, once (idempotency/body.hpp): what a body key is
  // read from and what the fingerprint hashes. Read before the body is forwarded (which
  // moves it away), and never after.
  std::optional<idempotency::BodyParse> body;
  std::string key;
  std::string fingerprint;
  std::string principal;
  bool check_principal = false;  // the configuration names a principal header
  // The body's parsed model is read again after admission (examine(): its canonical form);
  // otherwise the fingerprint consumes it.
  bool keep_body_model = false;
  store::ClaimRequest claim;  // the record's id and what a claim of it writes
  std::string waiter_key;
  std::string operation_id;  // computed once, when first needed
  // same_payload_new_key: what the note found (detected: a recent request of this payload
  // had another key), for the warning header and the refusal.
  store::PayloadSeen same_payload;

  // The protocol's driver (run_protocol): the row last handed to the protocol (its
  // events view these strings), the upstream's answer and what of it is recorded, the
  // wake-up registration, and the last store failure (for the log).
  std::optional<store::Record> row;
  upstream::Outcome upstream;
  std::optional<store::StoredResponse> recorded;
  std::optional<Waiter> waiter;
  error_code store_error;
  store::Ownership owner;  // once this request owned the record

  obs::Outcome outcome = obs::Outcome::passthrough;
  bool from_cache = false;
  std::string_view code;
  std::string_view fenced;  // a fenced owner's answer, for the access log
  std::int64_t attempt = 0;
  double store_seconds = -1;
  double upstream_seconds = -1;
  std::string key_hash;
  // The key's expiry to advertise (Idempotency-Key-Expires); 0 = none. Unix epoch µs.
  std::int64_t key_expires_at_us = 0;

  // W3C Trace Context (observability/trace_context.hpp): this request's trace, its id in
  // hex (access log, record, X-Idempotency-Trace-Id), the spans recorded when the trace is
  // sampled and an exporter is configured, and the trace of the record a replay answered.
  obs::RequestTrace trace;
  std::string trace_id;
  bool record_spans = false;
  std::int64_t started_unix_ns = 0;
  std::vector<obs::Span> spans;
  std::string record_trace_id;
  bool answer_from_record = false;  // a replay (or re-fetch) of a completed record
  // Routes with `async`: the job this exchange runs in (async_operations.cpp).
  AsyncJob* async = nullptr;

  // What admission established about the request (route, tenant, key, fingerprint,
  // principal, claim), taken over by the exchange of an async job.
  void continue_from(const Exchange& admitted);
};

// A request on a route with `async`, detached from its client's connection: it owns its
// request, context and exchange, so that it can outlive the client's wait and the 202.
struct Gateway::AsyncJob {
  AsyncJob(server::Request&& req, const server::RequestContext& ctx,
           std::shared_ptr<const Runtime> runtime, asio::any_io_executor ex);
  // Called by the driver as the forward starts: `after` counts from here.
  void forwarding(Millis after);

  server::Request request;
  std::string peer_address;
  std::vector<std::string> client_uris;
  server::RequestContext context;
  std::optional<Exchange> x;
  // Woken (cancelled) when the job finishes and when the forward starts; expires when
  // `after` has passed since then.
  asio::steady_timer signal;
  std::optional<server::Response> answer;  // the protocol's, once finished
  std::exception_ptr failure;
  bool finished = false;
  bool detached = false;  // the client was answered 202
};

double seconds_since(SteadyClock::time_point t);

// Times one store call and accounts its failure; the caller decides what a failure means.
template <class T>
asio::awaitable<result<T>> timed(obs::Metrics& metrics, Gateway::Exchange& x, obs::StoreOp op,
                                 asio::awaitable<result<T>> call) {
  const auto t0 = SteadyClock::now();
  auto r = co_await std::move(call);
  const double took = seconds_since(t0);
  x.store_seconds = (x.store_seconds < 0 ? 0 : x.store_seconds) + took;
  metrics.store_duration(op, took);
  if (!r) {
    metrics.store_error(obs::store_error_kind(r.error()));
    x.store_error = r.error();
  }
  co_return r;
}

// 503: the store did not answer (x.store_error, or `ec`).
server::Response store_unavailable(Gateway::Exchange& x, const error_code& ec);

// traceparent (with `parent` as the backend's parent span) and tracestate on a request to
// the backend, replacing the client's.
void set_trace_headers(http::fields& fields, const Gateway::Exchange& x, const obs::SpanId& parent);

// A finished child span of the request's server span (only when x.record_spans).
void add_span(Gateway::Exchange& x, std::string name, obs::SpanKind kind, std::int64_t start_ns,
              const obs::SpanId& id, bool error);


// An RFC 9457 problem in the client's HTTP version and connection mode.
server::Response problem(const Gateway::Exchange& x, http::status status, std::string_view code,
                         std::string_view title, std::string_view detail);

// The response the client sees from the upstream (per-hop fields and idemproxy's own
// markers removed).
server::Response to_client(upstream::Response&& up, const Gateway::Exchange& x);

// A recorded answer; `as_replay`: marked as one.
server::Response replay(const store::StoredResponse& stored, const Gateway::Exchange& x,
                        bool as_replay = true);

// The client's X-Forwarded-For chain with the client's own address appended.
std::string forwarded_for(const Gateway::Exchange& x);

// The target a replay of `record` re-fetches on this request's route (refetch_target() with
// the request's Host and the route's replay.hosts); "" when it replays its stored bytes.
std::string refetch_target_of(const Gateway::Exchange& x, const store::Record& record);

// "Retry-After" seconds for a delay, at least 1.
std::string retry_after_seconds(Millis d);


}  // namespace idem::gateway
