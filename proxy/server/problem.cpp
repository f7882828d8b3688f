// RFC 9457 problem documents. Every refusal the proxy produces itself goes through here so
// clients can rely on one shape: {type, title, status, code, detail}.
#include <cstdio>
#include <string>

#include "server/server.hpp"

namespace idem::server {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when it is malformed
// (overlong, surrogate, out of range or truncated). Details may quote client input, and
// one stray byte must not turn the whole document into invalid JSON.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) noexcept {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;   // no overlong forms
    if (c == 0xED) hi = 0x9F;   // no UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;   // no overlong forms
    if (c == 0xF4) hi = 0x8F;   // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
          } else {
            out.push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    if (const auto n = utf8_sequence_length(s, i); n != 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\\ufffd";  // U+FFFD REPLACEMENT CHARACTER for each malformed byte
      ++i;
    }
  }
  out.push_back('"');
}

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
