// The upstream pool over TLS against an in-process TLS backend on loopback, certificates
// made here with OpenSSL: a trusted certificate with the right name is used and its
// connection reused; an untrusted one, another name, an expired one are refused before
// any request byte is sent (connect_failed, which lets the gateway release the key);
// verify: false accepts anything; a new CA bundle applies to the next connection.
#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <filesystem>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include "test_support/crypto.hpp"
#include "upstream/client.hpp"
#include "upstream/tls.hpp"

namespace idem::upstream {
namespace {

using namespace std::chrono_literals;
using tcp = asio::ip::tcp;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

const test::CertificateAuthority& ca() {
  static const test::CertificateAuthority c("upstream test CA");
  return c;
}

// Answers every request "200 tls <target>" over TLS; counts handshakes and requests.
class TlsBackend {
 public:
  TlsBackend(asio::io_context& ioc, const test::Certificate& cert)
      : ioc_(ioc), ctx_(asio::ssl::context::tls_server),
        acceptor_(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    ctx_.use_certificate_chain(asio::buffer(cert.cert_pem));
    ctx_.use_private_key(asio::buffer(cert.key_pem), asio::ssl::context::pem);
    asio::co_spawn(ioc_, accept_loop(), asio::detached);
  }
  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  int handshakes = 0;
  int requests = 0;
  std::string last_sni;

 private:
  asio::awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, socket] = co_await acceptor_.async_accept(use_tuple);
      if (ec) co_return;
      asio::co_spawn(ioc_, serve(std::move(socket)), asio::detached);
    }
  }
  asio::awaitable<void> serve(tcp::socket socket) {
    asio::ssl::stream<tcp::socket> stream(std::move(socket), ctx_);
    auto [hec] = co_await stream.async_handshake(asio::ssl::stream_base::server, use_tuple);
    if (hec) co_return;
    ++handshakes;
    const char* sni = SSL_get_servername(stream.native_handle(), TLSEXT_NAMETYPE_host_name);
    last_sni = sni ? sni : "";
    beast::flat_buffer buffer;
    for (;;) {
      http::request<http::string_body> req;
      auto [ec, n] = co_await http::async_read(stream, buffer, req, use_tuple);
      if (ec) co_return;
      ++requests;
      http::response<http::string_body> res{http::status::ok, 11};
      res.body() = "tls " + std::string(req.target());
      res.keep_alive(true);
      res.prepare_payload();
      auto [wec, wn] = co_await http::async_write(stream, res, use_tuple);
      if (wec) co_return;
    }
  }

  asio::io_context& ioc_;
  asio::ssl::context ctx_;
  tcp::acceptor acceptor_;
};

struct CaFile {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("idem-up-tls-" + std::to_string(::getpid()));
  CaFile() { std::filesystem::create_directories(dir); }
  ~CaFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string write(std::string_view name, const std::string& pem) const { return test::write_file(dir, name, pem); }
};

PoolOptions tls_options(std::uint16_t port, std::shared_ptr<const ClientTls> tls) {
  PoolOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = 2s;
  o.response_timeout = 3s;
  o.tls = [tls] { return tls; };
  return o;
}

Request get(std::string target) { return Request{http::verb::get, std::move(target), 11}; }

template <class Body>
void run(asio::io_context& ioc, Body body) {
  bool done = false;
  std::exception_ptr error;
  asio::co_spawn(ioc, body(), [&](std::exception_ptr e) {
    error = e;
    done = true;
    ioc.stop();
  });
  ioc.run_for(15s);
  REQUIRE_MESSAGE(done, "the test body did not finish in time");
  if (error) std::rethrow_exception(error);
}

}  // namespace

