#pragma once
// What the gateway decides about one request before it performs any I/O: the steps of
// Gateway::handle() (inbound checks, route, identity, key, body, fingerprint, principal),
// the same functions in the same order, stopped before the store is asked. Used by
// `idemproxy explain` (app/explain.hpp), so that its account of a request cannot drift
// from what the sidecar does with it.
#include <memory>
#include <optional>
#include <string>

#include "gateway/router.hpp"
#include "server/server.hpp"
#include "store/store.hpp"

namespace idem::gateway {

struct Examination {
  enum class Way {
    answered,          // refused or answered by idemproxy itself (`answer`), nothing forwarded
    operation_status,  // a GET of an async route's status resource (answered from the store)
    pass_through,      // no route matches: forwarded unchanged (unmatched: pass)
    pass_through_no_key,  // a key-less request on a `required: false` route: unprotected
    protected_request,    // admitted: the record `id` would be claimed before forwarding
  };
  Way way = Way::pass_through;
  const CompiledRoute* route = nullptr;   // the matched route, if any
  std::optional<server::Response> answer;  // Way::answered
  std::string code;                        // Way::answered: the answer's problem code
  // What admission read, as far as it got (a refused key still has its tenant).
  std::string tenant;
  std::string principal;    // the stored hash of the principal; "" without principal_header
  std::string key;          // Way::protected_request
  std::string fingerprint;  // hex SHA-256 of `canonical`
  std::string canonical;    // the exact bytes hashed (idempotency/fingerprint.hpp)
  std::string operation_id;
  store::RecordId id;
};

// `request` as the listener hands it on (server::prepare_request_head() applied); it is
// changed as handle() changes it (inbound sanitizing, verified identity headers).
Examination examine(std::shared_ptr<const Runtime> runtime, server::Request& request,
                    const server::RequestContext& context);

}  // namespace idem::gateway
