// The listener with TLS, over real loopback sockets and real handshakes: certificates made
// here with OpenSSL (test_support/crypto.hpp), the client under the test's control
// (test_support/tls_client.hpp). What a client that trusts the CA gets, what every kind of
// wrong certificate and wrong name gets, client certificates, ALPN, protocol versions, and
// a new certificate for new connections.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <openssl/ssl.h>

#include "server/server.hpp"
#include "server/tls.hpp"
#include "test_support/crypto.hpp"
#include "test_support/http.hpp"
#include "test_support/tls_client.hpp"

namespace idem::server {
namespace {

using namespace std::chrono_literals;
using test::CertificateAuthority;
using test::CertificateOptions;
using test::TlsClient;
using test::TlsClientOptions;

struct Files {
  std::filesystem::path dir;
  Files() {
    dir = std::filesystem::temp_directory_path() /
          ("idem-tls-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::create_directories(dir);
  }
  ~Files() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string write(std::string_view name, std::string_view text) const { return test::write_file(dir, name, text); }
  static std::atomic<int>& counter() {
    static std::atomic<int> n{0};
    return n;
  }
};

const CertificateAuthority& ca() {
  static const CertificateAuthority c("listener test CA");
  return c;
}

settings::ListenerTls server_files(const Files& f, const test::Certificate& cert, std::string client_ca = {}) {
  settings::ListenerTls t;
  t.cert_file = f.write("server.pem", cert.cert_pem);
  t.key_file = f.write("server.key", cert.key_pem);
  if (!client_ca.empty()) t.client_ca_file = f.write("clients.pem", client_ca);
  return t;
}

// A TLS listener on its own thread whose handler answers "<tenant-uri-count>:<uris>".
class TlsHarness {
  asio::io_context ioc_{1};

 public:
  explicit TlsHarness(std::shared_ptr<TlsContext> ctx) : current_(std::move(ctx)) {
    ListenerOptions options;
    options.endpoint = settings::Endpoint{"127.0.0.1", 0};
    options.tls = [this] {
      std::lock_guard lock(m_);
      return current_;
    };
    settings::Limits limits;
    limits.header_timeout = 2s;
    server = std::make_unique<Server>(
        ioc_, options, [limits] { return limits; },
        [](Request& req, const RequestContext& ctx) -> asio::awaitable<Response> {
          Response res{http::status::ok, req.version()};
          std::string uris;
          for (const auto& u : ctx.client_uris) uris += (uris.empty() ? "" : ",") + u;
          res.body() = std::string(req.target()) + "|" + uris;
          res.keep_alive(req.keep_alive());
          co_return res;
        },
        std::make_shared<ConnectionGauge>());
    server->start();
    thread_ = std::thread([this] { ioc_.run(); });
  }
  ~TlsHarness() {
    server.reset();
    ioc_.stop();
    thread_.join();
  }
  void replace(std::shared_ptr<TlsContext> ctx) {
    std::lock_guard lock(m_);
    current_ = std::move(ctx);
  }
  std::uint16_t port() const { return server->port(); }

  std::unique_ptr<Server> server;

