#include "idempotency/body.hpp"

#include "idempotency/internal.hpp"

namespace idem::idempotency {

namespace {

BodyParse refused(BodyStatus status, std::string reason) {
  BodyParse out;
  out.status = status;
  out.reason = std::move(reason);
  return out;
}

}  // namespace

BodyParse parse_body(std::optional<std::string_view> content_type, std::string_view bytes) {
  BodyParse out;
  if (bytes.empty()) return out;  // null
  if (!content_type) return refused(BodyStatus::unsupported_media_type, "request body without Content-Type");
  if (!detail::is_json_media_type(*content_type)) {
    return refused(BodyStatus::unsupported_media_type,
                   "Content-Type must be application/json or application/*+json");
  }
  std::string why;
  auto model = parse_json(bytes, &why);
  if (!model) return refused(BodyStatus::invalid_json, why);
  out.body.model = std::move(*model);
  return out;
}

std::string_view problem_code(BodyStatus status) {
  switch (status) {
    case BodyStatus::ok: return "";
    case BodyStatus::unsupported_media_type: return "unsupported_media_type";
    case BodyStatus::invalid_json: return "invalid_json";
  }
  return "";
}

std::string_view problem_title(BodyStatus status) {
  switch (status) {
    case BodyStatus::ok: return "";
    case BodyStatus::unsupported_media_type: return "Unsupported media type";
    case BodyStatus::invalid_json: return "Invalid JSON";
  }
  return "";
}

int http_status(BodyStatus status) {
  switch (status) {
    case BodyStatus::ok: return 200;
    case BodyStatus::unsupported_media_type: return 415;
    case BodyStatus::invalid_json: return 400;
  }
  return 400;
}

}  // namespace idem::idempotency
