// The socket-free part of reading a backend response (upstream/response.hpp): the checks
// after the header and the verdict after the message, on bytes read through the same
// parser setup the pool uses.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>

#include "upstream/response.hpp"

namespace idem::upstream {
namespace {

// A SyncReadStream over fixed bytes, `piece` bytes per read (0: as many as asked for).
class BytesStream {
 public:
  BytesStream(std::string_view data, std::size_t piece) : data_(data), piece_(piece) {}
  template <class Buffers>
  std::size_t read_some(const Buffers& buffers, error_code& ec) {
    if (pos_ == data_.size()) {
      ec = asio::error::eof;
      return 0;
    }
    std::size_t want = data_.size() - pos_;
    if (piece_ > 0) want = std::min(want, piece_);
    const auto n = asio::buffer_copy(buffers, asio::buffer(data_.data() + pos_, want));
    pos_ += n;
    ec = {};
    return n;
  }
  template <class Buffers>
  std::size_t read_some(const Buffers& buffers) {
    error_code ec;
    const auto n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

 private:
  std::string_view data_;
  std::size_t piece_;
  std::size_t pos_ = 0;
};

struct Read {
  Failure failure = Failure::none;
  Verdict verdict;
  std::string body;
};

// What Pool::Impl::read_response decides for one final response, without the socket.
Read read(std::string_view bytes, bool head = false, ResponseLimits limits = {}, std::size_t piece = 0) {
  BytesStream stream(bytes, piece);
  beast::flat_buffer buffer;
  buffer.max_size(read_buffer_cap(limits));
  ResponseParser parser(limits.max_header);
  prepare_parser(parser, limits, head);
  error_code ec;
  const auto header_bytes = http::read_header(stream, buffer, parser, ec);
  Read out;
  out.failure = ec ? classify_read_error(ec) : check_header(parser, header_bytes, limits, head);
  if (out.failure != Failure::none) return out;
  if (!parser.is_done()) {
    http::read(stream, buffer, parser, ec);
    if (ec) {
      out.failure = classify_read_error(ec);
      return out;
    }
  }
  out.verdict = judge(parser, head, buffer.size());
  out.failure = out.verdict.failure;
  out.body = parser.get().body();
  return out;
}

}  // namespace

TEST_CASE("response: the header limit counts the start line and the fields together") {
  const ResponseLimits limits{100, 1000};
  const std::string start = "HTTP/1.1 200 " + std::string(40, 'r') + "\r\n";  // 55 bytes
  const std::string fields = "Content-Length: 2\r\nX-P: " + std::string(22, 'p') + "\r\n\r\n";  // 50
  REQUIRE(start.size() + fields.size() == 105);
  for (const std::size_t piece : {0, 1, 7}) {
    CAPTURE(piece);
    CHECK(read(start + fields + "ok", false, limits, piece).failure == Failure::response_too_large);
  }
  const std::string shorter = "HTTP/1.1 200 " + std::string(35, 'r') + "\r\n" + fields + "ok";  // 100
  const auto at_limit = read(shorter, false, limits);
  CHECK(at_limit.failure == Failure::none);
  CHECK(at_limit.body == "ok");
}

TEST_CASE("response: framing that is ambiguous or a coding idemproxy cannot remove is bad_response") {
  // Beast reads this by the length; RFC 9112 §6.3 by the encoding, until the close.
  CHECK(read("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 2\r\n\r\nok").failure ==
        Failure::bad_response);
  CHECK(read("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nok").failure ==
        Failure::bad_response);
  CHECK(read("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
             "2\r\nok\r\n0\r\n\r\n")
            .failure == Failure::bad_response);
  CHECK(read("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nok").failure == Failure::bad_response);
  CHECK(read("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n").failure ==
        Failure::bad_response);
  CHECK(read("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n").failure ==
        Failure::bad_response);
  // Exactly "chunked" (any case), and equal duplicate lengths, are read.
  const auto chunked = read("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n");
  CHECK(chunked.failure == Failure::none);
  CHECK(chunked.body == "ok");
  CHECK(chunked.verdict.reusable);
  const auto twice = read("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok");
  CHECK(twice.failure == Failure::none);
  CHECK(twice.verdict.reusable);
  // The framing fields of a bodiless answer delimit nothing: a HEAD answer may describe a
  // chunked GET answer.
  const auto head = read("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", true);
  CHECK(head.failure == Failure::none);
  CHECK(head.body.empty());
}

TEST_CASE("response: only a response that ends where both sides agree leaves the connection reusable") {
  CHECK(read("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").verdict.reusable);
  CHECK_FALSE(read("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokX").verdict.reusable);  // a stray byte
  CHECK_FALSE(read("HTTP/1.1 200 OK\r\n\r\nok").verdict.reusable);  // read until the close
  CHECK_FALSE(read("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok").verdict.reusable);
  CHECK_FALSE(read("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok").verdict.reusable);
  CHECK(read("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok").verdict.reusable);
  // "close" wins over "keep-alive", in HTTP/1.0 too, in one field or two.
  CHECK_FALSE(read("HTTP/1.0 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 2\r\n\r\nok").verdict.reusable);
  CHECK_FALSE(read("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nConnection: Close\r\nContent-Length: 2\r\n\r\nok")
                  .verdict.reusable);
  CHECK_FALSE(read("HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
                  .verdict.reusable);
  // A bodiless status (and any answer to HEAD) retires the connection, with or without
  // bytes after it, and never yields a body.
  for (const std::string status : {"204 No Content", "304 Not Modified"}) {
    const auto r = read("HTTP/1.1 " + status + "\r\nContent-Length: 2\r\n\r\nok");
    CHECK(r.failure == Failure::none);
    CHECK(r.body.empty());
    CHECK_FALSE(r.verdict.reusable);
  }
  const auto head = read("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", true);
  CHECK(head.body.empty());
  CHECK_FALSE(head.verdict.reusable);
  CHECK(read("HTTP/1.1 100 Continue\r\n\r\n").verdict.interim);
  CHECK(read("HTTP/1.1 101 Switching Protocols\r\n\r\n").failure == Failure::bad_response);
}

}  // namespace idem::upstream
