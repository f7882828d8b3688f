#pragma once
// HTTP from the test's side, for the server unit tests and the end-to-end suites: a
// keep-alive client for ordinary exchanges, a raw connection for framing and disconnect
// tests (it writes exactly the bytes a test gives it, so tests can send malformed or
// ambiguous framing no real client library would produce), and a parser for what comes
// back. Every call has a deadline and throws Failure (wait.hpp) with a message naming the
// exchange when it passes, unless it says it returns instead. Objects are not
// thread-safe; give each thread its own (integration/support/concurrently.hpp).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/beast/http/status.hpp>

#include "common/text.hpp"
#include "test_support/wait.hpp"

namespace idem::test {

using Headers = std::vector<std::pair<std::string, std::string>>;

// The first value of the field `name` (matched case-insensitively), or nullopt.
std::optional<std::string> header_value(const Headers& headers, std::string_view name);
// Every value of the field `name`, in order (Set-Cookie, repeated fields).
std::vector<std::string> header_values(const Headers& headers, std::string_view name);

struct HttpResponse {
  int status = 0;
  std::string reason;
  Headers headers;  // in the order received, names as the server spelled them
  std::string body;
  bool keep_alive = true;  // what the response allows for the connection
  unsigned version = 11;   // 10 for HTTP/1.0

  // The status as Beast's enum, to compare with http::status::ok and the like.
  boost::beast::http::status result() const {
    return static_cast<boost::beast::http::status>(status);
  }

  // First value of the header, matched case-insensitively.
  std::optional<std::string> header(std::string_view name) const {
    return header_value(headers, name);
  }
  // Every value of the header, in order (Set-Cookie, repeated fields).
  std::vector<std::string> headers_named(std::string_view name) const {
    return header_values(headers, name);
  }
  bool has_header(std::string_view name) const { return header(name).has_value(); }
};

// Case-insensitive ASCII comparison, as HTTP field names compare (common/text.hpp).
using text::iequals;

// A port that was free a moment ago (bound to 127.0.0.1:0 and released). Another process
// may take it in between; tests that can use port 0 directly should.
std::uint16_t free_port();
// Waits until something accepts TCP connections on 127.0.0.1:port.
void wait_for_port(std::uint16_t port, Millis timeout = kDefaultTimeout);
// True if a TCP connection to 127.0.0.1:port succeeds right now.
bool port_open(std::uint16_t port);
// The errno of a TCP connect to 127.0.0.1:port right now (ECONNREFUSED when nobody
// listens), 0 when it succeeds.
int connect_errno(std::uint16_t port);

class HttpClient {
 public:
  explicit HttpClient(std::uint16_t port, std::string host = "127.0.0.1");
  ~HttpClient();
  HttpClient(HttpClient&&) noexcept;
  HttpClient& operator=(HttpClient&&) noexcept;

  // Sends one request on the kept-alive connection (opening one if there is none, or if the
  // server closed it while idle) and reads the whole response. Adds Host, and Content-Length
  // when `headers` sets neither Content-Length nor Transfer-Encoding; headers are sent in the
  // given order, repeats allowed. A request is never re-sent: if the connection fails after
  // sending, the exchange throws, because the tests are about what a retry means.
  HttpResponse request(std::string_view method, std::string_view target,
                       const Headers& headers = {}, std::string_view body = {},
                       Millis timeout = kDefaultTimeout);
  HttpResponse get(std::string_view target, const Headers& headers = {},
                   Millis timeout = kDefaultTimeout);
  HttpResponse post(std::string_view target, std::string_view body, const Headers& headers = {},
                    Millis timeout = kDefaultTimeout);

  // TCP connections opened so far: proves keep-alive reuse (or its absence).
  std::size_t connections_opened() const;
  bool connected() const;
  void close();
  std::uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One TCP connection under the test's full control: send arbitrary bytes, read what comes
// back, close politely or with a reset at any point.
class RawConnection {
 public:
  explicit RawConnection(std::uint16_t port, Millis connect_timeout = kDefaultTimeout,
                         std::string host = "127.0.0.1");
  ~RawConnection();
  RawConnection(RawConnection&&) noexcept;
  RawConnection& operator=(RawConnection&&) noexcept;

  void send(std::string_view bytes, Millis timeout = kDefaultTimeout);
  // Reads until one complete response is buffered and returns its bytes (bytes after it
  // stay buffered for the next call). If the server closes first, returns what arrived,
  // possibly nothing. Throws on timeout.
  std::string read_response_bytes(Millis timeout = kDefaultTimeout);
  // Like read_response_bytes, parsed; throws if the server closed without a full response.
  // `head_request`: the response answers a HEAD (its Content-Length announces no body).
  HttpResponse read_response(Millis timeout = kDefaultTimeout, bool head_request = false);
  // The next complete response, or nullopt when the connection ended, the bytes were not
  // HTTP, or `timeout` passed before one arrived: for tests where "no answer" is an outcome.
  // A 1xx interim response counts as a response.
  std::optional<HttpResponse> next_response(Millis timeout = 5s, bool head_request = false);
  // Sends all of `bytes`; false (instead of throwing) when the server has already closed
  // or reset the connection.
  bool try_send(std::string_view bytes, Millis timeout = kDefaultTimeout);
  // True when the server closes (FIN or RST) within `timeout` and sends nothing first;
  // false when bytes arrive (they stay buffered) or the connection is still open.
  bool closed_by_peer(Millis timeout = 5s);
  // Everything until the server closes (including what is already buffered).
  std::string read_until_close(Millis timeout = kDefaultTimeout);
  // True if the server closes (or resets) the connection within `timeout`; data that
  // arrives meanwhile is discarded.
  bool wait_closed(Millis timeout);
  // Half-close: the server sees end of input, we can still read.
  void shutdown_send();
  // Orderly close (FIN).
  void close();
  // Abortive close (RST): the server's next read or write on it fails.
  void reset();
  bool is_open() const;

 private:
  struct Impl;
  std::optional<std::string> next_response_bytes(Millis timeout, bool head_request);
  std::unique_ptr<Impl> impl_;
};

// Connects, sends `bytes` as they are, and returns the raw bytes of the first response (or
// whatever arrived before the server closed, possibly nothing). For malformed framing.
std::string raw_exchange(std::uint16_t port, std::string_view bytes,
                         Millis timeout = kDefaultTimeout);

// Parses one complete response from `raw`; throws Failure (with the bytes) if it is
// malformed or incomplete. `eof`: the connection ended after `raw`, which completes a body
// delimited by closing. `head_request`: it answers a HEAD, so it has no body.
HttpResponse parse_response(std::string_view raw, bool eof = true, bool head_request = false);
// Tries to parse one response from the start of `raw`: the response and the bytes it used,
// or nullopt if more bytes are needed. Throws Failure if the bytes are not valid HTTP.
std::optional<std::pair<HttpResponse, std::size_t>> try_parse_response(std::string_view raw,
                                                                       bool eof,
                                                                       bool head_request = false);

}  // namespace idem::test
