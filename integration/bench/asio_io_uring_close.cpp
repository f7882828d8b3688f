// Why idemproxy's event loops stay on epoll with Boost 1.81 (docs/performance.md, "Event
// loops on io_uring: measured, not kept"). Not part of the build: compile it by hand.
//
//   g++ -std=c++20 -DBOOST_ASIO_HAS_IO_URING -DBOOST_ASIO_DISABLE_EPOLL \
//       integration/bench/asio_io_uring_close.cpp -o /tmp/close-uring -luring -pthread
//   g++ -std=c++20 integration/bench/asio_io_uring_close.cpp -o /tmp/close-epoll -pthread
//
// Socket A has a read in flight and is closed; socket B, opened next, gets a read in
// flight and its peer sends "for-B". On epoll, A's handler gets operation_aborted and B's
// gets the bytes. On Boost 1.81's io_uring reactor, close() hands A's per-socket state
// back to the pool while A's read is still queued in it (only a cancel request is sent to
// the ring); B reuses that state, its read waits behind A's, and when the cancel comes
// back the reactor submits A's read again, on the descriptor number that is now B's:
// A's handler gets B's bytes, B's handler nothing. In a proxy that is one client's data
// in another's connection. Exit status 0 when the reactor behaves (B gets its bytes).
#include <boost/asio.hpp>

#include <chrono>
#include <iostream>
#include <string>

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

int main() {
  asio::io_context io;
  tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  const auto connect_pair = [&](tcp::socket& client, tcp::socket& server) {
    client.connect(acceptor.local_endpoint());
    acceptor.accept(server);
  };

  tcp::socket a(io), a_peer(io);
  connect_pair(a, a_peer);
  char buf_a[64] = {};
  std::string got_a = "nothing", got_b = "nothing";
  a.async_read_some(asio::buffer(buf_a), [&](boost::system::error_code ec, std::size_t n) {
    got_a = ec ? "error: " + ec.message() : "data: " + std::string(buf_a, n);
  });
  io.poll();  // A's read is now in flight
  const int a_fd = a.native_handle();
  a.close();

  tcp::socket b(io), b_peer(io);
  connect_pair(b, b_peer);
  char buf_b[64] = {};
  b.async_read_some(asio::buffer(buf_b), [&](boost::system::error_code ec, std::size_t n) {
    got_b = ec ? "error: " + ec.message() : "data: " + std::string(buf_b, n);
  });
  asio::write(b_peer, asio::buffer(std::string("for-B")));
  io.run_for(std::chrono::seconds(2));

  std::cout << "A was descriptor " << a_fd << ", B is descriptor " << b.native_handle() << "\n"
            << "A's handler: " << got_a << "\nB's handler: " << got_b << "\n";
  return got_b == "data: for-B" ? 0 : 1;
}
