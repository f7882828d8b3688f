// idem_test_backend — the order API stand-in that the sidecar forwards to in end-to-end
// tests. It records every business request and answers as the request's headers ask, so a
// test controls timing and outcome from the client side, through the sidecar.
//
//   idem_test_backend --port N [--host 127.0.0.1] [--tls-cert FILE --tls-key FILE]
//
// Prints "LISTENING <port>" on stdout (flushed) once it accepts connections; --port 0 lets
// the kernel pick. With --tls-cert and --tls-key it also serves the same API over TLS on a
// port the kernel picks, printed first as "LISTENING_TLS <port>" (control endpoints work
// on both; the harness uses the plain port for them). Request headers understood on business paths (anything not under /__):
//   X-Test-Status: N                 answer N (default 201 for POST, 200 otherwise)
//   X-Test-Hold: NAME                answer only after POST /__release/NAME (sticky)
//   X-Test-Delay-Ms: N               wait N ms before answering (after any hold)
//   X-Test-Close: before-response    record, then reset the connection without answering
//   X-Test-Body-Size: N              answer N bytes of 'x' instead of the JSON order
//   X-Test-Header-Hex: HEX           hex of "Name: value" (any bytes): replaces that response
//                                    header (repeatable)
//   X-Test-Raw-Response-Hex: HEX     write exactly these bytes as the response
//   X-Test-Stray-Hex: HEX            with Raw-Response: bytes written on this connection
//                                    just before its next response (a late body)
// Control endpoints: GET /__calls, POST /__release/NAME, POST /__reset, GET /__health.
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/ssl/context.hpp>

#include "server.hpp"

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

[[noreturn]] void usage(std::string_view problem) {
  std::cerr << "idem_test_backend: " << problem << "\n"
            << "usage: idem_test_backend --port N [--host 127.0.0.1] [--tls-cert FILE --tls-key FILE]\n";
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1";
  std::string tls_cert;
  std::string tls_key;
  int port = -1;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if ((arg == "--port" || arg == "--host" || arg == "--tls-cert" || arg == "--tls-key") && i + 1 >= argc) {
      usage(std::string(arg) + " needs a value");
    }
    if (arg == "--port") {
      std::string_view value = argv[++i];
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), port);
      if (ec != std::errc{} || end != value.data() + value.size() || port < 0 || port > 65535) {
        usage("invalid port");
      }
    } else if (arg == "--host") {
      host = argv[++i];
    } else if (arg == "--tls-cert") {
      tls_cert = argv[++i];
    } else if (arg == "--tls-key") {
      tls_key = argv[++i];
    } else if (arg == "--help" || arg == "-h") {
      usage("help requested");
    } else {
      usage("unknown argument " + std::string(arg));
    }
  }
  if (port < 0) {
    usage("--port is required");
  }

  try {
    asio::io_context ioc(1);
    tcp::endpoint endpoint(asio::ip::make_address(host), static_cast<unsigned short>(port));
    tcp::acceptor acceptor(ioc);
    acceptor.open(endpoint.protocol());
    // A restarted backend must be able to take its old port back at once, while the old
    // connections still sit in TIME_WAIT (tests that stop and restart the upstream).
    acceptor.set_option(asio::socket_base::reuse_address(true));
    acceptor.bind(endpoint);
    acceptor.listen(asio::socket_base::max_listen_connections);
    const auto bound = acceptor.local_endpoint().port();

    idem::test_backend::Server server(std::move(acceptor));
    asio::co_spawn(ioc, server.run(), [](std::exception_ptr e) {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          std::cerr << "idem_test_backend: acceptor failed: " << ex.what() << std::endl;
        }
        std::exit(1);
      }
    });

    if (!tls_cert.empty()) {
      auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
      ctx->use_certificate_chain_file(tls_cert);
      ctx->use_private_key_file(tls_key, asio::ssl::context::pem);
      tcp::acceptor tls_acceptor(ioc, tcp::endpoint(asio::ip::make_address(host), 0));
      const auto tls_port = tls_acceptor.local_endpoint().port();
      asio::co_spawn(ioc, server.run_tls(std::move(tls_acceptor), std::move(ctx)), asio::detached);
      std::cout << "LISTENING_TLS " << tls_port << std::endl;
    }

    asio::signal_set signals(ioc, SIGINT, SIGTERM);
    signals.async_wait([&ioc](const boost::system::error_code&, int) { ioc.stop(); });

    // The harness waits for this line before it sends anything; flush so it is visible
    // even though stdout is a file, not a terminal.
    std::cout << "LISTENING " << bound << std::endl;
    ioc.run();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "idem_test_backend: " << e.what() << std::endl;
    return 1;
  }
}
