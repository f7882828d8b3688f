#pragma once
// Header hygiene shared by the forward and the response paths (RFC 9110 §7.6.1), and the
// names of the headers idemproxy itself speaks.
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/http/fields.hpp>

#include "common/text.hpp"
#include "store/record.hpp"

namespace idem::gateway {

// The headers the backend trusts as idemproxy's own word (operation id for its unique
// constraint, attempt, fencing token for its own writes, the record's lifetime, and on
// `completion: backend` routes the record reference it completes with). forward() sets
// them; every incoming request loses them, and their look-alikes, on every route
// (gateway/inbound.hpp). This is the one list: a new trusted header is added here and
// nowhere else.
inline constexpr std::string_view kOperationIdHeader = "X-Idempotency-Operation-Id";
inline constexpr std::string_view kAttemptHeader = "X-Idempotency-Attempt";
inline constexpr std::string_view kFencingTokenHeader = "X-Idempotency-Fencing-Token";
inline constexpr std::string_view kRecordCreatedHeader = "X-Idempotency-Record-Created";
inline constexpr std::string_view kRecordExpiresHeader = "X-Idempotency-Record-Expires";
inline constexpr std::string_view kRecordHeader = "X-Idempotency-Record";
inline constexpr std::array<std::string_view, 6> kTrustedHeaders = {
    kOperationIdHeader,   kAttemptHeader,       kFencingTokenHeader,
    kRecordCreatedHeader, kRecordExpiresHeader, kRecordHeader};

// The fields by which a backend speaks to idemproxy in its answers: the digest of the
// answer it recorded itself (`completion: backend`), and its directive to release or record
// this one answer. Read by the gateway, removed from every backend answer, never recorded.
inline constexpr std::string_view kRecordedHeader = "X-Idempotency-Recorded";
inline constexpr std::string_view kDirectiveHeader = "X-Idempotency-Directive";
inline constexpr std::array<std::string_view, 2> kBackendControls = {kRecordedHeader,
                                                                     kDirectiveHeader};

// The markers idemproxy puts on its answers: a replay, a replay's body (omitted, or the
// resource's current representation), and the key's expiry. A backend's own would make a
// first answer read as a replay, or advertise a lifetime the record does not have, so they
// are removed from every backend answer.
inline constexpr std::string_view kReplayedHeader = "Idempotent-Replayed";
inline constexpr std::string_view kReplayBodyHeader = "Idempotent-Replay-Body";
inline constexpr std::string_view kKeyExpiresHeader = "Idempotency-Key-Expires";
// The trace of the request whose answer this is: this request's own, or for a replay the
// original's, as recorded (docs/http.md, "Trace context").
inline constexpr std::string_view kTraceIdHeader = "X-Idempotency-Trace-Id";
// same_payload_new_key: warn — this request's payload came with another key a moment ago.
inline constexpr std::string_view kWarningHeader = "Idempotency-Warning";
inline constexpr std::array<std::string_view, 5> kReplayMarkers = {
    kReplayedHeader, kReplayBodyHeader, kKeyExpiresHeader, kTraceIdHeader, kWarningHeader};

// The trusted headers an owner's request carries to the backend: operation id, attempt,
// fencing token, the record's lifetime, and the record reference when there is one (an
// empty `record_reference` sets none). One place, for the gateway and verify-backend.
void set_owner_headers(boost::beast::http::fields& fields, std::string_view operation_id,
                       const store::Ownership& owner, const std::string& record_reference);

// Removes hop-by-hop fields: the fixed list plus every field named in any Connection field.
void strip_hop_by_hop(boost::beast::http::fields& fields);

// Removes the replay markers (kReplayMarkers) and the backend's control fields
// (kBackendControls): what a client receives of them is idemproxy's alone.
void strip_replay_markers(boost::beast::http::fields& fields);

// The connection options of every Connection field, in order (empty list members skipped).
std::vector<std::string_view> connection_tokens(const boost::beast::http::fields& fields);

// Every value of a field (case-insensitive name), in order.
std::vector<std::string_view> field_values(const boost::beast::http::fields& fields,
                                           std::string_view name);

// Case-insensitive ASCII comparison (common/text.hpp), as field names compare.
using text::iequals;

// Whether two field names are the same once '_' reads as '-' (case-insensitively), as CGI,
// WSGI and Rack backends read them: both X-Tenant-Id and X_Tenant_Id become HTTP_X_TENANT_ID.
bool same_name_for_cgi(std::string_view a, std::string_view b) noexcept;

// Splits "path?query" of an origin-form target.
struct TargetParts {
  std::string_view path;
  std::string_view query;  // without '?', "" when none
};
TargetParts split_target(std::string_view target) noexcept;

// The resource id recorded from a Location value: the value itself when it is printable
// ASCII, otherwise with every other byte percent-encoded (as RFC 3987 §3.1 maps an IRI to a
// URI), because the column is text and a backend may legally send obs-text bytes. The
// replayed Location header itself keeps its exact bytes (store/header_codec.hpp).
std::string resource_id_from_location(std::string_view location);

// The origin-form target a replay re-fetches for a recorded resource id (replay.mode:
// refetch), always from the one configured upstream: a path ("/orders/7") as is; an
// absolute http(s) URL by its path and query, but only when its authority is the retrying
// request's own `request_host` (its Host field) or one of `hosts` (replay.hosts, normalized
// by settings): a resource on another host is not the upstream's to answer for. A fragment
// is dropped. "" when the id names nothing this upstream can be asked for (empty, relative,
// another scheme, user information, another host): the record then replays its stored bytes.
std::string refetch_target(std::string_view resource_id, std::string_view request_host,
                           const std::vector<std::string>& hosts);

}  // namespace idem::gateway
