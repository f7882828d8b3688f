#pragma once
// `idemproxy verify-backend`: runs the backend's side of the contract against the real
// backend and database a configuration names, the way the sidecar would drive them, and
// prints what holds (docs/backend.md):
//   - operation-id deduplication: an attempt re-forwarded after a lost answer (a takeover,
//     same operation id) gets the first answer back;
//   - completion: backend routes: a stale attempt's transaction is refused, and the owner's
//     answer is recorded by the backend with the digest it returns;
//   - the release directive, for a request the caller says the backend must not remember.
// It claims keys of its own (a tenant of its own by default) and purges them afterwards.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::app {

struct VerifyOptions {
  std::string config_path;
  std::string route;               // the route's name
  std::string tenant = "idemproxy-verify";
  std::string target;              // default: the route's path (required for templates)
  std::string body = "{}";         // a request the backend accepts and records
  std::vector<std::pair<std::string, std::string>> headers;  // extra request headers
  std::string release_body;        // optional: a request the backend must answer "release"
};

// The command line's verify-backend options (--route, --tenant, --target, --body FILE,
// --release-body FILE, --header 'Name: value'). parse_verify_option() reads files; false
// with `error` set when the value is unusable.
bool is_verify_option(std::string_view arg);
bool parse_verify_option(std::string_view arg, const std::string& value, VerifyOptions& options,
                         std::string& error);

// Returns 0 when every check that ran holds, 1 otherwise (2 for usage errors is main's).
int verify_backend(const VerifyOptions& options);

}  // namespace idem::app
