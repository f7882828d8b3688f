#include "idempotency/backend_completion.hpp"

#include <boost/beast/core/string.hpp>

#include "idempotency/fingerprint.hpp"

namespace idem::idempotency {
namespace {

std::string hex_of(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0x0f]);
  }
  return out;
}

}  // namespace

std::string record_reference(std::int64_t fence, Millis retention, std::string_view scope,
                             std::string_view key) {
  return "v1." + std::to_string(fence) + '.' + std::to_string(retention.count()) + '.' +
         hex_of(scope) + '.' + hex_of(key);
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
  std::string_view v = *value;
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (boost::beast::iequals(v, "release")) return Directive::release;
  if (boost::beast::iequals(v, "record")) return Directive::record;
  return Directive::invalid;
}

}  // namespace idem::idempotency
