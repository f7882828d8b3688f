#pragma once
// Reading one backend response, the part that needs no socket: how the parser is set up,
// what a failed read means, and whether the connection may carry another request after
// the response. Pool::Impl::read_response (pool.cpp) drives it over the connection;
// fuzz/response.cpp drives it over arbitrary bytes and checks it against an independent
// reading of RFC 9112.
#include <cstddef>

#include "common/message_parser.hpp"
#include "upstream/client.hpp"

namespace idem::upstream {

using ResponseParser = http_parse::MessageParser<false>;

struct ResponseLimits {
  std::size_t max_header = 64u << 10;  // start line and fields together; also the budget
                                       // of chunk extensions and trailer fields together
  std::size_t max_body = 8u << 20;
};

// The read buffer never holds more unparsed input than this: body bytes are consumed as
// they arrive, so only an unfinished header, chunk line or trailer section could fill it
// (a chunk extension or trailer that never ends would otherwise grow it until the
// response timeout).
std::size_t read_buffer_cap(const ResponseLimits& limits) noexcept;

// A fresh parser for the next response (one per response, interim ones included). The
// metadata budget is the parser's constructor argument: limits.max_header.
void prepare_parser(ResponseParser& parser, const ResponseLimits& limits, bool head);

// What a failed read of the header or the body means for the exchange.
Failure classify_read_error(const error_code& ec) noexcept;

// After the header was read without error: Failure::none to go on. Two checks:
//  * size: `header_bytes` is what the header read consumed, start line included. Beast
//    applies its header limit to the start line and to the field section separately when
//    both are already buffered at its first look, so a header of up to twice the limit
//    passed when it came in one read; the limit on the whole header is enforced here
//    (fuzz/request found it on the listener, whose read_head does the same; the upstream
//    read had the same gap). Over it: response_too_large.
//  * framing, for a response whose body the framing delimits (not a 1xx, 204, 304 or an
//    answer to HEAD): bad_response for Transfer-Encoding together with Content-Length,
//    more than one Transfer-Encoding field, Transfer-Encoding in HTTP/1.0 (RFC 9112 §6.1:
//    faulty framing), or any Transfer-Encoding but exactly "chunked". Beast 1.81 reads
//    "Transfer-Encoding: gzip" followed by a Content-Length by the length (RFC 9112 §6.3
//    says the encoding wins, and that the response is then read until the connection
//    closes), and a coding other than chunked would reach the client, and the record,
//    still encoded while the answer idemproxy frames itself no longer says so. Equal
//    duplicate Content-Length values stay accepted (RFC 9110 §8.6): nobody after
//    idemproxy reads these bytes, so they cannot be read two ways.
Failure check_header(const ResponseParser& parser, std::size_t header_bytes,
                     const ResponseLimits& limits, bool head) noexcept;

struct Verdict {
  Failure failure = Failure::none;
  bool interim = false;   // a 1xx other than 101: skip it, read the next response
  bool reusable = false;  // the connection may go back to the pool
};

// After the whole response was read (parser.is_done()) and check_header passed;
// `buffered` is what the read buffer still holds past it.
Verdict judge(const ResponseParser& parser, bool head, std::size_t buffered) noexcept;

}  // namespace idem::upstream
