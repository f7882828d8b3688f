#pragma once
// The commands of the idemproxy executable (contract §2). Each returns the exit status:
// 0 success, 1 any other failure. An invalid configuration throws settings::ConfigError,
// which main() turns into exit status 2.
#include <optional>
#include <string>

#include "common/types.hpp"

namespace idem::app {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// Runs the sidecar until SIGTERM/SIGINT and its drain; SIGHUP reloads.
int serve(const std::string& config_path, const std::string& version);
struct MigrateArgs {
  bool plan = false;                      // --plan: print what would be done, change nothing
  bool contract = false;                  // --contract: also the contract migrations
  std::optional<Millis> lock_wait;        // --lock-wait: per step, default 10m
  std::optional<double> backfill_rest;    // --backfill-rest: default 1 (as long as the batch)
  std::string release;                    // recorded beside each migration applied
};
// Applies pending migrations (or, with --plan, prints them), then exits.
int migrate(const std::string& config_path, const MigrateArgs& args);
// Validates and prints the effective configuration, secrets masked.
int check_config(const std::string& config_path);

}  // namespace idem::app
