#pragma once
// Verified identity (tenant.from: jwt | mtls): who a request is from, decided from a bearer
// token or the client certificate instead of the tenant header. In both modes:
//   - a client-sent tenant or principal header is refused (400 identity_header_forbidden):
//     those headers are now the sidecar's word to the backend, not the client's;
//   - the verified tenant (and principal) are written into those headers, so the record
//     is scoped by, and the backend receives, exactly the verified identity.
// Every request on the listener goes through this, protected or passed through: the
// backend reads the tenant header on both. Pure (the clock is a parameter): tested
// without sockets in tests/identity/.
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/status.hpp>

#include "identity/jwks.hpp"
#include "identity/jwt.hpp"
#include "settings/settings.hpp"

namespace idem::identity {

struct Resolution {
  bool ok = false;
  // When !ok: the answer (401, or 400 for a client-sent identity header) and why.
  boost::beast::http::status status = boost::beast::http::status::unauthorized;
  std::string_view code;
  std::string_view title;
  std::string detail;
  std::string_view challenge;  // WWW-Authenticate value, "" for none
  // When ok:
  std::string tenant;
  std::string principal;  // "" when no principal header is configured
};

// The tenant named by a verified client certificate's URI SANs: the one URI that starts
// with `prefix`, whose next path segment (up to '/' or the end) is the tenant; the whole
// URI is the principal. None, several, or an invalid tenant segment: refused.
Resolution from_certificate(std::span<const std::string> uris, std::string_view prefix);

class Resolver {
 public:
  // jwt mode: `keys` is the JWKS already loaded (Runtime::build reads the file). mtls
  // mode: keys may be null.
  Resolver(const settings::TenantSettings& tenant, std::shared_ptr<const KeySet> keys);

  // `client_uris`: the URI SANs of the verified client certificate (empty without one).
  Resolution resolve(const boost::beast::http::fields& fields,
                     std::span<const std::string> client_uris,
                     std::chrono::system_clock::time_point now) const;

  // Writes the verified tenant and principal into the request's identity headers.
  void apply(const Resolution& r, boost::beast::http::fields& fields) const;

  const KeySet* keys() const noexcept { return keys_.get(); }

 private:
  settings::TenantSettings tenant_;
  TokenPolicy policy_;
  std::shared_ptr<const KeySet> keys_;
};

// The bearer token of the Authorization field: nullopt when there is no such field (or it
// is not a Bearer credential); `several` when the field appears more than once.
struct Bearer {
  bool present = false;
  bool several = false;
  bool well_formed = false;  // "Bearer" SP token68
  std::string_view token;
};
Bearer bearer_token(const boost::beast::http::fields& fields);

}  // namespace idem::identity
