#include "test_support/tls_client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <openssl/err.h>
#include <openssl/x509v3.h>

namespace idem::test {
namespace {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = asio::ip::tcp;

std::string errors_of(const boost::system::error_code& ec) {
  std::string out = ec.message();
  if (ec.category() == asio::error::get_ssl_category()) {
    char buf[256];
    ERR_error_string_n(static_cast<unsigned long>(ec.value()), buf, sizeof buf);
    out = buf;
  }
  return out;
}

// Runs the context until `done` or the deadline; false on timeout (the operation is then
// cancelled by closing the socket).
template <class Done>
bool run_until(asio::io_context& ioc, Done done, Millis timeout, tcp::socket& socket) {
  ioc.restart();
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) {
      boost::system::error_code ignored;
      socket.close(ignored);
      ioc.run_for(std::chrono::milliseconds(100));
      return false;
    }
    ioc.run_for(std::chrono::milliseconds(20));
    if (ioc.stopped()) ioc.restart();
  }
  return true;
}

}  // namespace

struct TlsClient::Impl {
  asio::io_context ioc;
  ssl::context ctx{ssl::context::tls_client};
  std::unique_ptr<ssl::stream<tcp::socket>> stream;
  std::optional<std::string> handshake_error;
  std::string buffer;
};

TlsClient::TlsClient(std::uint16_t port, TlsClientOptions o, Millis timeout) : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  SSL_CTX* native = im.ctx.native_handle();
  if (o.max_version) SSL_CTX_set_max_proto_version(native, o.max_version);
  if (!o.ca_pem.empty()) im.ctx.add_certificate_authority(asio::buffer(o.ca_pem));
  im.ctx.set_verify_mode(o.verify ? ssl::verify_peer : ssl::verify_none);
  if (!o.cert_pem.empty()) {
    im.ctx.use_certificate_chain(asio::buffer(o.cert_pem));
    im.ctx.use_private_key(asio::buffer(o.key_pem), ssl::context::pem);
  }
  if (!o.alpn.empty()) {
    std::string wire;
    for (const auto& p : o.alpn) {
      wire += static_cast<char>(p.size());
      wire += p;
    }
    SSL_CTX_set_alpn_protos(native, reinterpret_cast<const unsigned char*>(wire.data()),
                            static_cast<unsigned>(wire.size()));
  }
  im.stream = std::make_unique<ssl::stream<tcp::socket>>(im.ioc, im.ctx);
  SSL* ssl = im.stream->native_handle();
  if (!o.server_name.empty()) {
    boost::system::error_code ec;
    asio::ip::make_address(o.server_name, ec);  // ec: not an IP literal, so a DNS name
    if (ec) SSL_set_tlsext_host_name(ssl, o.server_name.c_str());
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    if (ec) {
      X509_VERIFY_PARAM_set1_host(param, o.server_name.c_str(), 0);
    } else {
      X509_VERIFY_PARAM_set1_ip_asc(param, o.server_name.c_str());
    }
  }
  auto& socket = im.stream->next_layer();
  boost::system::error_code connect_ec;
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), connect_ec);
  if (connect_ec) {
    im.handshake_error = "connect: " + connect_ec.message();
    return;
  }
  bool done = false;
  boost::system::error_code hec;
  im.stream->async_handshake(ssl::stream_base::client, [&](const boost::system::error_code& ec) {
    hec = ec;
    done = true;
  });
  if (!run_until(im.ioc, [&] { return done; }, timeout, socket)) {
    im.handshake_error = "handshake timed out";
  } else if (hec) {
    im.handshake_error = hec == asio::error::eof ? std::string("closed") : errors_of(hec);
  }
}

TlsClient::~TlsClient() = default;

const std::optional<std::string>& TlsClient::handshake_error() const { return impl_->handshake_error; }

std::string TlsClient::alpn() const {
  const unsigned char* data = nullptr;
  unsigned len = 0;
  SSL_get0_alpn_selected(impl_->stream->native_handle(), &data, &len);
  return data ? std::string(reinterpret_cast<const char*>(data), len) : std::string();
}

std::string TlsClient::peer_common_name() const {
  X509* cert = SSL_get0_peer_certificate(impl_->stream->native_handle());
  if (!cert) return {};
  char buf[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, sizeof buf);
  return buf;
}

HttpResponse TlsClient::exchange(std::string_view raw, Millis timeout) {
  auto& im = *impl_;
  if (im.handshake_error) fail("TLS exchange on a connection whose handshake failed: " + *im.handshake_error);
  auto& socket = im.stream->next_layer();
  bool written = false;
  boost::system::error_code wec;
  asio::async_write(*im.stream, asio::buffer(raw.data(), raw.size()),
                    [&](const boost::system::error_code& ec, std::size_t) {
                      wec = ec;
                      written = true;
                    });
  if (!run_until(im.ioc, [&] { return written; }, timeout, socket)) fail("TLS write timed out");
  if (wec) fail("TLS write failed: " + errors_of(wec));
  for (;;) {
    if (auto parsed = try_parse_response(im.buffer, false)) {
      im.buffer.erase(0, parsed->second);
      return std::move(parsed->first);
    }
    char chunk[4096];
    bool read = false;
    boost::system::error_code rec;
    std::size_t n = 0;
    im.stream->async_read_some(asio::buffer(chunk), [&](const boost::system::error_code& ec, std::size_t got) {
      rec = ec;
      n = got;
      read = true;
    });
    if (!run_until(im.ioc, [&] { return read; }, timeout, socket)) fail("TLS read timed out");
    im.buffer.append(chunk, n);
    if (rec) {
      if (auto parsed = try_parse_response(im.buffer, true)) {
        im.buffer.erase(0, parsed->second);
        return std::move(parsed->first);
      }
      fail("the TLS connection ended before a response: " + errors_of(rec));
    }
  }
}

HttpResponse TlsClient::request(std::string_view method, std::string_view target, const Headers& headers,
                                std::string_view body, Millis timeout) {
  std::string raw = std::string(method) + " " + std::string(target) + " HTTP/1.1\r\nHost: localhost\r\n";
  for (const auto& [name, value] : headers) raw += name + ": " + value + "\r\n";
  raw += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  raw += body;
  return exchange(raw, timeout);
}

}  // namespace idem::test
