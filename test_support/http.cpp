#include "test_support/http.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

namespace idem::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

// The harness must never be the component that refuses a response: tests look at large
// bodies (max_stored_body, X-Test-Body-Size) and at big header blocks on purpose.
constexpr std::uint32_t kHeaderLimit = 1u << 20;
constexpr std::uint64_t kBodyLimit = 256ull << 20;

std::string ms(Millis d) { return std::to_string(d.count()) + " ms"; }

// Shows raw bytes in a failure message: control characters escaped, long input cut.
std::string printable(std::string_view raw, std::size_t limit = 2000) {
  std::string out;
  for (std::size_t i = 0; i < raw.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(raw[i]);
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n\n";
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      text::append_hex_digits(out, c, 2);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (raw.size() > limit) {
    out += "... (" + std::to_string(raw.size()) + " bytes in all)";
  }
  return out;
}

HttpResponse to_response(http::response<http::string_body>&& message) {
  HttpResponse out;
  out.status = static_cast<int>(message.result_int());
  out.reason = std::string(message.reason());
  for (const auto& field : message) {
    out.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  out.keep_alive = message.keep_alive();
  out.version = message.version();
  out.body = std::move(message.body());
  return out;
}

// A socket on a private io_context whose every operation has a deadline. The caller's
// thread drives the io_context, so the API stays synchronous; run_for() bounds the wait,
// and an operation still pending then is cancelled (not the socket closed), which lets
// RawConnection::wait_closed() time out and keep using the connection.
class TimedSocket {
 public:
  TimedSocket() : socket_(ioc_) {}

  tcp::socket& socket() { return socket_; }

  // `start(handler)` begins one async operation that completes with (error_code, size_t).
  // Returns its result, or asio::error::timed_out if it did not finish within `timeout`.
  template <class Start>
  std::pair<error_code, std::size_t> run(Start&& start, Millis timeout) {
    std::optional<std::pair<error_code, std::size_t>> result;
    start([&result](error_code ec, std::size_t n) { result.emplace(ec, n); });
    ioc_.restart();
    ioc_.run_for(timeout);
    if (!result) {
      error_code ignored;
      socket_.cancel(ignored);
      ioc_.restart();
      ioc_.run();  // lets the cancelled operation deliver its handler
      // It may have completed for real between run_for() returning and cancel().
      if (!result || result->first == asio::error::operation_aborted) {
        return {asio::error::timed_out, result ? result->second : 0};
      }
    }
    return *result;
  }

  error_code connect(const std::string& host, std::uint16_t port, Millis timeout) {
    error_code ec;
    const tcp::endpoint endpoint(asio::ip::make_address(host, ec), port);
    if (ec) {
      return ec;
    }
    socket_.close(ec);
    auto [connect_ec, n] = run(
        [&](auto handler) {
          socket_.async_connect(endpoint, [handler](error_code e) mutable { handler(e, 0); });
        },
        timeout);
    (void)n;
    if (!connect_ec) {
      // Requests are small and latency-bound: do not let Nagle hold a header back.
      socket_.set_option(tcp::no_delay(true), ec);
    }
    return connect_ec;
  }

  void close() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

 private:
  asio::io_context ioc_{1};
  tcp::socket socket_;
};

// Whether an idle keep-alive connection is still usable: the server may have closed it
// (idle timeout, Connection: close, restart) or written something unasked (a 408).
bool idle_connection_usable(tcp::socket& socket) {
  char byte;
  const auto n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0) {
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
  return false;  // 0: closed; >0: unsolicited bytes that would corrupt the next exchange
}

bool method_has_body_semantics(std::string_view method) {
  return method == "POST" || method == "PUT" || method == "PATCH";
}

}  // namespace

// ------------------------------------------------------------------------- HttpResponse

std::optional<std::string> header_value(const Headers& headers, std::string_view name) {
  for (const auto& [n, v] : headers) {
    if (iequals(n, name)) {
      return v;
    }
  }
  return std::nullopt;
}

std::vector<std::string> header_values(const Headers& headers, std::string_view name) {
  std::vector<std::string> out;
  for (const auto& [n, v] : headers) {
    if (iequals(n, name)) {
      out.push_back(v);
    }
  }
  return out;
}

// ------------------------------------------------------------------------------ ports

std::uint16_t free_port() {
  asio::io_context ioc;
  tcp::acceptor acceptor(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  return acceptor.local_endpoint().port();
}

int connect_errno(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return errno;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Loopback connects complete (or are refused) at once, so a blocking connect is bounded.
  const int err =
      ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

bool port_open(std::uint16_t port) { return connect_errno(port) == 0; }

void wait_for_port(std::uint16_t port, Millis timeout) {
  wait_until([port] { return port_open(port); }, timeout,
             "127.0.0.1:" + std::to_string(port) + " to accept connections");
}

// -------------------------------------------------------------------------- HttpClient

struct HttpClient::Impl {
  std::string host;
  std::uint16_t port;
  TimedSocket conn;
  beast::flat_buffer buffer;
  std::size_t opened = 0;
  bool connected = false;

  void drop() {
    conn.close();
    buffer.clear();
    connected = false;
  }
};

HttpClient::HttpClient(std::uint16_t port, std::string host)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->port = port;
}

HttpClient::~HttpClient() = default;
HttpClient::HttpClient(HttpClient&&) noexcept = default;
HttpClient& HttpClient::operator=(HttpClient&&) noexcept = default;

std::size_t HttpClient::connections_opened() const { return impl_->opened; }
bool HttpClient::connected() const { return impl_->connected; }
void HttpClient::close() { impl_->drop(); }
std::uint16_t HttpClient::port() const { return impl_->port; }

HttpResponse HttpClient::request(std::string_view method, std::string_view target,
                                 const Headers& headers, std::string_view body,
                                 Millis timeout) {
  Impl& s = *impl_;
  const Deadline deadline(timeout);
  const std::string what = std::string(method) + " " + std::string(target) + " to " + s.host +
                           ":" + std::to_string(s.port);
  const auto failed = [&](std::string_view stage, const error_code& ec) -> Failure {
    s.drop();
    if (ec == asio::error::timed_out) {
      return Failure(what + ": no " + std::string(stage) + " within " + ms(timeout));
    }
    return Failure(what + ": " + std::string(stage) + " failed: " + ec.message());
  };

  if (s.connected && s.buffer.size() > 0) {
    const std::string extra = beast::buffers_to_string(s.buffer.data());
    s.drop();
    throw Failure(what + ": the server sent " + std::to_string(extra.size()) +
                  " bytes after its previous response: " + printable(extra));
  }
  if (s.connected && !idle_connection_usable(s.conn.socket())) {
    s.drop();
  }
  if (!s.connected) {
    if (auto ec = s.conn.connect(s.host, s.port, deadline.remaining())) {
      throw failed("connect", ec);
    }
    s.connected = true;
    ++s.opened;
  }

  http::request<http::string_body> req;
  req.method_string(method);
  req.target(target);
  req.version(11);
  bool has_host = false;
  bool has_framing = false;
  for (const auto& [name, value] : headers) {
    has_host = has_host || iequals(name, "Host");
    has_framing =
        has_framing || iequals(name, "Content-Length") || iequals(name, "Transfer-Encoding");
    req.insert(name, value);
  }
  if (!has_host) {
    req.set(http::field::host, s.host + ":" + std::to_string(s.port));
  }
  req.body() = std::string(body);
  if (!has_framing && (!body.empty() || method_has_body_semantics(method))) {
    req.content_length(body.size());
  }

  auto [write_ec, written] = s.conn.run(
      [&](auto handler) { http::async_write(s.conn.socket(), req, std::move(handler)); },
      deadline.remaining());
  (void)written;
  if (write_ec) {
    throw failed("request sent", write_ec);
  }

  http::response_parser<http::string_body> parser;
  parser.header_limit(kHeaderLimit);
  parser.body_limit(kBodyLimit);
  if (method == "HEAD") {
    parser.skip(true);  // the Content-Length describes a body that is not sent
  }
  auto [read_ec, read] = s.conn.run(
      [&](auto handler) {
        http::async_read(s.conn.socket(), s.buffer, parser, std::move(handler));
      },
      deadline.remaining());
  (void)read;
  if (read_ec) {
    throw failed("complete response", read_ec);
  }
  HttpResponse response = to_response(parser.release());
  if (!response.keep_alive) {
    s.drop();
  }
  return response;
}

HttpResponse HttpClient::get(std::string_view target, const Headers& headers, Millis timeout) {
  return request("GET", target, headers, {}, timeout);
}

HttpResponse HttpClient::post(std::string_view target, std::string_view body,
                              const Headers& headers, Millis timeout) {
  return request("POST", target, headers, body, timeout);
}

// ------------------------------------------------------------------------ RawConnection

struct RawConnection::Impl {
  std::string where;
  TimedSocket conn;
  std::string inbox;  // received, not yet handed to the test
  bool eof = false;   // the server closed or reset the connection
  bool open = false;

  // Reads what is available into `inbox`. False on timeout; sets eof on close or reset.
  bool read_more(Millis timeout) {
    std::array<char, 16 * 1024> chunk;
    auto [ec, n] = conn.run(
        [&](auto handler) {
          conn.socket().async_read_some(asio::buffer(chunk), std::move(handler));
        },
        timeout);
    inbox.append(chunk.data(), n);
    if (ec == asio::error::timed_out) {
      return false;
    }
    if (ec) {
      eof = true;  // EOF or a reset: either way nothing more will come
    }
    return true;
  }
};

RawConnection::RawConnection(std::uint16_t port, Millis connect_timeout, std::string host)
    : impl_(std::make_unique<Impl>()) {
  impl_->where = host + ":" + std::to_string(port);
  if (auto ec = impl_->conn.connect(host, port, connect_timeout)) {
    throw Failure("connect to " + impl_->where + " failed: " +
                  (ec == asio::error::timed_out ? "timed out after " + ms(connect_timeout)
                                                : ec.message()));
  }
  impl_->open = true;
}

RawConnection::~RawConnection() = default;
RawConnection::RawConnection(RawConnection&&) noexcept = default;
RawConnection& RawConnection::operator=(RawConnection&&) noexcept = default;

bool RawConnection::is_open() const { return impl_->open; }

void RawConnection::send(std::string_view bytes, Millis timeout) {
  Impl& s = *impl_;
  auto [ec, n] = s.conn.run(
      [&](auto handler) {
        asio::async_write(s.conn.socket(), asio::buffer(bytes.data(), bytes.size()),
                          std::move(handler));
      },
      timeout);
  if (ec) {
    throw Failure("sending " + std::to_string(bytes.size()) + " bytes to " + s.where +
                  " failed after " + std::to_string(n) + ": " +
                  (ec == asio::error::timed_out ? "timed out" : ec.message()));
  }
}

// The bytes of the next complete response in the inbox, reading more as needed; what
// arrived when the server closed first or sent something that is not HTTP; nullopt when
// `timeout` passed first.
std::optional<std::string> RawConnection::next_response_bytes(Millis timeout,
                                                              bool head_request) {
  Impl& s = *impl_;
  const Deadline deadline(timeout);
  for (;;) {
    try {
      if (auto parsed = try_parse_response(s.inbox, s.eof, head_request)) {
        std::string bytes = s.inbox.substr(0, parsed->second);
        s.inbox.erase(0, parsed->second);
        return bytes;
      }
    } catch (const Failure&) {
      // Not valid HTTP: more bytes cannot fix that, so hand over what came and let the
      // test (or parse_response) say what is wrong with it.
      return std::exchange(s.inbox, {});
    }
    if (s.eof) {
      return std::exchange(s.inbox, {});
    }
    if (!s.read_more(deadline.remaining())) {
      return std::nullopt;
    }
  }
}

std::string RawConnection::read_response_bytes(Millis timeout) {
  Impl& s = *impl_;
  auto bytes = next_response_bytes(timeout, false);
  if (!bytes) {
    throw Failure("no complete response from " + s.where + " within " + ms(timeout) +
                  "; received so far: \"" + printable(s.inbox) + "\"");
  }
  return std::move(*bytes);
}

HttpResponse RawConnection::read_response(Millis timeout, bool head_request) {
  Impl& s = *impl_;
  auto bytes = next_response_bytes(timeout, head_request);
  if (!bytes) {
    throw Failure("no complete response from " + s.where + " within " + ms(timeout) +
                  "; received so far: \"" + printable(s.inbox) + "\"");
  }
  if (bytes->empty()) {
    throw Failure(s.where + " closed the connection without a response");
  }
  return parse_response(*bytes, s.eof, head_request);
}

std::optional<HttpResponse> RawConnection::next_response(Millis timeout, bool head_request) {
  Impl& s = *impl_;
  auto bytes = next_response_bytes(timeout, head_request);
  if (!bytes || bytes->empty()) {
    return std::nullopt;
  }
  try {
    return parse_response(*bytes, s.eof, head_request);
  } catch (const Failure&) {
    return std::nullopt;  // truncated or not HTTP: no response either
  }
}

bool RawConnection::try_send(std::string_view bytes, Millis timeout) {
  try {
    send(bytes, timeout);
    return true;
  } catch (const Failure&) {
    return false;
  }
}

bool RawConnection::closed_by_peer(Millis timeout) {
  Impl& s = *impl_;
  if (!s.inbox.empty()) {
    return false;
  }
  if (!s.eof && !s.read_more(timeout)) {
    return false;  // still open
  }
  return s.inbox.empty() && s.eof;
}

std::string RawConnection::read_until_close(Millis timeout) {
  Impl& s = *impl_;
  const Deadline deadline(timeout);
  while (!s.eof) {
    if (!s.read_more(deadline.remaining())) {
      throw Failure(s.where + " did not close the connection within " + ms(timeout) +
                    "; received: \"" + printable(s.inbox) + "\"");
    }
  }
  return std::exchange(s.inbox, {});
}

bool RawConnection::wait_closed(Millis timeout) {
  Impl& s = *impl_;
  const Deadline deadline(timeout);
  while (!s.eof) {
    s.inbox.clear();
    if (!s.read_more(deadline.remaining())) {
      return false;
    }
  }
  s.inbox.clear();
  return true;
}

void RawConnection::shutdown_send() {
  error_code ignored;
  impl_->conn.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

void RawConnection::close() {
  impl_->conn.close();
  impl_->open = false;
}

void RawConnection::reset() {
  error_code ignored;
  impl_->conn.socket().set_option(asio::socket_base::linger(true, 0), ignored);
  impl_->conn.socket().close(ignored);
  impl_->open = false;
}

std::string raw_exchange(std::uint16_t port, std::string_view bytes, Millis timeout) {
  const Deadline deadline(timeout);
  RawConnection connection(port, timeout);
  connection.send(bytes, deadline.remaining());
  return connection.read_response_bytes(deadline.remaining());
}

// ---------------------------------------------------------------------------- parsing

std::optional<std::pair<HttpResponse, std::size_t>> try_parse_response(std::string_view raw,
                                                                       bool eof,
                                                                       bool head_request) {
  if (raw.empty()) {
    if (!eof) {
      return std::nullopt;
    }
    throw Failure("no response: the connection ended without a byte");
  }
  http::response_parser<http::string_body> parser;
  parser.header_limit(kHeaderLimit);
  parser.body_limit(kBodyLimit);
  parser.eager(true);
  if (head_request) {
    parser.skip(true);  // the Content-Length describes a body that is not sent
  }
  std::size_t used = 0;
  error_code ec;
  while (!parser.is_done()) {
    const std::size_t n = parser.put(asio::buffer(raw.data() + used, raw.size() - used), ec);
    used += n;
    if (!ec && parser.is_done()) {
      break;
    }
    // No error but no progress either means the parser wants bytes we do not have.
    if (ec == http::error::need_more || (!ec && (n == 0 || used == raw.size()))) {
      if (!eof) {
        return std::nullopt;
      }
      // The connection ended here: that completes a close-delimited body, and anything
      // else is a truncated response.
      ec = {};
      parser.put_eof(ec);
      if (ec) {
        throw Failure("truncated HTTP response (" + ec.message() + "): \"" + printable(raw) +
                      "\"");
      }
      break;
    }
    if (ec) {
      throw Failure("malformed HTTP response (" + ec.message() + "): \"" + printable(raw) +
                    "\"");
    }
  }
  return std::make_pair(to_response(parser.release()), used);
}

HttpResponse parse_response(std::string_view raw, bool eof, bool head_request) {
  auto parsed = try_parse_response(raw, eof, head_request);
  if (!parsed) {
    throw Failure("incomplete HTTP response: \"" + printable(raw) + "\"");
  }
  return std::move(parsed->first);
}

}  // namespace idem::test
