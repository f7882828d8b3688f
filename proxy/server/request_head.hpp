#pragma once
// The listener's checks and rewrites of a request's header, once it is parsed and before a
// single body byte is read, so that everything after the listener (the gateway, the admin
// handler, the request forwarded to the backend) sees one validated, normalized header:
//   - RFC 9112 §3.2: an HTTP/1.1 request needs exactly one Host field, any request at most
//     one, and its value must be a valid uri-host [":" port];
//   - the request target, normalized once (server/target.hpp); an absolute-form target
//     becomes origin-form and its authority replaces the Host value (RFC 9112 §3.2.2);
//   - several Connection fields are combined into one list (RFC 9110 §5.3 makes them
//     equal), because Beast's keep_alive() reads only the first and a "close" in a second
//     field would otherwise be ignored.
// Pure: tested without sockets (tests/server/test_request_head.cpp).
#include <string_view>

#include <boost/beast/http/message.hpp>

#include "common/types.hpp"

namespace idem::server {

struct HeadCheck {
  bool ok = true;
  std::string_view problem;  // a static reason when !ok: answer 400 and close
};

// `normalize_target` false: the target is left as it is (the admin listener).
HeadCheck prepare_request_head(http::request_header<>& header, bool normalize_target = true);

}  // namespace idem::server
