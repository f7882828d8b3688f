// RFC 9457 problem documents. Every refusal the proxy produces itself goes through here so
// clients can rely on one shape: {type, title, status, code, detail}.
#include <cstdio>
#include <string>

#include "common/json_text.hpp"
#include "server/server.hpp"

namespace idem::server {
namespace {

using text::append_json_string;

}  // namespace

Response make_problem(http::status status, std::string_view code, std::string_view title,
                      std::string_view detail, unsigned version, bool keep_alive) {
  if (title.empty()) title = http::obsolete_reason(status);

  std::string body;
  body.reserve(96 + 2 * code.size() + title.size() + detail.size());
  body += "{\"type\":";
  append_json_string(body, std::string("urn:idemproxy:problem:").append(code));
  body += ",\"title\":";
  append_json_string(body, title);
  body += ",\"status\":";
  body += std::to_string(static_cast<unsigned>(status));
  body += ",\"code\":";
  append_json_string(body, code);
  body += ",\"detail\":";
  append_json_string(body, detail);
  body += '}';

  Response res{status, version};
  res.set(http::field::content_type, "application/problem+json");
  // Refusals describe this request only; a shared cache must never hand them to others.
  res.set(http::field::cache_control, "no-store");
  res.body() = std::move(body);
  res.keep_alive(keep_alive);
  res.prepare_payload();
  return res;
}

}  // namespace idem::server
