#pragma once
// An HTTP server that only records: it accepts on 127.0.0.1 (a port of its own), reads one
// request per connection, records it, and answers the next status of a script (then the
// last one for ever) with a `{}` JSON body. For what the sidecar sends out of band: the
// OTLP exporter's unit tests and the tracing end-to-end suite's collector. It runs a thread
// of its own; the accessors copy under a lock.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace idem::test {

class HttpSink {
 public:
  struct Post {
    std::string target;
    std::string content_type;
    std::string body;
    std::chrono::steady_clock::time_point at;
  };

  explicit HttpSink(std::deque<int> statuses = {200});
  ~HttpSink();
  HttpSink(const HttpSink&) = delete;
  HttpSink& operator=(const HttpSink&) = delete;

  std::uint16_t port() const;
  std::vector<Post> posts();

 private:
  void serve();

  std::deque<int> statuses_;
  boost::asio::io_context ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::vector<Post> posts_;
  std::thread thread_;
};

}  // namespace idem::test