 private:
  std::mutex m_;
  std::shared_ptr<TlsContext> current_;
  std::thread thread_;
};

TlsClientOptions trusting(const CertificateAuthority& authority, std::string name = "localhost") {
  TlsClientOptions o;
  o.ca_pem = authority.cert_pem();
  o.server_name = std::move(name);
  return o;
}

}  // namespace

TEST_CASE("TLS listener: a client that trusts the CA gets HTTP/1.1 over TLS, kept alive") {
  Files f;
  TlsHarness h(make_server_context(server_files(f, ca().issue({}))));
  TlsClient client(h.port(), trusting(ca()));
  REQUIRE_MESSAGE(client.connected(), client.handshake_error().value_or(""));
  CHECK(client.alpn() == "http/1.1");
  const auto first = client.request("GET", "/one");
  CHECK(first.status == 200);
  CHECK(first.body == "/one|");  // no client certificate asked for, none reported
  CHECK(client.request("GET", "/two").body == "/two|");  // the same connection
  // By IP address too: the certificate names 127.0.0.1.
  TlsClient by_ip(h.port(), trusting(ca(), "127.0.0.1"));
  CHECK(by_ip.connected());
  // A plain-HTTP client on the TLS port gets no HTTP answer.
  CHECK(test::raw_exchange(h.port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 5s).find("HTTP/1.1 200") ==
        std::string::npos);
}

TEST_CASE("TLS listener: a certificate the client does not trust, or for another name, is refused") {
  Files f;
  TlsHarness h(make_server_context(server_files(f, ca().issue({}))));
  const CertificateAuthority other("another CA");
  TlsClient untrusting(h.port(), trusting(other));
  CHECK_FALSE(untrusting.connected());
  CHECK(untrusting.handshake_error()->find("certificate verify failed") != std::string::npos);
  TlsClient wrong_name(h.port(), trusting(ca(), "orders.example"));
  CHECK_FALSE(wrong_name.connected());
  CHECK(wrong_name.handshake_error()->find("certificate verify failed") != std::string::npos);

  Files g;
  CertificateOptions expired;
  expired.not_before = -std::chrono::hours(48);
  expired.not_after = -std::chrono::hours(1);
  TlsHarness old(make_server_context(server_files(g, ca().issue(expired))));
  TlsClient sees_expired(old.port(), trusting(ca()));
  CHECK_FALSE(sees_expired.connected());
}

TEST_CASE("TLS listener: TLS 1.2 and later only; ALPN without http/1.1 is refused") {
  Files f;
  TlsHarness h(make_server_context(server_files(f, ca().issue({}))));
  auto tls11 = trusting(ca());
  tls11.max_version = TLS1_1_VERSION;
  CHECK_FALSE(TlsClient(h.port(), tls11).connected());
  auto tls12 = trusting(ca());
  tls12.max_version = TLS1_2_VERSION;
  TlsClient on_12(h.port(), tls12);
  REQUIRE(on_12.connected());
  CHECK(on_12.request("GET", "/12").status == 200);
  auto h2_only = trusting(ca());
  h2_only.alpn = {"h2"};
  CHECK_FALSE(TlsClient(h.port(), h2_only).connected());
  auto both = trusting(ca());
  both.alpn = {"h2", "http/1.1"};
  TlsClient chooses(h.port(), both);
  CHECK(chooses.alpn() == "http/1.1");
  auto no_alpn = trusting(ca());
  no_alpn.alpn.clear();
  TlsClient plain(h.port(), no_alpn);
  CHECK(plain.connected());
  CHECK(plain.alpn().empty());
}

TEST_CASE("TLS listener with client_ca_file: a client certificate is required and its URI SANs reach the handler") {
  Files f;
  const CertificateAuthority clients("client CA");
  TlsHarness h(make_server_context(server_files(f, ca().issue({}), clients.cert_pem())));

  TlsClient anonymous(h.port(), trusting(ca()));
  bool refused = !anonymous.connected();
  if (!refused) {
    // TLS 1.3 sends the alert after the client's Finished: the first exchange sees it.
    try {
      anonymous.request("GET", "/x", {}, {}, 5s);
    } catch (const test::Failure&) {
      refused = true;
    }
  }
  CHECK(refused);

  CertificateOptions client_cert;
  client_cert.server = false;
  client_cert.common_name = "web";
  client_cert.dns.clear();
  client_cert.ips.clear();
  client_cert.uris = {"spiffe://orders.example/tenant/acme/client/web", "https://other.example/x"};
  const auto issued = clients.issue(client_cert);
  auto with_cert = trusting(ca());
  with_cert.cert_pem = issued.cert_pem;
  with_cert.key_pem = issued.key_pem;
  TlsClient verified(h.port(), with_cert);
  REQUIRE_MESSAGE(verified.connected(), verified.handshake_error().value_or(""));
  CHECK(verified.request("GET", "/who").body ==
        "/who|spiffe://orders.example/tenant/acme/client/web,https://other.example/x");

  // A certificate from a CA the listener does not trust for clients (the server CA).
  const auto foreign = ca().issue(client_cert);
  auto with_foreign = trusting(ca());
  with_foreign.cert_pem = foreign.cert_pem;
  with_foreign.key_pem = foreign.key_pem;
  TlsClient stranger(h.port(), with_foreign);
  bool stranger_refused = !stranger.connected();
  if (!stranger_refused) {
    try {
      stranger.request("GET", "/x", {}, {}, 5s);
    } catch (const test::Failure&) {
      stranger_refused = true;
    }
  }
  CHECK(stranger_refused);
}

TEST_CASE("TLS listener: a new context applies to new connections; open ones keep theirs") {
  Files f;
  CertificateOptions first;
  first.common_name = "first";
  TlsHarness h(make_server_context(server_files(f, ca().issue(first))));
  TlsClient before(h.port(), trusting(ca()));
  REQUIRE(before.connected());
  CHECK(before.peer_common_name() == "first");

  Files g;
  CertificateOptions second;
  second.common_name = "second";
  h.replace(make_server_context(server_files(g, ca().issue(second))));
  TlsClient after(h.port(), trusting(ca()));
  REQUIRE(after.connected());
  CHECK(after.peer_common_name() == "second");
  CHECK(before.request("GET", "/still").status == 200);
}

TEST_CASE("make_server_context refuses unusable files and says which") {
  Files f;
  const auto cert = ca().issue({});
  const auto other = ca().issue({});
  settings::ListenerTls t;
  t.cert_file = f.write("c.pem", cert.cert_pem);
  t.key_file = f.write("k.pem", other.key_pem);
  const auto message = [&](const settings::ListenerTls& tls) {
    try {
      make_server_context(tls);
    } catch (const TlsError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  INFO(message(t));
  CHECK(message(t).find("tls.key_file") != std::string::npos);
  CHECK(message(t).find("mismatch") != std::string::npos);
  t.key_file = f.dir.string() + "/missing.key";
  CHECK(message(t).find("tls.key_file " + t.key_file) != std::string::npos);
  t.key_file = f.write("k2.pem", cert.key_pem);
  t.cert_file = f.write("garbage.pem", "not a certificate");
  CHECK(message(t).find("tls.cert_file") != std::string::npos);
  t.cert_file = f.write("c2.pem", cert.cert_pem);
  CHECK(message(t) == "accepted");
  t.client_ca_file = f.write("empty.pem", "");
  CHECK(message(t).find("tls.client_ca_file") != std::string::npos);
}

}  // namespace idem::server
