#include "idempotency/body.hpp"

#include <algorithm>

#include "idempotency/fingerprint.hpp"
#include "idempotency/form.hpp"
#include "idempotency/internal.hpp"

namespace idem::idempotency {

namespace {

using settings::BodyFormat;

BodyParse refused(BodyStatus status, std::string reason) {
  BodyParse out;
  out.status = status;
  out.reason = std::move(reason);
  return out;
}

// JSON and form bodies are read as UTF-8 (RFC 8259 §8.1; a form's bytes are decoded as
// UTF-8 strings). A charset the backend may honour (Spring, Rails transcode by it) would
// make the same bytes two different requests: only UTF-8 and its subset US-ASCII are
// accepted. nullopt: accepted; `ascii` says whether the charset was US-ASCII.
std::optional<BodyParse> check_charset(std::string_view content_type, bool& ascii) {
  const auto charset = detail::media_type_charset(content_type);
  ascii = charset && *charset == "us-ascii";
  if (!charset || *charset == "utf-8" || ascii) return std::nullopt;
  return refused(BodyStatus::unsupported_charset, "the body is read as UTF-8; its charset parameter "
                                                  "names another character set");
}

BodyParse json_body(std::string_view content_type, std::string_view bytes) {
  if (!detail::is_json_media_type(content_type)) {
    return refused(BodyStatus::unsupported_media_type,
                   "Content-Type must be application/json or application/*+json");
  }
  bool ascii = false;
  if (auto bad = check_charset(content_type, ascii)) return std::move(*bad);
  if (ascii && std::any_of(bytes.begin(), bytes.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
    return refused(BodyStatus::invalid_json, "invalid JSON: a byte outside US-ASCII, which the charset says it is");
  }
  std::string why;
  auto model = parse_json(bytes, &why);
  if (!model) return refused(BodyStatus::invalid_json, why);
  BodyParse out;
  out.body.model = std::move(*model);
  return out;
}

BodyParse form_body(const BodySpec& spec, std::string_view content_type, std::string_view bytes) {
  if (detail::media_type_essence(content_type) != "application/x-www-form-urlencoded") {
    return refused(BodyStatus::unsupported_media_type, "Content-Type must be application/x-www-form-urlencoded");
  }
  FormOptions options;
  options.repeated_as_list = spec.repeated_as_list;
  if (auto bad = check_charset(content_type, options.ascii_only)) return std::move(*bad);
  std::string why;
  auto model = parse_form(bytes, options, &why);
  if (!model) return refused(BodyStatus::invalid_form, why);
  BodyParse out;
  out.body.format = BodyFormat::form;
  out.body.model = std::move(*model);
  return out;
}

// The bytes are the operation; their media type says how the backend reads them, so it is
// hashed too (normalized: the same type spelt twice is one operation).
BodyParse raw_body(const BodySpec& spec, std::optional<std::string_view> content_type, std::string_view bytes) {
  BodyParse out;
  out.body.format = BodyFormat::raw;
  if (content_type) {
    out.body.media_type = detail::canonical_media_type(*content_type);
    if (!out.body.media_type) return refused(BodyStatus::unsupported_media_type, "malformed Content-Type");
    const std::string essence = out.body.media_type->substr(0, out.body.media_type->find(';'));
    if (!spec.media_types.empty() &&
        std::find(spec.media_types.begin(), spec.media_types.end(), essence) == spec.media_types.end()) {
      return refused(BodyStatus::unsupported_media_type, "this route does not accept this Content-Type "
                                                         "(fingerprint.media_types)");
    }
  } else if (!bytes.empty()) {
    return refused(BodyStatus::unsupported_media_type, "request body without Content-Type");
  }
  out.body.digest = sha256_hex(bytes);
  return out;
}

}  // namespace

BodyParse parse_body(const BodySpec& spec, std::optional<std::string_view> content_type,
                     std::string_view bytes) {
  if (spec.format == BodyFormat::raw) return raw_body(spec, content_type, bytes);
  BodyParse out;
  out.body.format = spec.format;
  if (bytes.empty()) {
    if (spec.format == BodyFormat::form) out.body.model = Json(Json::Value(Json::Object{}));
    return out;
  }
  if (!content_type) return refused(BodyStatus::unsupported_media_type, "request body without Content-Type");
  return spec.format == BodyFormat::form ? form_body(spec, *content_type, bytes) : json_body(*content_type, bytes);
}

std::string_view problem_code(BodyStatus status) {
  switch (status) {
    case BodyStatus::ok: return "";
    case BodyStatus::unsupported_media_type: return "unsupported_media_type";
    case BodyStatus::unsupported_charset: return "unsupported_charset";
    case BodyStatus::invalid_json: return "invalid_json";
    case BodyStatus::invalid_form: return "invalid_form";
  }
  return "";
}

std::string_view problem_title(BodyStatus status) {
  switch (status) {
    case BodyStatus::ok: return "";
    case BodyStatus::unsupported_media_type: return "Unsupported media type";
    case BodyStatus::unsupported_charset: return "Unsupported charset";
    case BodyStatus::invalid_json: return "Invalid JSON";
    case BodyStatus::invalid_form: return "Invalid form";
  }
  return "";
}

int http_status(BodyStatus status) {
  switch (status) {
    case BodyStatus::ok: return 200;
    case BodyStatus::unsupported_media_type:
    case BodyStatus::unsupported_charset: return 415;
    case BodyStatus::invalid_json:
    case BodyStatus::invalid_form: return 400;
  }
  return 400;
}

}  // namespace idem::idempotency
