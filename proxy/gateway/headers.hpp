#pragma once
// Header hygiene shared by the forward and the response paths (RFC 9110 §7.6.1), and the
// names of the headers idemproxy itself speaks.
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/http/fields.hpp>

#include "common/text.hpp"

namespace idem::gateway {

// The headers the backend trusts as idemproxy's own word (operation id for its unique
// constraint, attempt, fencing token for its own writes). forward() sets them; every
// incoming request loses them, and their look-alikes, on every route (gateway/inbound.hpp).
// This is the one list: a new trusted header is added here and nowhere else.
inline constexpr std::string_view kOperationIdHeader = "X-Idempotency-Operation-Id";
inline constexpr std::string_view kAttemptHeader = "X-Idempotency-Attempt";
inline constexpr std::string_view kFencingTokenHeader = "X-Idempotency-Fencing-Token";
inline constexpr std::array<std::string_view, 3> kTrustedHeaders = {
    kOperationIdHeader, kAttemptHeader, kFencingTokenHeader};

// The markers idemproxy puts on replays. A backend's own would make a first answer read as
// a replay (or a replay without its body), so they are removed from every backend answer.
inline constexpr std::string_view kReplayedHeader = "Idempotent-Replayed";
inline constexpr std::string_view kReplayBodyHeader = "Idempotent-Replay-Body";
inline constexpr std::array<std::string_view, 2> kReplayMarkers = {kReplayedHeader,
                                                                   kReplayBodyHeader};

// Removes hop-by-hop fields: the fixed list plus every field named in any Connection field.
void strip_hop_by_hop(boost::beast::http::fields& fields);

// Removes the replay markers (kReplayMarkers).
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

}  // namespace idem::gateway
