#pragma once
// A TLS client for the tests, under their full control: which CA it trusts, the name it
// sends and verifies, its own certificate, the ALPN list and the protocol versions. It
// reports a refused handshake as a value (the tests are about refusals) and carries
// HTTP/1.1 exchanges over a kept-alive connection. Every step has a deadline.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "test_support/http.hpp"

namespace idem::test {

struct TlsClientOptions {
  std::string ca_pem;                    // trusted CA (PEM); "" = trust nothing
  std::string server_name = "localhost";  // SNI and the name verified ("" = neither)
  bool verify = true;
  std::string cert_pem;  // client certificate and key (PEM), for mTLS
  std::string key_pem;
  std::vector<std::string> alpn = {"http/1.1"};  // offered protocols; empty = no ALPN
  int max_version = 0;  // e.g. TLS1_1_VERSION; 0 = OpenSSL's default
};

class TlsClient {
 public:
  TlsClient(std::uint16_t port, TlsClientOptions options, Millis timeout = kDefaultTimeout);
  ~TlsClient();
  TlsClient(const TlsClient&) = delete;
  TlsClient& operator=(const TlsClient&) = delete;

  // nullopt when the handshake succeeded; otherwise why it failed (the OpenSSL reason, or
  // "closed" when the server hung up).
  const std::optional<std::string>& handshake_error() const;
  bool connected() const { return !handshake_error().has_value(); }
  // The protocol the server selected by ALPN ("" when none).
  std::string alpn() const;
  // The server certificate's subject common name.
  std::string peer_common_name() const;

  // Sends `raw` (a whole request) and reads one response. Throws Failure on timeout or when
  // the connection ends first.
  HttpResponse exchange(std::string_view raw, Millis timeout = kDefaultTimeout);
  // A request with Host and Content-Length filled in.
  HttpResponse request(std::string_view method, std::string_view target, const Headers& headers = {},
                       std::string_view body = {}, Millis timeout = kDefaultTimeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::test
