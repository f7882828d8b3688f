// The command line: parse it and dispatch to the commands (app/commands.hpp), which own
// everything else. Exit status: 0 success, 2 invalid configuration or usage, 1 otherwise.
#include <exception>
#include <iostream>
#include <optional>
#include <string>

#include "app/commands.hpp"
#include "app/explain.hpp"
#include "app/verify_backend.hpp"
#include "settings/openapi.hpp"
#include "settings/settings.hpp"

#ifndef IDEMPROXY_VERSION
#define IDEMPROXY_VERSION "0.0.0"
#endif

namespace {

using namespace idem;

using app::kExitFailure;
using app::kExitOk;
using app::kExitUsage;

constexpr const char* kUsage =
    "usage:\n"
    "  idemproxy [serve] --config FILE      run the sidecar (default command)\n"
    "  idemproxy migrate --config FILE [--plan] [--contract] [--lock-wait D] [--backfill-rest R]\n"
    "                                       apply pending migrations online, then exit;\n"
    "                                       --plan prints each step's locks, changes nothing;\n"
    "                                       --contract also applies those that remove what older\n"
    "                                       releases use (refused while such replicas connect)\n"
    "  idemproxy check-config --config FILE validate; print the effective config (secrets masked)\n"
    "  idemproxy verify-backend --config FILE --route NAME [--body FILE] [--release-body FILE]\n"
    "                 [--tenant T] [--target PATH] [--header 'Name: value']...\n"
    "                                       check the backend's side of the contract (docs/backend.md)\n"
    "  idemproxy explain --config FILE [--database] [--tenant T] [--header 'Name: value']...\n"
    "                 [--body FILE] METHOD TARGET [< body]\n"
    "                                       what the sidecar would do with this request: route,\n"
    "                                       tenant, key, fingerprint, answer; --database: what a\n"
    "                                       retry gets now, read-only (docs/configuration.md)\n"
    "  idemproxy routes --openapi FILE [--all-posts]\n"
    "                                       propose a routes: block from an OpenAPI 3 document\n"
    "  idemproxy --version | --help\n";

struct Command {
  std::string name = "serve";
  std::string config;
  app::VerifyOptions verify;  // verify-backend's own options
  app::MigrateArgs migrate;   // migrate's own options
  app::ExplainOptions explain;  // explain's own options and its METHOD TARGET
  int positional = 0;
  std::string openapi;             // routes --openapi FILE
  settings::OpenApiOptions routes;  // routes' own options
};

std::optional<Command> parse_args(int argc, char** argv, int& exit_code) {
  Command cmd;
  bool named = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      exit_code = kExitOk;
      return std::nullopt;
    }
    if (arg == "--version") {
      std::cout << "idemproxy " << IDEMPROXY_VERSION << "\n";
      exit_code = kExitOk;
      return std::nullopt;
    }
    if (arg == "--config" || arg == "-c") {
      if (i + 1 >= argc) {
        std::cerr << "idemproxy: --config needs a file\n" << kUsage;
        exit_code = kExitUsage;
        return std::nullopt;
      }
      cmd.config = argv[++i];
      continue;
    }
    if (arg.rfind("--config=", 0) == 0) {
      cmd.config = arg.substr(9);
      continue;
    }
    if (cmd.name == "migrate" && arg == "--plan") {
      cmd.migrate.plan = true;
      continue;
    }
    if (cmd.name == "migrate" && arg == "--contract") {
      cmd.migrate.contract = true;
      continue;
    }
    if (cmd.name == "migrate" && arg == "--lock-wait") {
      const auto d = i + 1 < argc ? settings::parse_duration(argv[i + 1]) : std::nullopt;
      if (!d || d->count() <= 0) {
        std::cerr << "idemproxy: --lock-wait needs a duration such as 30s or 10m\n";
        exit_code = kExitUsage;
        return std::nullopt;
      }
      cmd.migrate.lock_wait = *d;
      ++i;
      continue;
    }
    if (cmd.name == "migrate" && arg == "--backfill-rest") {
      double rest = -1;
      try {
        rest = i + 1 < argc ? std::stod(argv[i + 1]) : -1;
      } catch (const std::exception&) {
      }
      if (!(rest >= 0 && rest <= 100)) {
        std::cerr << "idemproxy: --backfill-rest needs a number from 0 to 100 (the rest after each "
                     "backfill batch, as a multiple of the time it took)\n";
        exit_code = kExitUsage;
        return std::nullopt;
      }
      cmd.migrate.backfill_rest = rest;
      ++i;
      continue;
    }
    if (cmd.name == "verify-backend" && app::is_verify_option(arg)) {
      std::string error;
      if (i + 1 >= argc || !app::parse_verify_option(arg, argv[++i], cmd.verify, error)) {
        std::cerr << "idemproxy: " << (error.empty() ? arg + " needs a value" : error) << "\n";
        exit_code = kExitUsage;
        return std::nullopt;
      }
      continue;
    }
    if (cmd.name == "explain" && app::is_explain_option(arg)) {
      std::string error;
      if (i + 1 >= argc || !app::parse_explain_option(arg, argv[++i], cmd.explain, error)) {
        std::cerr << "idemproxy: " << (error.empty() ? arg + " needs a value" : error) << "\n";
        exit_code = kExitUsage;
        return std::nullopt;
      }
      continue;
    }
    if (cmd.name == "explain" && arg == "--database") {
      cmd.explain.database = true;
      continue;
    }
    if (cmd.name == "explain" && !arg.empty() && arg.front() != '-' && cmd.positional < 2) {
      (cmd.positional++ == 0 ? cmd.explain.method : cmd.explain.target) = arg;
      continue;
    }
    if (cmd.name == "routes" && arg == "--openapi") {
      if (i + 1 >= argc) {
        std::cerr << "idemproxy: --openapi needs a file\n";
        exit_code = kExitUsage;
        return std::nullopt;
      }
      cmd.openapi = argv[++i];
      continue;
    }
    if (cmd.name == "routes" && arg == "--all-posts") {
      cmd.routes.all_posts = true;
      continue;
    }
    if (!named && (arg == "serve" || arg == "migrate" || arg == "check-config" ||
                   arg == "verify-backend" || arg == "explain" || arg == "routes")) {
      cmd.name = arg;
      named = true;
      continue;
    }
    std::cerr << "idemproxy: unknown argument '" << arg << "'\n" << kUsage;
    exit_code = kExitUsage;
    return std::nullopt;
  }
  if (cmd.name == "routes") {
    if (cmd.openapi.empty()) {
      std::cerr << "idemproxy: routes needs --openapi FILE\n" << kUsage;
      exit_code = kExitUsage;
      return std::nullopt;
    }
    return cmd;  // reads no configuration
  }
  if (cmd.config.empty()) {
    std::cerr << "idemproxy: --config FILE is required\n" << kUsage;
    exit_code = kExitUsage;
    return std::nullopt;
  }
  if (cmd.name == "verify-backend" && cmd.verify.route.empty()) {
    std::cerr << "idemproxy: verify-backend needs --route NAME\n" << kUsage;
    exit_code = kExitUsage;
    return std::nullopt;
  }
  if (cmd.name == "explain" && cmd.positional != 2) {
    std::cerr << "idemproxy: explain needs METHOD and TARGET, e.g. explain --config FILE POST /orders\n"
              << kUsage;
    exit_code = kExitUsage;
    return std::nullopt;
  }
  cmd.verify.config_path = cmd.config;
  cmd.explain.config_path = cmd.config;
  return cmd;
}

void print_config_error(const settings::ConfigError& e) {
  std::cerr << "idemproxy: " << e.full_message() << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  int exit_code = kExitOk;
  const auto cmd = parse_args(argc, argv, exit_code);
  if (!cmd) return exit_code;
  try {
    if (cmd->name == "migrate") {
      auto args = cmd->migrate;
      args.release = IDEMPROXY_VERSION;
      return app::migrate(cmd->config, args);
    }
    if (cmd->name == "check-config") return app::check_config(cmd->config);
    if (cmd->name == "verify-backend") return app::verify_backend(cmd->verify);
    if (cmd->name == "explain") return app::explain(cmd->explain);
    if (cmd->name == "routes") {
      std::cout << settings::propose_routes(cmd->openapi, cmd->routes);
      return kExitOk;
    }
    return app::serve(cmd->config, IDEMPROXY_VERSION);
  } catch (const settings::ConfigError& e) {
    print_config_error(e);
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "idemproxy: " << e.what() << "\n";
    return kExitFailure;
  }
}
