#pragma once
// How a request's body is delimited, decided from its parsed header alone, before a single
// body byte is read. Kept apart from the session (and free of I/O) so the rules that stop
// request smuggling can be tested exhaustively without sockets.
#include <cstdint>
#include <string_view>

#include <boost/beast/http/message.hpp>

#include "common/types.hpp"

namespace idem::server {

enum class BodyFraming {
  none,     // no Content-Length, no Transfer-Encoding: the request has no body
  length,   // exactly one valid Content-Length
  chunked,  // Transfer-Encoding: chunked and nothing else
  invalid,  // ambiguous or malformed: answer 400 and close the connection
};

struct FramingCheck {
  BodyFraming framing = BodyFraming::none;
  std::uint64_t length = 0;     // valid when framing == length
  std::string_view problem;     // a static reason when framing == invalid (safe to send)
};

// Applies RFC 9112 §6 strictly, on the fields as received. Beast 1.81's parser accepts
// several of these cases (equal duplicate Content-Length values, a Transfer-Encoding whose
// last coding is not chunked, which it then treats as "no body"), and a front end that
// frames differently from the backend is exactly what request smuggling exploits.
FramingCheck inspect_framing(const http::request_header<>& header) noexcept;

}  // namespace idem::server
