#pragma once
// The listener's TLS: the server context built from `tls:` (certificate chain, key,
// optional client CAs), TLS 1.2 and later, ALPN http/1.1; and what a handshake tells the
// gateway (the verified client certificate's URI SANs). A context is immutable once
// built: a reload builds a new one and the listener hands it to new connections, while
// open ones keep theirs (app/sidecar.cpp).
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/asio/ssl/context.hpp>
#include <openssl/ssl.h>

#include "settings/settings.hpp"

namespace idem::server {

using TlsContext = asio::ssl::context;

// Why a context could not be built: names the file and OpenSSL's reason.
struct TlsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads the files now. Throws TlsError when a file is missing or unreadable, the key does
// not match the certificate, or the client CA file holds no certificate.
std::shared_ptr<TlsContext> make_server_context(const settings::ListenerTls& tls);

// The URI SANs of the peer's certificate when the handshake verified it (client
// certificates are requested only with client_ca_file); empty otherwise.
std::vector<std::string> verified_peer_uris(SSL* ssl);

}  // namespace idem::server
