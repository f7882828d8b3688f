#pragma once
// W3C Trace Context (https://www.w3.org/TR/trace-context/): the traceparent and tracestate
// request headers, parsed strictly and written back. Pure functions over strings, no I/O,
// so they are unit-tested and fuzzed on their own (tests/observability/trace_context_test).
//
// What "strictly" means here, following the Recommendation's processing model:
//   - traceparent is `version-traceid-parentid-flags` in lowercase hex; version ff, an
//     all-zero trace id or parent id, uppercase hex, a wrong length or a missing dash make
//     it invalid, and then the request starts a new trace and its tracestate is dropped;
//   - version 00 is exactly 55 characters; a higher version may carry more after a `-`
//     following the flags (the first four fields are read, as the Recommendation says);
//   - a request with several traceparent fields has none (it is ambiguous);
//   - tracestate is up to 32 list members `key=value`, separated by commas with optional
//     spaces or tabs, over every tracestate field of the request in order; empty members
//     are skipped; a malformed member, a repeated key or more than 32 members make the
//     whole tracestate invalid, and it is dropped (never forwarded half-parsed).
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::obs {

using TraceId = std::array<std::uint8_t, 16>;
using SpanId = std::array<std::uint8_t, 8>;

struct TraceParent {
  std::uint8_t version = 0;
  TraceId trace_id{};
  SpanId parent_id{};
  std::uint8_t flags = 0;  // bit 0: sampled
  bool sampled() const { return (flags & 0x01) != 0; }
};

std::optional<TraceParent> parse_traceparent(std::string_view value);

// Every tracestate field of a request, in order, as one list; nullopt when invalid. An
// empty result (no members) is valid and means "no tracestate".
std::optional<std::vector<std::string>> parse_tracestate(const std::vector<std::string_view>& fields);

// Version 00: "00-<trace id>-<parent id>-<flags>".
std::string format_traceparent(const TraceId& trace, const SpanId& parent, std::uint8_t flags);
std::string format_tracestate(const std::vector<std::string>& members);

std::string to_hex(const TraceId& id);
std::string to_hex(const SpanId& id);

// Fresh random identifiers (OpenSSL's CSPRNG), never all zero.
TraceId new_trace_id();
SpanId new_span_id();

// The trace one request belongs to, as the sidecar continues it.
//   trace_id / flags: the client's, or new ones when it sent no valid traceparent;
//   client_parent: the client's span (the parent of the sidecar's server span), if any;
//   server_span: the sidecar's own span for this request.
struct RequestTrace {
  TraceId trace_id{};
  std::optional<SpanId> client_parent;
  SpanId server_span{};
  std::uint8_t flags = 0;
  std::vector<std::string> tracestate;  // forwarded unchanged when valid
  bool sampled() const { return (flags & 0x01) != 0; }
};

// Continues the client's trace from its traceparent and tracestate fields, or starts a new
// one; `sample_new` decides the sampled flag of a new trace (a client's flag is kept).
RequestTrace continue_trace(const std::vector<std::string_view>& traceparent,
                            const std::vector<std::string_view>& tracestate, bool sample_new);

}  // namespace idem::obs
