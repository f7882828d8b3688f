#pragma once
// Moved to the shared test support (test_support/postgres.hpp); the harness's names stay.
#include "support/wait.hpp"
#include "test_support/postgres.hpp"

namespace idem::it {

using test::Db;
using test::Row;
using test::Rows;
using test::ScratchDatabase;
using test::SqlParam;
using test::SqlParams;

}  // namespace idem::it
