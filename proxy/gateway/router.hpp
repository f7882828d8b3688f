#pragma once
// Route matching and the per-configuration compiled state (route templates and
// fingerprint specs are compiled once per load/reload, never per request).
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "identity/identity.hpp"
#include "idempotency/fingerprint.hpp"
#include "idempotency/key.hpp"
#include "settings/settings.hpp"

namespace idem::gateway {

struct CompiledRoute {
  const settings::RouteSettings* settings = nullptr;  // owned by Runtime::settings
  std::vector<std::string> segments;  // path split on '/'; "{...}" = any one segment
  // A templated path matches many resources: the concrete path then joins the fingerprint,
  // so one key reused across /accounts/1/... and /accounts/2/... is refused, not replayed.
  bool templated = false;
  idempotency::FingerprintSpec fingerprint;
  idempotency::KeySpec key;  // where the route reads its key
  // The path as a lenient backend might read it (loose_segments()); "{}" = any segment.
  std::vector<std::string> loose;
};

// A path as the most lenient common backends read it, for one comparison only: whether a
// target that matches no route would still reach a route's handler in such a backend.
// Every percent-encoding decoded, '\' read as '/', ASCII lower-cased, ";params" cut from
// each segment (servlet containers), trailing dots and spaces trimmed (Windows), empty
// segments dropped ("//", a trailing '/'), dot segments resolved.
std::vector<std::string> loose_segments(std::string_view path);

// A GET of an operation status resource (routes with `async`): the operation id the path
// names, and the routes whose status_path it matched (several routes may share one).
struct StatusMatch {
  std::string operation_id;
  std::vector<const CompiledRoute*> routes;
};

// One immutable snapshot of the configuration: a reload builds a new one and swaps the
// pointer; requests keep the snapshot they started with.
class Runtime {
 public:
  // Throws settings::ConfigError (naming the route's line) when a route cannot be compiled,
  // or (naming tenant.jwt.jwks_file) when tenant.from is jwt and the JWKS cannot be used:
  // the JWKS is read here, so a reload reads it again and a bad one keeps the running one.
  static std::shared_ptr<const Runtime> build(std::shared_ptr<const settings::Settings> s);

  const settings::Settings& settings() const noexcept { return *settings_; }
  std::shared_ptr<const settings::Settings> settings_ptr() const noexcept { return settings_; }

  // Exact method; path compared segment by segment (no decoding: a byte-exact match of the
  // target the listener normalized, server/target.hpp).
  const CompiledRoute* match(std::string_view method, std::string_view path) const;

  // For a request that match() did not match: the route it would reach in a backend that
  // reads paths loosely (loose_segments(), method compared case-insensitively), if any.
  // Such a request is refused: forwarded unprotected, it could run a protected operation.
  const CompiledRoute* resembles(std::string_view method, std::string_view path) const;

  // A GET whose path matches an async route's status_path; compared like match().
  std::optional<StatusMatch> match_status(std::string_view method, std::string_view path) const;

  // The header names idemproxy decides by: the tenant and principal headers, and every
  // route's key and fingerprint headers (gateway/inbound.hpp).
  const std::vector<std::string>& decided_headers() const noexcept { return decided_headers_; }

  // The policy document served at settings().policy_path (gateway/policy.hpp).
  const std::string& policy() const noexcept { return policy_; }
  // The verifier of tenant.from: jwt | mtls; nullptr in header mode.
  const identity::Resolver* identity() const noexcept { return identity_.get(); }

 private:
  std::shared_ptr<const settings::Settings> settings_;
  std::vector<CompiledRoute> routes_;
  std::vector<std::string> decided_headers_;
  struct StatusTemplate {
    std::vector<std::string> segments;  // "{operation_id}" at `id_at`
    std::size_t id_at = 0;
    const CompiledRoute* route = nullptr;
  };
  std::vector<StatusTemplate> status_templates_;
  std::string policy_;
  std::shared_ptr<const identity::Resolver> identity_;
};

// Holds the current snapshot; load() is a lock-free atomic read on the request path.
class RuntimeHolder {
 public:
  explicit RuntimeHolder(std::shared_ptr<const Runtime> initial);
  std::shared_ptr<const Runtime> load() const;
  void store(std::shared_ptr<const Runtime> next);

 private:
  std::atomic<std::shared_ptr<const Runtime>> current_;
};

}  // namespace idem::gateway
