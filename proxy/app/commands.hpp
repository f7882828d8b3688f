#pragma once
// The commands of the idemproxy executable (contract §2). Each returns the exit status:
// 0 success, 1 any other failure. An invalid configuration throws settings::ConfigError,
// which main() turns into exit status 2.
#include <string>

namespace idem::app {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// Runs the sidecar until SIGTERM/SIGINT and its drain; SIGHUP reloads.
int serve(const std::string& config_path, const std::string& version);
// Applies pending migrations, then exits.
int migrate(const std::string& config_path);
// Validates and prints the effective configuration, secrets masked.
int check_config(const std::string& config_path);

}  // namespace idem::app
