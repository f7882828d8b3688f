// common/io_now.hpp: the parse of bytes already buffered, which decides exactly what
// Beast's read would have decided from the same bytes and leaves the rest to it, and the
// send that takes what the kernel accepts without waiting. Real sockets (a socketpair),
// real Beast reads for the comparison.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>

#include "common/io_now.hpp"
#include "common/message_parser.hpp"

using namespace idem;

namespace {

constexpr std::string_view kRequest =
    "POST /orders HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
constexpr std::size_t kHeaderBytes = kRequest.size() - 5;

beast::flat_buffer holding(std::string_view bytes) {
  beast::flat_buffer b;
  const auto n = asio::buffer_copy(b.prepare(bytes.size()), asio::buffer(bytes.data(), bytes.size()));
  b.commit(n);
  return b;
}

std::string text(const beast::flat_buffer& b) {
  return {static_cast<const char*>(b.cdata().data()), b.cdata().size()};
}

struct Pair {
  asio::io_context io;
  asio::local::stream_protocol::socket a{io}, b{io};
  Pair() { asio::local::connect_pair(a, b); }
};

}  // namespace

TEST_CASE("io_now: a buffered request is parsed whole, header then body, with Beast's counts") {
  auto buffer = holding(kRequest);
  http_parse::MessageParser<true> parser(8192);
  error_code ec;
  std::size_t used = 0;
  REQUIRE(io_now::parse_buffered(parser, buffer, io_now::HeaderDone{}, ec, used));
  CHECK_FALSE(ec);
  CHECK(parser.is_header_done());
  CHECK_FALSE(parser.is_done());
  CHECK(used == kHeaderBytes);  // what http::read_header reports
  CHECK(text(buffer) == "hello");

  parser.eager(true);
  std::size_t body_used = 0;
  REQUIRE(io_now::parse_buffered(parser, buffer, io_now::MessageDone{}, ec, body_used));
  CHECK_FALSE(ec);
  CHECK(parser.is_done());
  CHECK(parser.get().body() == "hello");
  CHECK(body_used == 5);
  CHECK(buffer.size() == 0);
}

TEST_CASE("io_now: an incomplete header is left to Beast's read, which finishes it") {
  Pair p;
  // Half the header is buffered, the rest arrives on the socket.
  auto buffer = holding(kRequest.substr(0, 20));
  http_parse::MessageParser<true> parser(8192);
  error_code ec;
  std::size_t used = 0;
  CHECK_FALSE(io_now::parse_buffered(parser, buffer, io_now::HeaderDone{}, ec, used));
  CHECK_FALSE(ec);  // need_more is not a failure
  CHECK(used == 0);
  CHECK(buffer.size() == 20);  // nothing consumed: Beast's read starts from the same bytes

  asio::write(p.b, asio::buffer(kRequest.substr(20)));
  used += http::read_header(p.a, buffer, parser, ec);
  REQUIRE_FALSE(ec);
  CHECK(used == kHeaderBytes);
  CHECK(parser.get().target() == "/orders");
}

TEST_CASE("io_now: pipelined requests: the header parse stops at the first request's header") {
  const std::string two = std::string(kRequest) + std::string(kRequest);
  auto buffer = holding(two);
  http_parse::MessageParser<true> parser(8192);
  error_code ec;
  std::size_t used = 0;
  REQUIRE(io_now::parse_buffered(parser, buffer, io_now::HeaderDone{}, ec, used));
  CHECK(used == kHeaderBytes);
  parser.eager(true);
  REQUIRE(io_now::parse_buffered(parser, buffer, io_now::MessageDone{}, ec, used));
  CHECK(parser.get().body() == "hello");
  CHECK(text(buffer) == kRequest);  // the second request untouched
}

TEST_CASE("io_now: a malformed or oversized header is decided from the buffer, as Beast decides it") {
  {
    auto buffer = holding("POST /orders HTTP/1.1\r\nBad Field: x\r\n\r\n");
    http_parse::MessageParser<true> parser(8192);
    error_code ec;
    std::size_t used = 0;
    CHECK(io_now::parse_buffered(parser, buffer, io_now::HeaderDone{}, ec, used));
    CHECK(ec == http::error::bad_field);
  }
  {
    auto buffer = holding(kRequest);
    http_parse::MessageParser<true> parser(8192);
    parser.header_limit(16);
    error_code ec;
    std::size_t used = 0;
    CHECK(io_now::parse_buffered(parser, buffer, io_now::HeaderDone{}, ec, used));
    CHECK(ec == http::error::header_limit);
  }
}

TEST_CASE("io_now: a body still on its way is left to Beast's read") {
  Pair p;
  auto buffer = holding(kRequest.substr(0, kHeaderBytes + 2));
  http_parse::MessageParser<true> parser(8192);
  error_code ec;
  std::size_t used = 0;
  REQUIRE(io_now::parse_buffered(parser, buffer, io_now::HeaderDone{}, ec, used));
  parser.eager(true);
  CHECK_FALSE(io_now::parse_buffered(parser, buffer, io_now::MessageDone{}, ec, used));
  CHECK_FALSE(ec);
  asio::write(p.b, asio::buffer(std::string_view("llo")));
  http::read(p.a, buffer, parser, ec);
  REQUIRE_FALSE(ec);
  CHECK(parser.get().body() == "hello");
}

TEST_CASE("io_now: send_now sends both buffers in one call, and what is left after a partial send") {
  Pair p;
  const std::string head = "head|", body = "body";
  const std::array<asio::const_buffer, 2> bufs{asio::buffer(head), asio::buffer(body)};
  error_code ec;
  CHECK(io_now::send_now(p.a.native_handle(), bufs, ec) == 9);
  CHECK_FALSE(ec);
  std::array<char, 16> got{};
  CHECK(::read(p.b.native_handle(), got.data(), got.size()) == 9);
  CHECK(std::string_view(got.data(), 9) == "head|body");

  const auto rest = io_now::after(bufs, 7);
  CHECK(rest[0].size() == 0);
  CHECK(std::string_view(static_cast<const char*>(rest[1].data()), rest[1].size()) == "dy");
  CHECK(asio::buffer_size(io_now::after(bufs, 0)) == 9);
}

TEST_CASE("io_now: a full send buffer is not a failure; a closed peer is, without SIGPIPE") {
  Pair p;
  const std::string chunk(64 * 1024, 'x');
  const std::array<asio::const_buffer, 2> bufs{asio::buffer(chunk), asio::const_buffer()};
  error_code ec;
  std::size_t total = 0;
  // Nobody reads: the kernel takes bytes until its buffers are full, then nothing (0, no
  // error), and the caller would wait with an Asio write.
  for (int i = 0; i < 1000; ++i) {
    const std::size_t n = io_now::send_now(p.a.native_handle(), bufs, ec);
    REQUIRE_FALSE(ec);
    if (n == 0) break;
    total += n;
  }
  CHECK(total > 0);
  CHECK(io_now::send_now(p.a.native_handle(), bufs, ec) == 0);
  CHECK_FALSE(ec);

  p.b.close();
  // The process would die of SIGPIPE here without MSG_NOSIGNAL.
  CHECK(io_now::send_now(p.a.native_handle(), bufs, ec) == 0);
  CHECK(ec);
}
