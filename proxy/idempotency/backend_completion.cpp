#include "idempotency/backend_completion.hpp"

#include "common/text.hpp"
#include "idempotency/fingerprint.hpp"

namespace idem::idempotency {

std::string record_reference(std::int64_t fence, Millis retention, std::string_view scope,
                             std::string_view key) {
  return "v1." + std::to_string(fence) + '.' + std::to_string(retention.count()) + '.' +
         text::to_hex(scope) + '.' + text::to_hex(key);
}

// Matches idemproxy_answer_digest(): a label, then status and resource id as text lines,
// then the body's bytes.
std::string answer_digest(int status, std::string_view resource_id, std::string_view body) {
  std::string in = "idemproxy-answer/1\n";
  in += std::to_string(status);
  in += '\n';
  in += resource_id;
  in += '\n';
  in += body;
  return sha256_hex(in);
}

Directive parse_directive(std::optional<std::string_view> value) {
  if (!value) return Directive::none;
  const std::string_view v = text::trim_ows(*value);
  if (text::iequals(v, "release")) return Directive::release;
  if (text::iequals(v, "record")) return Directive::record;
  return Directive::invalid;
}

}  // namespace idem::idempotency
