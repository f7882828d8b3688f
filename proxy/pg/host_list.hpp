#pragma once
// The hosts of a connection string, one connect attempt each (internal to pg/). Pure: no
// name lookup, no socket; connection.cpp resolves names and drives the attempts.
//
// libpq tries a multi-host list (host=a,b or postgresql://a:1,b:2/...) in order and moves
// on when a host cannot be reached or does not match target_session_attrs. Handing it
// the whole list falls short during a failover in two ways:
//   * its connect_timeout, which bounds each host separately, only exists in its blocking
//     connect: with PQconnectPoll the caller keeps time, and one deadline over the list
//     lets a host that never answers (a crashed machine, a partition: no RST, only
//     silence) use up the time of every host after it;
//   * a server that answers the startup with an error ends the whole connect, the hosts
//     after it untried (libpq moves on after 57P03 "the database system is starting up"
//     only): a standby out of connection slots (53300), one that has not replayed a new
//     database yet (3D000), one that refuses this role. Any of them before the primary in
//     the list would keep every new session from reaching the primary.
// So each host gets its own attempt, with the whole connect_timeout, and a failed attempt
// moves on to the next whatever the reason (the one departure from libpq: a host is never
// skipped for an earlier one's error), in the order libpq would follow:
//   * hosts, hostaddrs and ports are split as libpq splits them (one port for all, or one
//     per host);
//   * target_session_attrs is a property of one server (read-write, primary, standby,
//     read-only, any) and libpq checks it per attempt, except prefer-standby, which looks
//     at the whole list: a first pass accepts only a standby, a second one anything.
// Lists libpq would refuse (a hostaddr list whose length differs from the host list, port
// counts that match nothing) are passed through whole in one attempt, so libpq reports
// the error in its own words.
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace idem::pg::detail {

struct HostTarget {
  std::string host;      // "" = libpq's default (PGHOST, then the Unix socket)
  std::string hostaddr;  // "" = libpq resolves host itself (or connection.cpp does first)
  std::string port;      // "" = libpq's default (PGPORT, then 5432)
};

struct HostPlan {
  // Every keyword of the connection string but host, hostaddr and port (and
  // target_session_attrs when passes override it), with its value, in libpq's order.
  std::vector<std::pair<std::string, std::string>> common;
  std::vector<HostTarget> targets;  // at least one
  // The lists as given, for libpq to judge in one attempt: nothing is looked up.
  bool whole_list = false;
  // target_session_attrs from the string or PGTARGETSESSIONATTRS ("" = neither); taken
  // out of `common`, each attempt passes the value of its pass (session_attrs_passes).
  std::string session_attrs;
  std::string error;  // set when libpq cannot parse the string; nothing else is
};

// Reads the environment like libpq (PGHOST, PGHOSTADDR, PGPORT, PGTARGETSESSIONATTRS)
// through `getenv`, for what the string leaves out.
using EnvLookup = std::function<const char*(const char*)>;
HostPlan plan_hosts(const std::string& conninfo, const EnvLookup& getenv);

// The target_session_attrs of each pass over `targets` attempts (after names were
// resolved, each address counting as a target, as in libpq): {attrs}, or for
// prefer-standby over several targets {"standby", "any"}.
std::vector<std::string> session_attrs_passes(const std::string& attrs, std::size_t targets);

// Entries libpq will not look up: empty (default), Unix socket directories and abstract
// sockets, and literal addresses.
bool needs_lookup(const std::string& host);

}  // namespace idem::pg::detail

namespace idem::pg {

// For blocking connects (migrations, which run before any event loop): the keyword/value
// lists of every attempt, in order, each a complete set for PQconnectdbParams with
// expand_dbname = 0. Names are left to libpq. Empty, with `error` set, when the string
// does not parse.
using KeywordValues = std::vector<std::pair<std::string, std::string>>;
std::vector<KeywordValues> connect_attempts(const std::string& conninfo, std::string& error);

}  // namespace idem::pg
