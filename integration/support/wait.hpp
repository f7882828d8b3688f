#pragma once
// Moved to the shared test support (test_support/wait.hpp); the harness's names stay.
#include "test_support/wait.hpp"

namespace idem::it {

using test::Deadline;
using test::fail;
using test::Failure;
using test::kDefaultTimeout;
using test::Millis;
using test::wait_until;
using namespace std::chrono_literals;

}  // namespace idem::it
