#pragma once
// The test backend's HTTP/1.1 server: one coroutine per connection, keep-alive, on a single
// io_context thread. Business requests are recorded and answered as their X-Test-* headers
// ask; paths under /__ are the test's control endpoints (see main.cpp for the list).
#include <boost/asio/awaitable.hpp>
#include <memory>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "recorder.hpp"

namespace idem::test_backend {

class Server {
 public:
  explicit Server(boost::asio::ip::tcp::acceptor acceptor);

  // Accepts until the io_context stops.
  boost::asio::awaitable<void> run();
  // The same server over TLS on another acceptor (--tls-cert/--tls-key): calls recorded
  // alike, so a test counts what reached the backend over an https upstream.
  boost::asio::awaitable<void> run_tls(boost::asio::ip::tcp::acceptor acceptor,
                                       std::shared_ptr<boost::asio::ssl::context> ctx);

 private:
  using Request = boost::beast::http::request<boost::beast::http::string_body>;
  using Response = boost::beast::http::response<boost::beast::http::string_body>;

  boost::asio::awaitable<void> session(boost::asio::ip::tcp::socket socket);
  boost::asio::awaitable<void> tls_session(boost::asio::ip::tcp::socket socket,
                                           std::shared_ptr<boost::asio::ssl::context> ctx);
  template <class Stream>
  boost::asio::awaitable<void> serve(Stream& stream);
  // Answers /__ paths; never recorded, so a test's own polling does not show up in calls.
  Response control(const Request& req);

  boost::asio::ip::tcp::acceptor acceptor_;
  Recorder recorder_;
  Holds holds_;
};

}  // namespace idem::test_backend
