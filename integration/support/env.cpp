#include "support/env.hpp"

#include <cstdlib>

#include "support/process.hpp"

namespace idem::it {

namespace fs = std::filesystem;

void pgctl(std::string_view action, Millis timeout) {
  auto script = env("IDEM_TEST_PGCTL");
  if (!script || script->empty()) {
    throw Failure("IDEM_TEST_PGCTL is not set: this test stops and starts PostgreSQL and "
                  "needs the control script that scripts/test (scripts/lib/pg-up) provides");
  }
  auto result = run_command(
      ProcessOptions{.executable = *script, .args = {std::string(action)}, .name = "pgctl"},
      timeout);
  if (!result.status.success()) {
    throw Failure("pgctl " + std::string(action) + " failed (" + result.status.describe() +
                  "):\n" + result.output);
  }
}

fs::path test_tmp_root() {
  for (const char* name : {"IDEM_TEST_TMPDIR", "TMPDIR"}) {
    if (auto dir = env(name); dir && !dir->empty()) {
      return *dir;
    }
  }
  return "/tmp";
}

namespace {

std::string binary(const char* variable, const char* built, const char* what) {
  std::string path;
  if (auto from_env = env(variable); from_env && !from_env->empty()) {
    path = *from_env;
  } else {
    path = built;
  }
  if (path.empty()) {
    throw Failure(std::string("no path for ") + what + ": set " + variable);
  }
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw Failure(std::string(what) + " not found at " + path + " (build it, or set " +
                  variable + ")");
  }
  return path;
}

}  // namespace

// The build passes both paths as compile definitions of this library; a build without
// them (a harness reused elsewhere) must name them through the environment.
#ifndef IDEMPROXY_BIN
#define IDEMPROXY_BIN ""
#endif
#ifndef IDEM_TEST_BACKEND_BIN
#define IDEM_TEST_BACKEND_BIN ""
#endif

std::string idemproxy_binary() { return binary("IDEMPROXY_BIN", IDEMPROXY_BIN, "idemproxy"); }

std::string test_backend_binary() {
  return binary("IDEM_TEST_BACKEND_BIN", IDEM_TEST_BACKEND_BIN, "idem_test_backend");
}

}  // namespace idem::it
