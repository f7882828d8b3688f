#pragma once
// The gateway's one pass over a request's header before any decision reads it. The
// listener has already applied HTTP's own rules (server/request_head.hpp: Host, target
// normalization, Connection combined); this applies idemproxy's, so that the header the
// gateway decides by (tenant, principal, key, fingerprint headers) is exactly the header
// the backend receives:
//   1. the trusted headers (kTrustedHeaders) are removed: only forward() sets them;
//   2. a field whose name equals a trusted or a decided header once '_' reads as '-'
//      (X_Tenant_Id, X_Idempotency_Attempt) is removed: CGI, WSGI and Rack backends read
//      it as the real one, and the layer in front, which strips the real one, does not
//      know it;
//   3. a Connection option that names a decided header, Host or Content-Type is refused:
//      honouring it (RFC 9110 §7.6.1) would remove the field the decision read before the
//      backend sees it;
//   4. a second Content-Type is refused: it is a singleton field, and the fingerprint and
//      the backend could each read a different one.
// check_inbound() adds what needs the routes:
//   5. a target that matches no route but that a lenient backend would read as one
//      (Runtime::resembles) is refused: passed through, it would run unprotected;
//   6. a method-override header (X-HTTP-Method-Override and its variants, which many
//      frameworks honour) is refused when it would turn the request into another method
//      of a route, or a route's request into another method.
// Pure: tested without sockets (tests/gateway/inbound_test.cpp).
#include <span>
#include <string>
#include <string_view>

#include <boost/beast/http/fields.hpp>

#include "gateway/router.hpp"

namespace idem::gateway {

struct InboundCheck {
  bool ok = true;
  std::string problem;  // when !ok: answer 400 bad_request with this detail
  std::size_t dropped = 0;  // fields removed by steps 1 and 2
};

// `decided`: the header names idemproxy decides by (Runtime::decided_headers()).
InboundCheck sanitize_inbound(boost::beast::http::fields& fields,
                              std::span<const std::string> decided);

// Steps 1 to 6. `matched` is runtime.match(method, path) for the normalized path.
InboundCheck check_inbound(boost::beast::http::fields& fields, std::string_view method,
                           std::string_view path, const Runtime& runtime,
                           const CompiledRoute* matched);

}  // namespace idem::gateway
