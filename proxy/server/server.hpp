#pragma once
// The client-facing HTTP/1.1 listener: the only place Beast's server side lives.
// It owns framing, limits and timeouts; a request that passes them is handed to the
// Handler, whose response is written back (keep-alive as the client asks).
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "common/types.hpp"
#include "settings/settings.hpp"

namespace boost::asio::ssl {
class context;
}

namespace idem::server {

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

struct RequestContext {
  asio::ip::tcp::endpoint peer;
  SteadyClock::time_point received_at;  // when the request's header was complete
  std::uint64_t connection_id = 0;
  // The peer's address as text when the listener has it (formatted once per connection);
  // empty otherwise. Valid while the request is handled.
  std::string_view peer_address;
  // On a TLS connection with a verified client certificate: its URI SANs (for
  // tenant.from: mtls). Empty otherwise. Valid while the request is handled.
  std::span<const std::string> client_uris;
};

// Called once per request that passed framing and limits. Must not throw for expected
// conditions; an exception is logged and answered with 500 by the session.
using Handler = std::function<asio::awaitable<Response>(Request&, const RequestContext&)>;

// Limits are read per request through this, so a reload applies to new requests.
using LimitsSource = std::function<settings::Limits()>;

// Counts open client connections across all workers (max_connections is per process).
struct ConnectionGauge {
  std::atomic<std::size_t> open{0};
};

// Called by the session when it answers a request itself (400/413/431/408...).
// Gives the gateway's access log and metrics the outcome. May be empty.
using RejectHook = std::function<void(const RequestContext&, int status, std::string_view code)>;

struct ListenerOptions {
  settings::Endpoint endpoint;
  bool reuse_port = true;  // one acceptor per worker thread on the same port
  int backlog = 1024;
  // Normalize request targets (server/target.hpp). Off for the admin listener: nothing it
  // serves is forwarded, and its record paths must be able to name a key "." or "..".
  bool normalize_target = true;
  // TLS: the context for the next accepted connection (server/tls.hpp), read once per
  // connection so a reload's new certificate applies to new connections. Empty: plain
  // HTTP. Never returns null when set.
  std::function<std::shared_ptr<asio::ssl::context>()> tls;
};

class Server {
 public:
  Server(asio::io_context& ioc, ListenerOptions options, LimitsSource limits, Handler handler,
         std::shared_ptr<ConnectionGauge> gauge, RejectHook on_reject = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts accepting. Throws boost::system::system_error if it cannot bind.
  void start();
  // The bound port (useful when the endpoint asked for port 0).
  std::uint16_t port() const;
  // Stops accepting; open connections finish their current request and close.
  void stop_accepting();
  // Closes idle keep-alive connections now; busy ones close after their response.
  void close_idle();
  std::size_t active_connections() const noexcept;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// RFC 9457 problem response (application/problem+json) with type, title, status, code
// and detail. `type` is "urn:idemproxy:problem:<code>".
Response make_problem(http::status status, std::string_view code, std::string_view title,
                      std::string_view detail, unsigned version = 11, bool keep_alive = true);

}  // namespace idem::server
