#pragma once
// Route matching and the per-configuration compiled state (route templates and
// fingerprint specs are compiled once per load/reload, never per request).
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idempotency/fingerprint.hpp"
#include "settings/settings.hpp"

namespace idem::gateway {

struct CompiledRoute {
  const settings::RouteSettings* settings = nullptr;  // owned by Runtime::settings
  std::vector<std::string> segments;  // path split on '/'; "{...}" = any one segment
  // A templated path matches many resources: the concrete path then joins the fingerprint,
  // so one key reused across /accounts/1/... and /accounts/2/... is refused, not replayed.
  bool templated = false;
  idempotency::FingerprintSpec fingerprint;
};

// One immutable snapshot of the configuration: a reload builds a new one and swaps the
// pointer; requests keep the snapshot they started with.
class Runtime {
 public:
  // Throws settings::ConfigError (naming the route's line) when a route cannot be compiled.
  static std::shared_ptr<const Runtime> build(std::shared_ptr<const settings::Settings> s);

  const settings::Settings& settings() const noexcept { return *settings_; }
  std::shared_ptr<const settings::Settings> settings_ptr() const noexcept { return settings_; }

  // Exact method; path compared segment by segment (no decoding: a byte-exact match).
  const CompiledRoute* match(std::string_view method, std::string_view path) const;

 private:
  std::shared_ptr<const settings::Settings> settings_;
  std::vector<CompiledRoute> routes_;
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
