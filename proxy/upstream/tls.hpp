#pragma once
// TLS towards the backend (an https:// upstream): the client context (TLS 1.2 and later,
// ALPN http/1.1, the CA bundle or the system's trust store) and the name each connection
// sends (SNI) and verifies. Built at start and on every reload (app/sidecar.cpp); a pool
// reads the current one for each new connection, so a rotated CA bundle applies to the
// next connection while pooled ones keep theirs.
#include <memory>
#include <stdexcept>
#include <string>

#include <boost/asio/ssl/context.hpp>

#include "common/types.hpp"

namespace idem::upstream {

struct ClientTls {
  std::shared_ptr<asio::ssl::context> context;
  std::string server_name;  // DNS name or IP literal: sent as SNI (names only), verified
  bool verify = true;       // false: no certificate or name check at all
};

struct ClientTlsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `ca_file` "" = the system's default trust store. Throws ClientTlsError naming the file.
std::shared_ptr<const ClientTls> make_client_tls(const std::string& ca_file,
                                                 const std::string& server_name, bool verify);

// Applies SNI and the name check of `tls` to one connection's SSL object.
bool prepare_connection(SSL* ssl, const ClientTls& tls);

// Why the last handshake on `ssl` failed, for the log: the certificate check's verdict
// when it failed, else the error's message.
std::string handshake_failure(SSL* ssl, const error_code& ec);

}  // namespace idem::upstream
