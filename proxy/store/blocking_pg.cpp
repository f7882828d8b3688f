#include "store/blocking_pg.hpp"

#include <algorithm>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "common/text.hpp"
#include "pg/host_list.hpp"
#include "store/migrations.hpp"

namespace idem::store {
namespace {

void discard_notice(void*, const char*) {}

std::string trimmed_message(const char* msg) {
  return std::string(text::trim_end(msg ? msg : "", "\n "));
}

// The password values in `conninfo`, to scrub from libpq's messages. libpq's parser quotes
// the text it could not parse (a bad percent-escape, a keyword without '='), which in a
// malformed URL may be the password itself: such errors are reported without its text.
std::vector<std::string> conninfo_secrets(const std::string& conninfo) {
  char* parse_error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &parse_error);
  if (parsed == nullptr) {
    if (parse_error != nullptr) PQfreemem(parse_error);
    throw std::runtime_error(
        "database.url is neither a valid libpq URI nor valid conninfo (check its quoting and "
        "percent-encoding; libpq's own message is not shown because it may quote the password)");
  }
  std::vector<std::string> secrets;
  for (const PQconninfoOption* o = parsed; o->keyword != nullptr; ++o) {
    const std::string_view key = o->keyword;
    if ((key == "password" || key == "sslpassword") && o->val != nullptr && *o->val != '\0') {
      secrets.emplace_back(o->val);
    }
  }
  PQconninfoFree(parsed);
  return secrets;
}

std::string scrubbed(std::string message, const std::vector<std::string>& secrets) {
  for (const auto& secret : secrets) {
    for (auto at = message.find(secret); at != std::string::npos; at = message.find(secret, at)) {
      message.replace(at, secret.size(), "****");
      at += 4;
    }
  }
  return message;
}

}  // namespace

// One host at a time, as the pool does (pg/host_list.hpp): libpq's blocking connect
// would stop at the first server that answers with an error (a standby out of connection
// slots, say), never trying the primary listed after it.
ConnPtr connect_blocking(const std::string& conninfo, Millis connect_timeout) {
  const auto secrets = conninfo_secrets(conninfo);
  // libpq's connect_timeout is whole seconds (and at least 2 in effect); round up so a
  // sub-second setting still bounds the wait. It bounds each host, as in libpq.
  const auto seconds = std::max<long long>(1, (connect_timeout.count() + 999) / 1000);
  const std::string timeout = std::to_string(seconds);
  std::string parse_error;
  const auto attempts = pg::connect_attempts(conninfo, parse_error);
  if (attempts.empty()) {
    throw std::runtime_error("cannot connect to PostgreSQL: the connection string does not parse");
  }
  std::string messages;
  for (const auto& attempt : attempts) {
    std::vector<const char*> keys, values;
    for (const auto& [k, v] : attempt) {
      if (k == "connect_timeout" || k == "fallback_application_name") continue;
      keys.push_back(k.c_str());
      values.push_back(v.c_str());
    }
    keys.push_back("connect_timeout");
    values.push_back(timeout.c_str());
    keys.push_back("fallback_application_name");
    values.push_back("idemproxy-migrate");
    keys.push_back(nullptr);
    values.push_back(nullptr);
    ConnPtr conn(PQconnectdbParams(keys.data(), values.data(), 0));
    if (!conn) throw std::runtime_error("cannot connect to PostgreSQL: out of memory");
    if (PQstatus(conn.get()) == CONNECTION_OK) {
      // CREATE TABLE IF NOT EXISTS and friends raise NOTICEs that would go to stderr.
      PQsetNoticeProcessor(conn.get(), &discard_notice, nullptr);
      return conn;
    }
    if (!messages.empty()) messages += "; ";
    messages += scrubbed(trimmed_message(PQerrorMessage(conn.get())), secrets);
  }
  throw DatabaseUnreachable("cannot connect to PostgreSQL: " + messages);
}

ResultPtr exec(PGconn* conn, const char* sql, const std::vector<std::string>& params,
               const std::string& what) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p.c_str());
  // Without parameters, PQexec's simple protocol allows a migration file to hold many
  // statements; with parameters it must be one statement anyway.
  ResultPtr r(params.empty() ? PQexec(conn, sql)
                             : PQexecParams(conn, sql, static_cast<int>(values.size()),
                                            nullptr, values.data(), nullptr, nullptr, 0));
  const ExecStatusType st = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    const std::string msg =
        trimmed_message(r ? PQresultErrorMessage(r.get()) : PQerrorMessage(conn));
    throw std::runtime_error((what.empty() ? std::string("schema query failed")
                                           : what) + ": " + msg);
  }
  return r;
}


ExecResult exec_status(PGconn* conn, const char* sql, const std::vector<std::string>& params) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) values.push_back(p.c_str());
  ExecResult out;
  out.result.reset(params.empty() ? PQexec(conn, sql)
                                  : PQexecParams(conn, sql, static_cast<int>(values.size()),
                                                 nullptr, values.data(), nullptr, nullptr, 0));
  const ExecStatusType st = out.result ? PQresultStatus(out.result.get()) : PGRES_FATAL_ERROR;
  out.ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
  if (!out.ok) {
    const char* state = out.result ? PQresultErrorField(out.result.get(), PG_DIAG_SQLSTATE) : nullptr;
    out.sqlstate = state ? state : "";
    out.message = trimmed_message(out.result ? PQresultErrorMessage(out.result.get())
                                             : PQerrorMessage(conn));
  }
  return out;
}

}  // namespace idem::store
