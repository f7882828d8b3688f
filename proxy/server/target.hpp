#pragma once
// The one normalization of a request target. The listener applies it to every request
// before anything else reads the target, so route matching, the fingerprint, the access log
// and the request forwarded to the backend all see the same path: a backend that
// normalizes paths (most do, at least for percent-encoded letters and dot segments) must
// not run a target as a protected route that idemproxy did not match as one.
//
// Pure (no I/O, no allocation beyond the result), so it is tested exhaustively without
// sockets (tests/server/test_target.cpp).
#include <string>
#include <string_view>

namespace idem::server {

enum class TargetForm {
  origin,    // "/path?query" (RFC 9112 §3.2.1)
  absolute,  // "http://authority/path?query" (§3.2.2): rewritten to origin-form
  asterisk,  // "*", OPTIONS only (§3.2.4)
};

struct NormalizedTarget {
  bool ok = false;
  std::string_view problem;  // a static reason when !ok (safe to send to the client)
  TargetForm form = TargetForm::origin;
  // Origin-form ("/path" or "/path?query"), or "*" for the asterisk form.
  std::string target;
  // The authority of an absolute-form target ("host" or "host:port"), which replaces the
  // Host field (RFC 9112 §3.2.2); empty otherwise.
  std::string authority;
};

// Accepts origin-form, absolute-form with an http or https scheme, and "*" for OPTIONS.
// Then, as RFC 3986 §6.2.2 describes: percent-encoded unreserved characters are decoded
// (%6F -> o, %2E -> .), the hex digits of every other percent-encoding are upper-cased,
// and dot segments are removed from the path (§5.2.4). Empty segments inside the path
// ("/a//b") are kept: no RFC makes them equal to one slash, and the gateway refuses a
// target that only such a difference separates from a route (gateway/router.hpp,
// Runtime::resembles).
//
// Refused (ok == false): a path that starts with "//" once dot segments are removed (a
// URI-reference parser reads it as a network-path reference: "//host/path"); a fragment;
// a malformed percent-encoding; a percent-encoded NUL
// or a character outside RFC 3986's path characters in the path; a non-ASCII byte or a
// control character anywhere; userinfo or an empty host in absolute-form; any other form
// (authority-form, as CONNECT uses, relative references).
NormalizedTarget normalize_target(std::string_view raw, bool is_options);

// RFC 3986 §5.2.4 on a path that starts with '/': the path with "." and ".." segments
// resolved. Exposed for the tests and the gateway's loose comparison.
std::string remove_dot_segments(std::string_view path);

// Whether `value` is a valid Host field value: uri-host [ ":" port ] (RFC 9110 §7.2), or
// empty (allowed for targets without an authority).
bool valid_host_value(std::string_view value) noexcept;

}  // namespace idem::server