TEST_CASE("upstream TLS: a trusted certificate for the name is used, and the connection reused") {
  asio::io_context ioc;
  CaFile files;
  TlsBackend backend(ioc, ca().issue({}));
  const auto tls = make_client_tls(files.write("ca.pem", ca().cert_pem()), "localhost", true);
  Pool pool(ioc.get_executor(), tls_options(backend.port(), tls));
  run(ioc, [&]() -> asio::awaitable<void> {
    auto first = co_await pool.send(get("/a"));
    REQUIRE(first.failure == Failure::none);
    CHECK(first.response.body() == "tls /a");
    auto second = co_await pool.send(get("/b"));
    REQUIRE(second.failure == Failure::none);
    CHECK(second.reused_connection);
    CHECK(backend.handshakes == 1);
    CHECK(backend.last_sni == "localhost");
  });
  // The certificate also names 127.0.0.1: an IP literal is verified as one (and no SNI).
  asio::io_context ioc2;
  TlsBackend by_ip(ioc2, ca().issue({}));
  Pool ip_pool(ioc2.get_executor(),
               tls_options(by_ip.port(), make_client_tls(files.write("ca2.pem", ca().cert_pem()), "127.0.0.1", true)));
  run(ioc2, [&]() -> asio::awaitable<void> {
    auto out = co_await ip_pool.send(get("/ip"));
    CHECK(out.failure == Failure::none);
    CHECK(by_ip.last_sni.empty());
  });
}

TEST_CASE("upstream TLS: an untrusted certificate, another name or an expired one is connect_failed") {
  CaFile files;
  const test::CertificateAuthority other("a CA the sidecar does not trust");
  test::CertificateOptions expired;
  expired.not_before = -std::chrono::hours(48);
  expired.not_after = -std::chrono::hours(1);
  struct Case {
    const char* what;
    test::Certificate cert;
    std::string name;
  };
  const Case cases[] = {{"untrusted CA", other.issue({}), "localhost"},
                        {"wrong name", ca().issue({}), "orders.internal"},
                        {"wrong IP", ca().issue({}), "127.0.0.2"},
                        {"expired", ca().issue(expired), "localhost"}};
  for (const auto& c : cases) {
    INFO(c.what);
    asio::io_context ioc;
    TlsBackend backend(ioc, c.cert);
    Pool pool(ioc.get_executor(),
              tls_options(backend.port(), make_client_tls(files.write("ca.pem", ca().cert_pem()), c.name, true)));
    run(ioc, [&]() -> asio::awaitable<void> {
      auto out = co_await pool.send(get("/never"));
      CHECK(out.failure == Failure::connect_failed);
      CHECK(backend.requests == 0);
    });
  }
}

TEST_CASE("upstream TLS: verify false accepts any certificate; a new CA bundle applies to new connections") {
  CaFile files;
  const test::CertificateAuthority other("self-made CA");
  {
    asio::io_context ioc;
    TlsBackend backend(ioc, other.issue({}));
    Pool pool(ioc.get_executor(), tls_options(backend.port(), make_client_tls("", "wrong.example", false)));
    run(ioc, [&]() -> asio::awaitable<void> {
      auto out = co_await pool.send(get("/any"));
      CHECK(out.failure == Failure::none);
    });
  }
  asio::io_context ioc;
  TlsBackend backend(ioc, other.issue({}));
  auto current = make_client_tls(files.write("old.pem", ca().cert_pem()), "localhost", true);
  PoolOptions o = tls_options(backend.port(), nullptr);
  o.max_idle = 0;  // every request connects anew
  o.tls = [&current] { return current; };
  Pool pool(ioc.get_executor(), o);
  run(ioc, [&]() -> asio::awaitable<void> {
    CHECK((co_await pool.send(get("/before"))).failure == Failure::connect_failed);
    current = make_client_tls(files.write("new.pem", other.cert_pem()), "localhost", true);
    CHECK((co_await pool.send(get("/after"))).failure == Failure::none);
  });
  CHECK_THROWS_AS(make_client_tls((files.dir / "missing.pem").string(), "localhost", true), ClientTlsError);
}

}  // namespace idem::upstream
