#pragma once
// A small HTTP/1.1 server for the demo services: one coroutine per connection on one
// io_context, keep-alive, a deadline on every read and write, size limits. Every request
// goes to one handler, which decides everything about the answer; the server only frames
// it. Not a general-purpose server: it trusts its network (the sidecar, the relay, curl).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "http_util.hpp"

namespace idem::demo {

struct ServerLimits {
  std::size_t max_header_bytes = 16 * 1024;
  std::uint64_t max_body_bytes = 1 << 20;
  Millis read_timeout{10'000};   // one request, from its first byte to its last
  Millis idle_timeout{75'000};   // waiting for the next request on a kept-alive connection
  Millis write_timeout{10'000};  // a client that stops reading the answer
};

// May throw; the server answers 500 internal_error and logs the exception.
using Handler = std::function<asio::awaitable<Response>(Request&)>;

class HttpServer {
 public:
  // Binds and listens at once (throws std::system_error on failure), so port() is known
  // before start(). The address may be reused immediately: a restarted service (the
  // crash tests restart the order API) must get its port back while old connections
  // still sit in TIME_WAIT.
  HttpServer(asio::any_io_executor executor, const asio::ip::tcp::endpoint& endpoint,
             ServerLimits limits, Handler handler, std::string name);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::uint16_t port() const;
  // Starts accepting on the executor given to the constructor.
  void start();
  // Stops accepting. Requests being handled finish and are answered with
  // "Connection: close"; idle connections stay open until the io_context stops.
  void stop();
  // Requests between "fully read" and "answer written".
  std::size_t active_requests() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace idem::demo
