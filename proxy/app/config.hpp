#pragma once
// Loading the configuration for a command, and what a reload may change.
#include <memory>
#include <string>
#include <vector>

#include "gateway/router.hpp"
#include "settings/settings.hpp"

namespace idem::app {

// Loads and fully validates (including what only the gateway can compile, such as
// fingerprint pointers and defaults). Throws settings::ConfigError.
std::shared_ptr<const gateway::Runtime> load_runtime(const std::string& path);

// The reload policy. Listener, upstream, database, workers and the admin listener are
// bound at start-up, and the replay cache needs the change listener that starts with the
// process: a reload keeps the running values for them rather than half-apply a change.
// Everything else (routes, limits, logging, cleanup, the admin token, cache sizes) is taken
// from `next`.
struct ReloadPlan {
  std::shared_ptr<settings::Settings> effective;  // what to run from now on
  std::vector<std::string> restart_only;          // changed keys kept until a restart
};
ReloadPlan plan_reload(const settings::Settings& next, const settings::Settings& running,
                       bool change_listener_running);

}  // namespace idem::app
