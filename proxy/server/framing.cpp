#include "server/framing.hpp"

#include <boost/beast/core/string.hpp>

namespace idem::server {
namespace {

FramingCheck invalid(std::string_view why) noexcept {
  return {BodyFraming::invalid, 0, why};
}

// RFC 9110 §8.6: Content-Length = 1*DIGIT. The list form ("5, 5") that RFC 9112 lets a
// recipient collapse is refused: a proxy gains nothing from accepting it, and a backend
// that reads it differently would frame the stream differently from us.
bool parse_content_length(std::string_view text, std::uint64_t& out) noexcept {
  if (text.empty()) return false;
  std::uint64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return false;  // would overflow
    value = value * 10 + digit;
  }
  out = value;
  return true;
}

}  // namespace

FramingCheck inspect_framing(const http::request_header<>& header) noexcept {
  const auto lengths = header.count(http::field::content_length);
  const auto encodings = header.count(http::field::transfer_encoding);

  if (lengths > 0 && encodings > 0) {
    // RFC 9112 §6.3 lets a server let Transfer-Encoding win; a proxy must not, because the
    // next hop may pick the other one.
    return invalid("both Content-Length and Transfer-Encoding are present");
  }

  if (encodings > 0) {
    // HTTP/1.0 has no chunked coding; RFC 9112 §6.1 says to treat such framing as faulty.
    if (header.version() < 11) return invalid("Transfer-Encoding in an HTTP/1.0 request");
    // Several fields combine into one list; whatever they hold, more than one coding is not
    // "exactly chunked". Other codings (gzip, ...) would reach the gateway still encoded
    // while the forwarded request no longer says so, so they are refused as well.
    if (encodings > 1) return invalid("more than one Transfer-Encoding field");
    const auto value = header[http::field::transfer_encoding];
    if (!beast::iequals(value, "chunked")) {
      return invalid("Transfer-Encoding other than exactly \"chunked\"");
    }
    return {BodyFraming::chunked, 0, {}};
  }

  if (lengths > 1) return invalid("more than one Content-Length field");
  if (lengths == 1) {
    std::uint64_t length = 0;
    if (!parse_content_length(header[http::field::content_length], length)) {
      return invalid("invalid Content-Length");
    }
    return {BodyFraming::length, length, {}};
  }
  return {BodyFraming::none, 0, {}};
}

}  // namespace idem::server
