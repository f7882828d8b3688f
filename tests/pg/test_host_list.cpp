// The pure host planner (pg/host_list.hpp): how a connection string becomes one connect
// attempt per host, in libpq's order.
#include <doctest/doctest.h>

#include <map>

#include "pg/host_list.hpp"

using namespace idem::pg::detail;

namespace {

EnvLookup env(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const char* name) -> const char* {
    const auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  };
}

std::string show(const HostPlan& p) {
  std::string s;
  for (const auto& t : p.targets) s += "[" + t.host + "|" + t.hostaddr + "|" + t.port + "]";
  return s;
}

std::string common(const HostPlan& p, const std::string& key) {
  for (const auto& [k, v] : p.common) {
    if (k == key) return v;
  }
  return "<none>";
}

}  // namespace

TEST_CASE("host_list: one host is one target; the other keywords pass unchanged") {
  const auto p = plan_hosts("postgresql://u@db.example:6432/orders?sslmode=require", env({}));
  CHECK(p.error.empty());
  CHECK_FALSE(p.whole_list);
  CHECK(show(p) == "[db.example||6432]");
  CHECK(common(p, "dbname") == "orders");
  CHECK(common(p, "user") == "u");
  CHECK(common(p, "sslmode") == "require");
  CHECK(common(p, "host") == "<none>");
}

TEST_CASE("host_list: a URI list with a port per host, in order") {
  const auto p = plan_hosts(
      "postgresql://a:5001,b:5002,10.0.0.3:5003/db?target_session_attrs=read-write", env({}));
  CHECK(show(p) == "[a||5001][b||5002][10.0.0.3||5003]");
  CHECK(p.session_attrs == "read-write");
  CHECK(common(p, "target_session_attrs") == "<none>");  // each attempt passes its own
}

TEST_CASE("host_list: one port for every host, or libpq's default") {
  CHECK(show(plan_hosts("host=a,b port=7000 dbname=x", env({}))) == "[a||7000][b||7000]");
  CHECK(show(plan_hosts("host=a,b dbname=x", env({}))) == "[a||][b||]");
}

TEST_CASE("host_list: hostaddr pairs with host; hostaddr alone names the servers") {
  CHECK(show(plan_hosts("host=a,b hostaddr=10.0.0.1,10.0.0.2 port=1,2", env({}))) ==
        "[a|10.0.0.1|1][b|10.0.0.2|2]");
  CHECK(show(plan_hosts("hostaddr=10.0.0.1,10.0.0.2", env({}))) == "[|10.0.0.1|][|10.0.0.2|]");
}

TEST_CASE("host_list: lists libpq would refuse go to libpq whole, for its own message") {
  auto p = plan_hosts("host=a,b,c port=1,2 dbname=x", env({}));
  CHECK(p.whole_list);
  CHECK(show(p) == "[a,b,c||1,2]");
  p = plan_hosts("host=a,b hostaddr=10.0.0.1 dbname=x", env({}));
  CHECK(p.whole_list);
}

TEST_CASE("host_list: the environment fills what the string leaves out, as in libpq") {
  const auto p = plan_hosts("dbname=x", env({{"PGHOST", "a,b"},
                                             {"PGPORT", "1,2"},
                                             {"PGTARGETSESSIONATTRS", "primary"}}));
  CHECK(show(p) == "[a||1][b||2]");
  CHECK(p.session_attrs == "primary");
  // The string wins over the environment.
  const auto q = plan_hosts("host=c port=3 target_session_attrs=any dbname=x",
                            env({{"PGHOST", "a,b"}, {"PGPORT", "1,2"},
                                 {"PGTARGETSESSIONATTRS", "primary"}}));
  CHECK(show(q) == "[c||3]");
  CHECK(q.session_attrs == "any");
  // Nothing anywhere: one target with libpq's defaults (the Unix socket, 5432).
  CHECK(show(plan_hosts("dbname=x", env({}))) == "[||]");
}

TEST_CASE("host_list: a string libpq cannot parse is an error, nothing is guessed") {
  const auto p = plan_hosts("host=a bogus_keyword=1", env({}));
  CHECK_FALSE(p.error.empty());
  CHECK(p.targets.empty());
}

TEST_CASE("host_list: prefer-standby over several targets is two passes") {
  CHECK(session_attrs_passes("prefer-standby", 2) == std::vector<std::string>{"standby", "any"});
  // One server: libpq's own two passes within its attempt.
  CHECK(session_attrs_passes("prefer-standby", 1) == std::vector<std::string>{"prefer-standby"});
  CHECK(session_attrs_passes("read-write", 3) == std::vector<std::string>{"read-write"});
  CHECK(session_attrs_passes("", 3) == std::vector<std::string>{""});
}

TEST_CASE("host_list: what needs a name lookup") {
  CHECK(needs_lookup("db.example"));
  CHECK(needs_lookup("localhost"));
  CHECK_FALSE(needs_lookup("127.0.0.1"));
  CHECK_FALSE(needs_lookup("::1"));
  CHECK_FALSE(needs_lookup("/var/run/postgresql"));
  CHECK_FALSE(needs_lookup("@abstract"));
  CHECK_FALSE(needs_lookup(""));
}

TEST_CASE("host_list: blocking connects get one complete keyword list per attempt") {
  std::string error;
  const auto attempts = idem::pg::connect_attempts(
      "postgresql://u@a:1,b:2/db?target_session_attrs=prefer-standby&sslmode=disable", error);
  CHECK(error.empty());
  REQUIRE(attempts.size() == 4);  // two passes over two hosts
  const auto value = [](const idem::pg::KeywordValues& kv, const std::string& key) {
    for (const auto& [k, v] : kv) {
      if (k == key) return v;
    }
    return std::string("<none>");
  };
  CHECK(value(attempts[0], "host") == "a");
  CHECK(value(attempts[0], "port") == "1");
  CHECK(value(attempts[0], "target_session_attrs") == "standby");
  CHECK(value(attempts[1], "host") == "b");
  CHECK(value(attempts[2], "target_session_attrs") == "any");
  CHECK(value(attempts[3], "dbname") == "db");
  CHECK(value(attempts[3], "sslmode") == "disable");
  CHECK(idem::pg::connect_attempts("host=a nonsense=1", error).empty());
  CHECK_FALSE(error.empty());
}
