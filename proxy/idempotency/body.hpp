#pragma once
// A request body, read once by its route's format into the one model that the key reader
// (key.hpp, for keys carried in the body) and the fingerprint (fingerprint.hpp) share: what
// the key is read from is exactly what is hashed, with no second parse that could read the
// bytes differently. Pure code.
//
//   json  strict RFC 8259 (json.hpp) into an exact tree
//   form  application/x-www-form-urlencoded, bracket-nested as Stripe and Rack read it
//         (form.hpp), into the same tree: objects, arrays, strings and null
//   raw   no tree: the media type and a digest of the exact bytes
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idempotency/json.hpp"
#include "settings/settings.hpp"

namespace idem::idempotency {

// What a route accepts as its body; compiled from settings::FingerprintSettings.
struct BodySpec {
  settings::BodyFormat format = settings::BodyFormat::json;
  std::vector<std::string> media_types;  // raw: accepted "type/subtype", lower case; [] = any
  bool repeated_as_list = false;         // form: a repeated name collects into a list
};

// Why a body cannot be read. Each has its own status and problem code (problem_code()).
enum class BodyStatus {
  ok,
  unsupported_media_type,  // 415: no Content-Type, another one than the format's, a
                           //      malformed one (raw), one not in media_types (raw)
  unsupported_charset,     // 415: json, form: a charset other than UTF-8 (or US-ASCII)
  invalid_json,            // 400: not strict JSON (syntax, UTF-8, duplicate names, depth),
                           //      or not US-ASCII as its charset says
  invalid_form,            // 400: not a well-formed form (form.hpp lists every refusal)
};

struct Body {
  settings::BodyFormat format = settings::BodyFormat::json;
  // json, form: the body as a tree. An empty body is null for json and an empty object for
  // form (an empty form has no fields), whatever its Content-Type: there is nothing to
  // misread ("POST /orders/42/cancel" has no body).
  Json model;
  // raw: the canonical media type (type/subtype in lower case, parameters sorted by their
  // lower-case names, charset values in lower case), nullopt without a Content-Type (only
  // an empty body may have none), and the lower-case hex SHA-256 of the exact bytes.
  std::optional<std::string> media_type;
  std::string digest;
};

struct BodyParse {
  BodyStatus status = BodyStatus::ok;
  Body body;           // when ok
  std::string reason;  // short and body-free otherwise (it goes to the client and the log)
};

// `content_type`: the request's Content-Type value, nullopt when the field is absent.
BodyParse parse_body(const BodySpec& spec, std::optional<std::string_view> content_type,
                     std::string_view bytes);

// The stable problem code of a refusal (docs/http.md), its title and its HTTP status.
std::string_view problem_code(BodyStatus status);
std::string_view problem_title(BodyStatus status);
int http_status(BodyStatus status);

}  // namespace idem::idempotency
