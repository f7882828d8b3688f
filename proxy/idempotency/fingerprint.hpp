#pragma once
// Request fingerprint and operation id. Pure code: the gateway extracts the parts of
// the request (no Beast types here) and this decides the canonical form and hashes it.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idempotency/json.hpp"
#include "settings/settings.hpp"

namespace idem::idempotency {

// A route's fingerprint settings compiled once (pointers split, defaults parsed).
class FingerprintSpec {
 public:
  // Throws std::invalid_argument naming the bad pointer/default (used at config load).
  static FingerprintSpec compile(const settings::FingerprintSettings& s);

  const std::vector<std::string>& header_names() const noexcept { return header_names_; }
  bool include_query() const noexcept { return query_; }

  struct Pointer {
    std::string text;                   // as configured, e.g. "/items/*/sku"
    std::vector<std::string> segments;  // unescaped (~0 ~1); "*" = every array element
  };

 private:
  friend struct FingerprintAccess;
  std::string version_;
  std::optional<std::vector<Pointer>> fields_;  // nullopt: whole body
  std::vector<Pointer> ignore_;
  std::vector<std::pair<Pointer, Json>> defaults_;
  std::vector<std::string> header_names_;  // as configured
  bool query_ = false;
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

enum class FingerprintStatus { ok, unsupported_media_type, invalid_json };

struct FingerprintResult {
  FingerprintStatus status = FingerprintStatus::ok;
  std::string value;   // 64 lower-case hex characters when ok
  std::string reason;  // short, body-free explanation otherwise
};

// An empty body fingerprints as JSON null whatever its Content-Type; a non-empty body
// needs application/json or application/*+json (parameters allowed) and valid JSON.
FingerprintResult fingerprint(const FingerprintSpec& spec, const RequestParts& request);

// The canonical bytes that are hashed (exposed so tests can show what is covered).
std::optional<std::string> canonical_form(const FingerprintSpec& spec, const RequestParts& request,
                                          FingerprintResult* failure);

// SHA-256 over tenant, scope and key (length-prefixed): 64 hex characters, stable across
// retries and takeovers. Sent upstream as X-Idempotency-Operation-Id.
std::string operation_id(std::string_view tenant, std::string_view scope, std::string_view key);

// Short (12 hex) hash of tenant and key for logs: correlates lines without revealing the key.
std::string log_hash(std::string_view tenant, std::string_view key);

// Hex SHA-256 of arbitrary bytes (principal hashing, checksums).
std::string sha256_hex(std::string_view data);

}  // namespace idem::idempotency
