// See response.hpp.
#include "upstream/response.hpp"

#include <algorithm>
#include <cstdint>

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/rfc7230.hpp>

namespace idem::upstream {

namespace {

constexpr std::size_t kReadBufferSlack = 64 * 1024;

// True for a response whose body its framing fields delimit (RFC 9112 §6.3, rules 1-2).
bool has_framed_body(unsigned status, bool head) noexcept {
  return !head && status / 100 != 1 && status != 204 && status != 304;
}

// A "close" option in any Connection field: the backend will close the connection (RFC
// 9112 §9.6). Beast's keep_alive() looks only for "keep-alive" in HTTP/1.0, so an HTTP/1.0
// "Connection: keep-alive, close" read as reusable, and the next request on it would fail
// as sent-but-unanswered: an unknown outcome for a request the backend never received
// (found by fuzz/response).
bool announces_close(const http::fields& header) {
  const auto [first, last] = header.equal_range(http::field::connection);
  for (auto f = first; f != last; ++f) {
    for (const auto option : http::token_list{f->value()}) {
      if (beast::iequals(option, "close")) return true;
    }
  }
  return false;
}

}  // namespace

std::size_t read_buffer_cap(const ResponseLimits& limits) noexcept {
  return limits.max_header + kReadBufferSlack;
}

void prepare_parser(ResponseParser& parser, const ResponseLimits& limits, bool head) {
  // Trailer fields of a chunked response are dropped rather than merged into the header
  // (common/message_parser.hpp); with chunk extensions they share the header's limit.
  parser.header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(limits.max_header, UINT32_MAX)));
  parser.body_limit(limits.max_body);
  if (head) parser.skip(true);  // a HEAD response carries a length but no body
}

Failure classify_read_error(const error_code& ec) noexcept {
  if (ec == http::error::body_limit || ec == http::error::header_limit ||
      ec == http::error::buffer_overflow) {
    // The header limit (and the trailer and extension budget, and the buffer cap) is
    // reported as "too large" as well: the backend did answer, and what it sent was bigger
    // than we accept.
    return Failure::response_too_large;
  }
  if (ec == http::error::end_of_stream || ec == http::error::partial_message) {
    return Failure::broken;
  }
  if (ec.category() == http::make_error_code(http::error::bad_target).category()) {
    return Failure::bad_response;
  }
  return Failure::broken;  // reset, EPIPE, ...: the connection died under the exchange
}

Failure check_header(const ResponseParser& parser, std::size_t header_bytes,
                     const ResponseLimits& limits, bool head) noexcept {
  if (header_bytes > limits.max_header) return Failure::response_too_large;
  const auto& header = parser.get();
  if (!has_framed_body(header.result_int(), head)) return Failure::none;
  const auto encodings = header.count(http::field::transfer_encoding);
  if (encodings == 0) return Failure::none;
  if (encodings > 1 || header.count(http::field::content_length) > 0 || header.version() < 11 ||
      !beast::iequals(header[http::field::transfer_encoding], "chunked")) {
    return Failure::bad_response;
  }
  return Failure::none;
}

Verdict judge(const ResponseParser& parser, bool head, std::size_t buffered) noexcept {
  const unsigned status = parser.get().result_int();
  if (status == 101) return {Failure::bad_response, false, false};  // we never asked to switch
  if (status / 100 == 1) return {Failure::none, true, false};      // 100 Continue, 103 Early Hints

  // Pool the connection only when the exchange ended exactly at a message boundary that
  // both sides agree on: a close-delimited body, "Connection: close" or stray bytes after
  // the response all mean the stream cannot carry another request. Neither does a
  // response whose framing forbids a body (204, 304, any answer to HEAD): a backend that
  // sends one anyway leaves those bytes on the connection, maybe only after we looked, and
  // the next request would read them as its own response (a 502 for a request the backend
  // ran, or another request's answer recorded as its own). Such answers are rare on
  // protected routes; a new connection costs less.
  const bool bodiless = head || status == 204 || status == 304;
  const bool reusable = parser.keep_alive() && !announces_close(parser.get()) && !parser.need_eof() &&
                        !bodiless && buffered == 0;
  return {Failure::none, false, reusable};
}

}  // namespace idem::upstream
