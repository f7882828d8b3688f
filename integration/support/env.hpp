#pragma once
// What the test run provides through the environment. scripts/test exports all of these;
// running integration binaries by hand needs at least DATABASE_URL.
//   DATABASE_URL        a PostgreSQL the tests may write to (a throwaway server)
//   IDEM_TEST_PGCTL     a script taking start|stop|status for that server (outage tests)
//   IDEM_TEST_TMPDIR    where temporary directories go (default $TMPDIR, then /tmp)
//   IDEM_TEST_KEEP_TMP  if set, temporary directories (and child logs) are kept
//   IDEM_TEST_BACKEND_BIN, IDEMPROXY_BIN  override the binaries the build points at
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "support/wait.hpp"
#include "test_support/postgres.hpp"

namespace idem::it {

// env() and database_url() (test_support/postgres.hpp).
using test::database_url;
using test::env;

// Runs "$IDEM_TEST_PGCTL <action>" (start, stop or status) and waits for it; throws
// Failure with the script's output if it fails or IDEM_TEST_PGCTL is unset. `stop` waits
// until the server is down, `start` until it accepts connections.
void pgctl(std::string_view action, Millis timeout = 60s);

// Stops the shared PostgreSQL for an outage test and starts it again when the scope ends,
// also when an assertion failed in between, so the suites after it still have a server.
class PostgresOutage {
 public:
  PostgresOutage() { pgctl("stop"); }
  ~PostgresOutage() {
    if (!restarted_) pgctl("start");
  }
  PostgresOutage(const PostgresOutage&) = delete;
  PostgresOutage& operator=(const PostgresOutage&) = delete;
  // Ends the outage before the scope does.
  void end() {
    pgctl("start");
    restarted_ = true;
  }

 private:
  bool restarted_ = false;
};

std::filesystem::path test_tmp_root();

// The executables under test: the environment variable if set, else the path the build
// compiled in; throws Failure if neither names an existing file.
std::string idemproxy_binary();
std::string test_backend_binary();

}  // namespace idem::it
