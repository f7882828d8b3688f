#include "upstream/tls.hpp"

#include "common/openssl_errors.hpp"

#include <boost/asio/ip/address.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

namespace idem::upstream {
namespace {

constexpr unsigned char kAlpnHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};

bool is_ip_literal(const std::string& name) {
  error_code ec;
  asio::ip::make_address(name, ec);
  return !ec;
}

}  // namespace

std::shared_ptr<const ClientTls> make_client_tls(const std::string& ca_file, const std::string& server_name,
                                                 bool verify) {
  ERR_clear_error();
  auto tls = std::make_shared<ClientTls>();
  tls->context = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  tls->server_name = server_name;
  tls->verify = verify;
  SSL_CTX* native = tls->context->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_options(native, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  SSL_CTX_set_alpn_protos(native, kAlpnHttp11, sizeof kAlpnHttp11);
  if (verify) {
    const int loaded = ca_file.empty() ? SSL_CTX_set_default_verify_paths(native)
                                       : SSL_CTX_load_verify_locations(native, ca_file.c_str(), nullptr);
    if (loaded != 1) {
      throw ClientTlsError((ca_file.empty() ? std::string("the system trust store")
                                            : "upstream.tls.ca_file " + ca_file) +
                           ": " + openssl_errors());
    }
    SSL_CTX_set_verify(native, SSL_VERIFY_PEER, nullptr);
  } else {
    SSL_CTX_set_verify(native, SSL_VERIFY_NONE, nullptr);
  }
  return tls;
}

bool prepare_connection(SSL* ssl, const ClientTls& tls) {
  const bool ip = is_ip_literal(tls.server_name);
  // RFC 6066 §3: SNI carries host names, never address literals.
  if (!ip && SSL_set_tlsext_host_name(ssl, tls.server_name.c_str()) != 1) return false;
  if (!tls.verify) return true;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  // Wildcards only as the whole left-most label (RFC 6125 §6.4.3).
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  return ip ? X509_VERIFY_PARAM_set1_ip_asc(param, tls.server_name.c_str()) == 1
            : X509_VERIFY_PARAM_set1_host(param, tls.server_name.c_str(), 0) == 1;
}

std::string handshake_failure(SSL* ssl, const error_code& ec) {
  const long verdict = SSL_get_verify_result(ssl);
  if (verdict != X509_V_OK) {
    return std::string("certificate verify failed (") + X509_verify_cert_error_string(verdict) + ")";
  }
  return ec.message();
}

}  // namespace idem::upstream
