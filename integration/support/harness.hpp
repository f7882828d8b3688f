#pragma once
// Everything an end-to-end suite needs, in one include:
//   wait.hpp          Failure, fail(), wait_until(), Deadline, kDefaultTimeout
//   env.hpp           database_url(), pgctl(), binaries, temp root
//   process.hpp       Process, TempDir, ExitStatus, run_command()
//   http.hpp          HttpClient, RawConnection, raw_exchange(), parse_response(), ports
//   db.hpp            Db (sync libpq for assertions), ScratchDatabase
// wait.hpp, http.hpp and db.hpp name what lives in the shared test support
// (test_support/, used by the unit tests too) under the harness's namespace.
//   test_backend.hpp  TestBackend, BackendCall
//   sidecar.hpp       SidecarOptions, RouteOptions, sidecar_config(), Sidecar
//   concurrently.hpp  concurrently(), Outcome
#include "support/concurrently.hpp"
#include "support/db.hpp"
#include "support/env.hpp"
#include "support/http.hpp"
#include "support/process.hpp"
#include "support/sidecar.hpp"
#include "support/test_backend.hpp"
#include "support/wait.hpp"
