#pragma once
// What the sidecar and a backend that completes records in its own transaction (routes
// with `completion: backend`, docs/backend.md) exchange, as pure functions. The SQL side of
// both is migration 0004 (idemproxy_parse_record, idemproxy_answer_digest): they must agree
// byte for byte, which tests/store/test_backend_completion.cpp checks against PostgreSQL.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/types.hpp"

namespace idem::idempotency {

// The record reference forwarded as X-Idempotency-Record:
//   v1.<fencing token>.<retention ms>.<hex of the scope>.<hex of the key>
// It names one claim of one record; the backend passes it, with the tenant it serves, to
// idemproxy_complete() or idemproxy_assert_owner().
std::string record_reference(std::int64_t fence, Millis retention, std::string_view scope,
                             std::string_view key);

// The digest of an answer the backend sends back in X-Idempotency-Recorded (the value
// idemproxy_complete() returns): SHA-256 over the status, the resource id and the body.
// The headers are the backend's choice of what to replay and are not part of it.
std::string answer_digest(int status, std::string_view resource_id, std::string_view body);

// The response directive (X-Idempotency-Directive) by which a backend overrides the
// route's `store` lists for one answer: "release" (nothing is remembered, e.g. input
// validation) or "record" (remembered whatever its status). Case-insensitive.
enum class Directive { none, release, record, invalid };
Directive parse_directive(std::optional<std::string_view> value);

}  // namespace idem::idempotency
