#pragma once
// One request's state on its way through the gateway, and the answers every part of the
// request path builds the same way. Private to gateway/ (gateway.cpp drives the protocol;
// long_operations.cpp adds re-fetch, reconciliation, 202 and the status resource).
#include <optional>
#include <string>
#include <string_view>

#include "gateway/gateway.hpp"
#include "observability/metrics.hpp"

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
  std::string key;
  std::string fingerprint;
  std::string principal;
  bool check_principal = false;  // the configuration names a principal header
  store::ClaimRequest claim;  // the record's id and what a claim of it writes
  std::string waiter_key;
  std::string operation_id;  // computed once, when first needed

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
};


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

// "Retry-After" seconds for a delay, at least 1.
std::string retry_after_seconds(Millis d);

double seconds_since(SteadyClock::time_point t);

}  // namespace idem::gateway
