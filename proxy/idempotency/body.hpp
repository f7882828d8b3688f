#pragma once
// A request body, read once by its route's format into the one model that the key reader
// (key.hpp, for keys carried in the body) and the fingerprint (fingerprint.hpp) share: what
// the key is read from is exactly what is hashed, with no second parse that could read the
// bytes differently. Pure code.
#include <optional>
#include <string>
#include <string_view>

#include "idempotency/json.hpp"

namespace idem::idempotency {

// Why a body cannot be read. Each has its own status and problem code (problem_code()).
enum class BodyStatus {
  ok,
  unsupported_media_type,  // 415: a non-empty body without, or with another, Content-Type
  invalid_json,            // 400: not strict JSON (syntax, UTF-8, duplicate names, depth)
};

struct Body {
  // The body as a tree: an empty body is null, whatever its Content-Type (there is nothing
  // to misread; "POST /orders/42/cancel" has no body).
  Json model;
};

struct BodyParse {
  BodyStatus status = BodyStatus::ok;
  Body body;           // when ok
  std::string reason;  // short and body-free otherwise (it goes to the client and the log)
};

// `content_type`: the request's Content-Type value, nullopt when the field is absent.
BodyParse parse_body(std::optional<std::string_view> content_type, std::string_view bytes);

// The stable problem code of a refusal (docs/http.md), and its HTTP status.
std::string_view problem_code(BodyStatus status);
std::string_view problem_title(BodyStatus status);
int http_status(BodyStatus status);

}  // namespace idem::idempotency
