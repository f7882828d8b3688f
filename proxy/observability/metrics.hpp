#pragma once
// Process-wide metrics, declared once. Thread-safe (atomics; labelled families behind a
// mutex only when a new label value first appears). Rendered in the Prometheus text format.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/errors.hpp"

namespace idem::obs {

// idemproxy_requests_total{route,outcome}: the contract's outcomes.
enum class Outcome {
  created,           // first request forwarded and its response recorded
  replayed,          // stored response answered
  key_reused,        // fingerprint mismatch
  in_progress,       // wait used up while the first still runs
  released,          // upstream answered outside `store` (or refused): claim released
  unknown_outcome,   // upstream timed out / reset after send: lease expired at once
  rejected,          // validation failure (4xx decided by idemproxy), forbidden principal
  store_unavailable, // PostgreSQL unreachable or too slow
  passthrough,       // unmatched route, or a key-less request on a non-required route
  accepted,          // 202: an async route's operation goes on behind the answer
  replay_failed,     // a replay's re-fetch of its resource failed (replay.mode: refetch)
};
constexpr int kOutcomeCount = 11;
std::string_view to_string(Outcome o) noexcept;

// idemproxy_store_duration_seconds{op}
enum class StoreOp {
  claim, read, take_over, replace, complete, release, renew, expire_lease, purge, cleanup,
  register_operation, find_operation, note_payload
};
constexpr int kStoreOpCount = 13;
std::string_view to_string(StoreOp op) noexcept;

// The idemproxy_store_errors_total{kind} label for a failed store call: "unavailable",
// "timeout", "busy" or "protocol" (errc::store_* and anything unexpected).
std::string_view store_error_kind(const error_code& ec) noexcept;

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Creates every outcome series (and the duration histogram) of these routes at 0, so a
  // rate or ratio over outcome="key_reused" has a series before the first conflict. Called
  // with the configured route names at start and after each reload; "unmatched" is always
  // declared. Series of routes removed by a reload stay (Prometheus counters never vanish).
  void declare_routes(const std::vector<std::string>& routes);
  void request(std::string_view route, Outcome outcome, double seconds);
  void upstream_duration(double seconds);
  void store_duration(StoreOp op, double seconds);
  // One statement that carried `calls` calls of one kind (op: "claim", "complete").
  void store_batch(std::string_view op, std::uint64_t calls);
  void takeover();
  void fenced_write();
  // A fenced owner's answer, from the record: "replayed", "in_progress", "key_reused",
  // "forbidden" or "unavailable" (idemproxy_fenced_answers_total{answer}).
  void fenced_answer(std::string_view answer);
  // `completion: backend` routes: what the backend's X-Idempotency-Recorded said of an
  // answer — "confirmed", "differed" or "absent" (the sidecar completed it).
  void backend_completion(std::string_view result);
  // Backend directives seen: "release", "record", "invalid" (ignored).
  void directive(std::string_view directive);
  // replay.mode: refetch — a replay's re-fetch: "fetched", "refused" or "failed".
  void refetch(std::string_view result);
  // on_unknown_outcome: reconcile — the backend's lookup: "found", "not_found" or "failed".
  void reconciliation(std::string_view result);
  // same_payload_new_key routes: a new key whose request carried the payload of a recent
  // one of another key (idemproxy_same_payload_new_key_total{route}).
  void same_payload_new_key(std::string_view route);
  // async routes: an operation that finished after its client got 202, by its outcome.
  void async_operation(Outcome outcome);
  void lease_renewal();
  void expired_deleted(std::uint64_t n);
  void store_error(std::string_view kind);  // e.g. "unavailable", "timeout", "busy", "protocol"
  void set_in_progress_oldest(double seconds);  // 0 when none
  // What the readiness probe last read: the binary's and the database's schema versions,
  // and whether this replica serves a newer schema that allows it.
  void set_schema(int binary_version, int database_version, bool newer_compatible);
  void replay_cache_lookup(bool hit);
  void fingerprint_memo_lookup(bool hit);
  void replay_cache_notification();
  void set_replay_cache(bool active, std::size_t entries, std::size_t bytes);
  // Spans of the OTLP exporter (tracing.hpp): "exported", "dropped" (queue full) or
  // "failed" (no attempt to export them succeeded).
  void trace_spans(std::string_view result, std::uint64_t n);
  // One more attempt at exporting a batch whose previous attempt failed.
  void trace_export_retry();

  // Reads for tests and the admin endpoint.
  std::uint64_t requests(std::string_view route, Outcome outcome) const;
  std::uint64_t takeovers() const;
  std::uint64_t fenced_writes() const;
  std::uint64_t fenced_answers(std::string_view answer) const;
  std::uint64_t backend_completions(std::string_view result) const;
  std::uint64_t directives(std::string_view directive) const;
  std::uint64_t refetches(std::string_view result) const;
  std::uint64_t same_payload_new_keys(std::string_view route) const;
  std::uint64_t async_operations(Outcome outcome) const;
  std::uint64_t reconciliations(std::string_view result) const;
  std::uint64_t replay_cache_hits() const;
  std::uint64_t fingerprint_memo_lookups(bool hit) const;
  std::uint64_t replay_cache_notifications() const;
  std::uint64_t trace_spans(std::string_view result) const;
  std::uint64_t trace_export_retries() const;

  std::string render_prometheus() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::obs
