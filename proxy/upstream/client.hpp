#pragma once
// Keep-alive HTTP/1.1 client pool to the one configured backend. Knows nothing of
// idempotency: it sends the request it is given and reports precisely whether the
// request may have reached the backend, because the gateway's release-vs-unknown
// decision depends on it.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "common/types.hpp"

namespace idem::upstream {

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

enum class Failure {
  none,
  connect_failed,      // could not connect (refused, unreachable, connect timeout): not sent
  timeout,             // deadline passed after (part of) the request was written: unknown
  broken,              // reset/EOF after the request was written, no full response: unknown
  response_too_large,  // the response exceeded max_response_body: the backend did answer
  bad_response,        // the response could not be parsed: the backend did answer
};

struct Outcome {
  Failure failure = Failure::none;
  Response response;  // valid when failure == none
  bool reused_connection = false;
};

struct ClientTls;  // upstream/tls.hpp

struct PoolOptions {
  std::string host;
  std::uint16_t port = 80;
  Millis connect_timeout{2000};
  Millis response_timeout{30000};  // whole exchange: connect + write + read
  std::size_t max_response_body = 8u << 20;
  std::size_t max_response_header = 64u << 10;
  std::size_t max_idle = 64;   // idle connections kept per pool
  Millis idle_ttl{30000};      // idle connections older than this are closed, not reused
  // https: the TLS settings for the next new connection (upstream/tls.hpp), read once per
  // connect so a reload applies to new connections. Empty: plain HTTP. A failed
  // handshake is connect_failed: no request byte was sent.
  std::function<std::shared_ptr<const ClientTls>()> tls;
};

class Client {
 public:
  virtual ~Client() = default;
  // Sends `request` as is (the caller has prepared headers; the pool sets Host if absent,
  // keep-alive and Content-Length). Never throws for network failures.
  virtual asio::awaitable<Outcome> send(Request request) = 0;
};

// One pool per worker thread (not thread-safe; lives on one io_context).
class Pool final : public Client {
 public:
  Pool(asio::any_io_executor executor, PoolOptions options);
  ~Pool() override;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  asio::awaitable<Outcome> send(Request request) override;

  // Closes idle connections; in-flight exchanges finish.
  void shutdown();
  std::size_t idle_count() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

const char* to_string(Failure f) noexcept;

}  // namespace idem::upstream
