#pragma once
// Blocking libpq for the commands that run before any event loop (migrate, the start-up
// schema check, migrate --plan). Never used on the request path.
#include <memory>
#include <string>
#include <vector>

#include <libpq-fe.h>

#include "common/types.hpp"

namespace idem::store {

struct ConnCloser {
  void operator()(PGconn* c) const { PQfinish(c); }
};
struct ResultClearer {
  void operator()(PGresult* r) const { PQclear(r); }
};
using ConnPtr = std::unique_ptr<PGconn, ConnCloser>;
using ResultPtr = std::unique_ptr<PGresult, ResultClearer>;

// Tries each host of the list in turn (pg/host_list.hpp), each bounded by
// `connect_timeout`. Throws DatabaseUnreachable (store/migrations.hpp) with libpq's
// messages, passwords scrubbed, when no host accepted the connection; std::runtime_error
// when the connection string does not parse.
ConnPtr connect_blocking(const std::string& conninfo, Millis connect_timeout);

// Runs `sql` (several statements when there are no parameters); throws
// std::runtime_error("<what>: <server message>") unless it succeeds.
ResultPtr exec(PGconn* conn, const char* sql, const std::vector<std::string>& params = {},
               const std::string& what = {});

// The same without throwing: the caller decides from the SQLSTATE (a lock not granted in
// time is retried; anything else is not).
struct ExecResult {
  ResultPtr result;
  bool ok = false;
  std::string sqlstate;
  std::string message;
};
ExecResult exec_status(PGconn* conn, const char* sql, const std::vector<std::string>& params = {});

}  // namespace idem::store
