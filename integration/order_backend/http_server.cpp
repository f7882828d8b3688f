#include "http_server.hpp"

#include <cstdlib>
#include <exception>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <spdlog/spdlog.h>

namespace idem::demo {
namespace {

using tcp = asio::ip::tcp;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

}  // namespace

// Shared with every session coroutine: a session may outlive the HttpServer object when
// the io_context is torn down after it, and must not touch freed memory when it unwinds.
struct HttpServer::State {
  tcp::acceptor acceptor;
  ServerLimits limits;
  Handler handler;
  std::string name;
  std::size_t active = 0;
  bool stopping = false;

  State(asio::any_io_executor ex, ServerLimits l, Handler h, std::string n)
      : acceptor(std::move(ex)), limits(l), handler(std::move(h)), name(std::move(n)) {}

  // Counts a request as active for exactly as long as its guard lives, however the
  // session coroutine ends.
  struct ActiveGuard {
    State& s;
    explicit ActiveGuard(State& st) : s(st) { ++s.active; }
    ~ActiveGuard() { --s.active; }
    ActiveGuard(const ActiveGuard&) = delete;
    ActiveGuard& operator=(const ActiveGuard&) = delete;
  };

  static asio::awaitable<void> accept_loop(std::shared_ptr<State> self) {
    for (;;) {
      auto [ec, socket] = co_await self->acceptor.async_accept(use_tuple);
      if (self->stopping || ec == asio::error::operation_aborted) {
        co_return;
      }
      if (ec) {
        // EMFILE and friends: pause instead of spinning, keep serving the connections we have.
        spdlog::warn("{}: accept failed: {}", self->name, ec.message());
        asio::steady_timer pause(self->acceptor.get_executor(), Millis(50));
        co_await pause.async_wait(use_tuple);
        continue;
      }
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto executor = self->acceptor.get_executor();
      asio::co_spawn(executor, session(self, std::move(socket)),
                     [name = self->name](std::exception_ptr e) {
                       if (!e) return;
                       // One broken connection must never take the service down.
                       try {
                         std::rethrow_exception(e);
                       } catch (const std::exception& ex) {
                         spdlog::error("{}: connection ended by an exception: {}", name, ex.what());
                       }
                     });
    }
  }

  // The answer for a request the handler could not produce.
  static Response internal_error(const Request& req) {
    return problem(req, http::status::internal_server_error, "internal_error", "Internal error",
                   "the service failed to handle the request; see its log");
  }

  static asio::awaitable<void> session(std::shared_ptr<State> self, tcp::socket socket) {
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    const ServerLimits& limits = self->limits;
    for (bool first = true;; first = false) {
      http::request_parser<http::string_body> parser;
      parser.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
      parser.body_limit(limits.max_body_bytes);

      // A new connection is expected to send at once; a kept-alive one may sit idle.
      stream.expires_after(first ? limits.read_timeout : limits.idle_timeout);
      auto [header_ec, header_n] =
          co_await http::async_read_header(stream, buffer, parser, use_tuple);
      (void)header_n;
      if (header_ec) {
        if (header_ec == http::error::header_limit) {
          Request stub;
          stub.version(11);
          auto res = problem(stub, http::status::request_header_fields_too_large,
                             "headers_too_large", "Request headers too large",
                             "the request's header block exceeds the service's limit");
          res.keep_alive(false);
          stream.expires_after(limits.write_timeout);
          co_await http::async_write(stream, res, use_tuple);
        }
        break;  // closed, timed out or unparseable: nothing more to say on this connection
      }
      stream.expires_after(limits.read_timeout);
      if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
        http::response<http::empty_body> go_ahead{http::status::continue_, parser.get().version()};
        auto [ec, n] = co_await http::async_write(stream, go_ahead, use_tuple);
        (void)n;
        if (ec) break;
      }
      if (!parser.is_done()) {
        auto [body_ec, body_n] = co_await http::async_read(stream, buffer, parser, use_tuple);
        (void)body_n;
        if (body_ec) {
          if (body_ec == http::error::body_limit) {
            auto res =
                problem(parser.get(), http::status::payload_too_large, "request_too_large",
                        "Request body too large", "the request body exceeds the service's limit");
            res.keep_alive(false);
            stream.expires_after(limits.write_timeout);
            co_await http::async_write(stream, res, use_tuple);
          }
          break;
        }
      }
      Request req = parser.release();

      Response res;
      {
        ActiveGuard active(*self);
        // No deadline while the handler runs: it bounds its own work (database deadlines,
        // capped delays), and a timer firing here would close the socket under it.
        stream.expires_never();
        std::exception_ptr failure;
        try {
          res = co_await self->handler(req);
        } catch (...) {
          failure = std::current_exception();
        }
        if (failure) {
          try {
            std::rethrow_exception(failure);
          } catch (const std::exception& e) {
            spdlog::error("{}: {} {} failed: {}", self->name, std::string(req.method_string()),
                          std::string(req.target()), e.what());
          }
          res = internal_error(req);
        }
      }
      res.keep_alive(req.keep_alive() && !self->stopping);
      res.prepare_payload();

      stream.expires_after(limits.write_timeout);
      auto [write_ec, write_n] = co_await http::async_write(stream, res, use_tuple);
      (void)write_n;
      if (write_ec || !res.keep_alive()) {
        break;
      }
    }
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream.socket().close(ignored);
  }
};

HttpServer::HttpServer(asio::any_io_executor executor, const tcp::endpoint& endpoint,
                       ServerLimits limits, Handler handler, std::string name)
    : state_(std::make_shared<State>(std::move(executor), limits, std::move(handler),
                                     std::move(name))) {
  auto& acceptor = state_->acceptor;
  acceptor.open(endpoint.protocol());
  acceptor.set_option(asio::socket_base::reuse_address(true));
  acceptor.bind(endpoint);
  acceptor.listen(asio::socket_base::max_listen_connections);
}

HttpServer::~HttpServer() { stop(); }

std::uint16_t HttpServer::port() const { return state_->acceptor.local_endpoint().port(); }

void HttpServer::start() {
  auto executor = state_->acceptor.get_executor();
  asio::co_spawn(executor, State::accept_loop(state_), [name = state_->name](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      spdlog::critical("{}: the accept loop failed: {}", name, ex.what());
    }
    // A service that silently stopped accepting would look alive to its supervisor.
    std::_Exit(1);
  });
}

void HttpServer::stop() {
  state_->stopping = true;
  boost::system::error_code ignored;
  state_->acceptor.close(ignored);
}

std::size_t HttpServer::active_requests() const { return state_->active; }

}  // namespace idem::demo
