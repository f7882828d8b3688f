#pragma once
// Request fingerprint and operation id. Pure code: the gateway extracts the parts of
// the request (no Beast types here) and this decides the canonical form and hashes it.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idempotency/body.hpp"
#include "idempotency/json.hpp"
#include "settings/settings.hpp"

namespace idem::idempotency {

// A route's fingerprint settings compiled once (pointers split, defaults parsed).
class FingerprintSpec {
 public:
  // Throws std::invalid_argument naming the bad pointer/default (used at config load).
  // `key`: where the route's key is; a key carried in the body (its member) or the query
  // (its parameter) is left out of the fingerprint.
  static FingerprintSpec compile(const settings::FingerprintSettings& s,
                                 const settings::KeySettings& key = {});

  // How the route's body is read (parse_body()).
  const BodySpec& body() const noexcept { return body_; }
  const std::vector<std::string>& header_names() const noexcept { return header_names_; }
  bool include_query() const noexcept { return query_; }

  struct Pointer {
    std::string text;                   // as configured, e.g. "/items/*/sku"
    std::vector<std::string> segments;  // unescaped (~0 ~1); "*" = every array element
  };

 private:
  friend struct FingerprintAccess;
  BodySpec body_;
  std::string version_;
  std::optional<std::vector<Pointer>> fields_;  // nullopt: whole body
  // No field lies at or below another (a '*' matching any position): each selects a part
  // of the body no other field reads, so a selection may move it out instead of copying.
  bool fields_disjoint_ = false;
  std::vector<Pointer> ignore_;
  std::vector<std::pair<Pointer, Json>> defaults_;
  std::vector<std::string> header_names_;  // as configured
  bool query_ = false;
  std::optional<std::vector<std::string>> key_member_;  // key.from: body: removed first
  std::optional<std::string> query_key_;                // key.from: query: not in the query
};

struct RequestParts {
  std::string_view method;
  std::string_view scope;
  std::optional<std::string_view> content_type;  // nullopt: header absent
  std::string_view body;
  // Aligned with spec.header_names(): the field's values joined by ", ", nullopt if absent.
  std::vector<std::optional<std::string>> header_values;
  std::string_view query;  // raw query string without '?', "" if none
};

// A fingerprint fails only when the body cannot be read (body.hpp).
using FingerprintStatus = BodyStatus;

struct FingerprintResult {
  FingerprintStatus status = FingerprintStatus::ok;
  std::string value;   // 64 lower-case hex characters when ok
  std::string reason;  // short, body-free explanation otherwise
};

// The fingerprint of a request whose body was read already (parse_body(): the one model
// the key reader saw too); `request.content_type` and `request.body` are not read again.
std::string fingerprint(const FingerprintSpec& spec, const RequestParts& request, const Body& body);
// The same, consuming the body's model (no copy of the parsed tree): for a caller that has
// no further use for it.
std::string fingerprint(const FingerprintSpec& spec, const RequestParts& request, Body&& body);

// The same from the raw parts: the body is read here, by spec.body() (body.hpp).
FingerprintResult fingerprint(const FingerprintSpec& spec, const RequestParts& request);

// The canonical bytes that are hashed (exposed so tests can show what is covered).
std::string canonical_form(const FingerprintSpec& spec, const RequestParts& request, const Body& body);
std::optional<std::string> canonical_form(const FingerprintSpec& spec, const RequestParts& request,
                                          FingerprintResult* failure);

// SHA-256 over tenant, scope and key (length-prefixed): 64 hex characters, stable across
// retries and takeovers. Sent upstream as X-Idempotency-Operation-Id.
std::string operation_id(std::string_view tenant, std::string_view scope, std::string_view key);

// Short (12 hex) hash of tenant and key for logs: correlates lines without revealing the key.
std::string log_hash(std::string_view tenant, std::string_view key);

// Hex SHA-256 of arbitrary bytes (principal hashing, checksums).
std::string sha256_hex(std::string_view data);
// The same digest as 32 bytes into `out`.
void sha256(std::string_view data, unsigned char* out);

}  // namespace idem::idempotency
