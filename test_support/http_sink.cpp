#include "test_support/http_sink.hpp"

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

namespace idem::test {

namespace bhttp = boost::beast::http;
using boost::asio::ip::tcp;

HttpSink::HttpSink(std::deque<int> statuses)
    : statuses_(statuses.empty() ? std::deque<int>{200} : std::move(statuses)),
      acceptor_(ioc_, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)) {
  thread_ = std::thread([this] { serve(); });
}

HttpSink::~HttpSink() {
  stopping_ = true;
  // Wake the blocking accept with a connection of our own.
  boost::system::error_code ec;
  tcp::socket poke(ioc_);
  poke.connect(acceptor_.local_endpoint(), ec);
  thread_.join();
}

std::uint16_t HttpSink::port() const { return acceptor_.local_endpoint().port(); }

std::vector<HttpSink::Post> HttpSink::posts() {
  std::lock_guard lock(mutex_);
  return posts_;
}

void HttpSink::serve() {
  while (!stopping_) {
    tcp::socket socket(ioc_);
    boost::system::error_code ec;
    acceptor_.accept(socket, ec);
    if (ec || stopping_) continue;
    boost::beast::flat_buffer buffer;
    bhttp::request_parser<bhttp::string_body> parser;
    parser.body_limit(16 << 20);
    bhttp::read(socket, buffer, parser, ec);
    if (ec) continue;
    const auto& req = parser.get();
    int status = 200;
    {
      std::lock_guard lock(mutex_);
      posts_.push_back({std::string(req.target()), std::string(req[bhttp::field::content_type]),
                        req.body(), std::chrono::steady_clock::now()});
      status = statuses_.front();
      if (statuses_.size() > 1) statuses_.pop_front();
    }
    bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(status), 11};
    res.set(bhttp::field::content_type, "application/json");
    res.body() = "{}";
    res.prepare_payload();
    bhttp::write(socket, res, ec);
  }
}

}  // namespace idem::test
