#include "server/tls.hpp"

#include <algorithm>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "common/openssl_errors.hpp"

namespace idem::server {
namespace {

constexpr unsigned char kAlpnHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
// Binds resumed sessions to this service (OpenSSL refuses to resume a session with
// client verification otherwise).
constexpr unsigned char kSessionContext[] = "idemproxy";

// RFC 7301 §3.2: a client that offers ALPN without http/1.1 has no protocol in common with
// us, and gets the no_application_protocol alert rather than a guess.
int select_alpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
                unsigned int inlen, void*) {
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, kAlpnHttp11, sizeof kAlpnHttp11, in, inlen) !=
      OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

[[noreturn]] void fail(const std::string& what) {
  throw TlsError(what + ": " + openssl_errors());
}

}  // namespace

std::shared_ptr<TlsContext> make_server_context(const settings::ListenerTls& tls) {
  ERR_clear_error();
  auto ctx = std::make_shared<TlsContext>(TlsContext::tls_server);
  SSL_CTX* native = ctx->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  // No renegotiation (a client-triggered CPU cost with no use here) and the server's
  // cipher order.
  SSL_CTX_set_options(native, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                  SSL_OP_NO_COMPRESSION);
  if (SSL_CTX_use_certificate_chain_file(native, tls.cert_file.c_str()) != 1) {
    fail("tls.cert_file " + tls.cert_file);
  }
  if (SSL_CTX_use_PrivateKey_file(native, tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    fail("tls.key_file " + tls.key_file);
  }
  if (SSL_CTX_check_private_key(native) != 1) {
    fail("tls.key_file " + tls.key_file + " does not match tls.cert_file " + tls.cert_file);
  }
  SSL_CTX_set_alpn_select_cb(native, select_alpn, nullptr);
  SSL_CTX_set_session_id_context(native, kSessionContext, sizeof kSessionContext - 1);
  if (!tls.client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(native, tls.client_ca_file.c_str(), nullptr) != 1) {
      fail("tls.client_ca_file " + tls.client_ca_file);
    }
    // The CA names sent in the CertificateRequest, so a client with several certificates
    // picks the right one.
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.client_ca_file.c_str());
    if (!names) fail("tls.client_ca_file " + tls.client_ca_file + " holds no certificate");
    SSL_CTX_set_client_CA_list(native, names);
    SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return ctx;
}

std::vector<std::string> verified_peer_uris(SSL* ssl) {
  std::vector<std::string> out;
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (!cert || SSL_get_verify_result(ssl) != X509_V_OK) return out;
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (!names) return out;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    std::string value(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                      static_cast<std::size_t>(ASN1_STRING_length(uri)));
    // A URI with a NUL or another control character could read as one name to a C string
    // comparison and as another here: such a certificate names nobody.
    const bool clean = std::all_of(value.begin(), value.end(), [](char c) {
      return static_cast<unsigned char>(c) > 0x20 && c != 0x7f;
    });
    if (clean) out.push_back(std::move(value));
  }
  GENERAL_NAMES_free(names);
  return out;
}

}  // namespace idem::server
