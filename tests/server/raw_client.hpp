#pragma once
// A deliberately dumb blocking HTTP client for server tests: it writes exactly the bytes a
// test gives it (so tests can send malformed or ambiguous framing that no real client
// library would produce) and parses responses with Beast's parser. Plain POSIX sockets
// with SO_RCVTIMEO, so a server bug makes a test fail after a few seconds instead of
// hanging the suite (Asio's blocking reads ignore SO_RCVTIMEO).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

namespace idem::test {

namespace http = boost::beast::http;

class RawClient {
 public:
  using Response = http::response<http::string_body>;

  // Returns 0 on success, else the errno of connect() (ECONNREFUSED when nobody listens).
  int connect(std::uint16_t port, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    close();
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return errno;
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      const int err = errno;
      close();
      return err;
    }
    return 0;
  }

  RawClient() = default;
  explicit RawClient(std::uint16_t port) {
    if (const int err = connect(port); err != 0) {
      throw std::runtime_error("connect failed: " + std::to_string(err));
    }
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    buffer_.clear();
  }

  // False when the peer has already reset the connection.
  bool send(std::string_view data) {
    while (!data.empty()) {
      const auto n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  // One complete response, or nullopt when the connection ended (or the receive timeout
  // passed) before one arrived. A 1xx interim response counts as a response.
  std::optional<Response> read_response(bool head_request = false) {
    http::response_parser<http::string_body> parser;
    parser.eager(true);
    parser.body_limit(boost::none);
    if (head_request) parser.skip(true);
    for (;;) {
      if (buffer_.size() > 0) {
        boost::system::error_code ec;
        const auto used = parser.put(buffer_.data(), ec);
        buffer_.consume(used);
        if (parser.is_done()) return parser.release();
        if (ec && ec != http::error::need_more) return std::nullopt;
        if (!ec && used > 0) continue;
      }
      const auto n = receive();
      if (n == 0) {
        if (!parser.got_some()) return std::nullopt;
        boost::system::error_code ec;
        parser.put_eof(ec);
        if (!ec && parser.is_done()) return parser.release();
        return std::nullopt;
      }
      if (n < 0) return std::nullopt;
    }
  }

  // True when the server closed (FIN or RST) and nothing else was sent first; false on
  // unexpected data or when the receive timeout passed with the connection still open.
  bool closed_by_peer() {
    if (buffer_.size() > 0) return false;
    const auto n = receive();
    if (n == 0) return true;
    return n < 0 && last_errno_ == ECONNRESET;
  }

  int fd() const noexcept { return fd_; }

 private:
  // >0 bytes appended to the buffer, 0 on EOF, <0 on error (timeout included).
  long receive() {
    for (;;) {
      auto space = buffer_.prepare(16 * 1024);
      const auto n = ::recv(fd_, space.data(), space.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        last_errno_ = errno;
        return -1;
      }
      buffer_.commit(static_cast<std::size_t>(n));
      return n;
    }
  }

  int fd_ = -1;
  int last_errno_ = 0;
  boost::beast::flat_buffer buffer_;
};

}  // namespace idem::test
