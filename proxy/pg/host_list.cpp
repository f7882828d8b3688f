#include "pg/host_list.hpp"

#include <cstdlib>
#include <string_view>

#include <boost/asio/ip/address.hpp>
#include <libpq-fe.h>

#include "common/types.hpp"

namespace idem::pg::detail {
namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = s.find(',', start);
    parts.push_back(s.substr(start, comma - start));
    if (comma == std::string::npos) return parts;
    start = comma + 1;
  }
}

std::string from_env(const EnvLookup& getenv, const char* name) {
  const char* v = getenv ? getenv(name) : nullptr;
  return v ? std::string(v) : std::string();
}

}  // namespace

bool needs_lookup(const std::string& host) {
  if (host.empty() || host[0] == '/' || host[0] == '@') return false;
  error_code ec;
  asio::ip::make_address(host, ec);
  return static_cast<bool>(ec);
}

HostPlan plan_hosts(const std::string& conninfo, const EnvLookup& getenv) {
  HostPlan plan;
  char* parse_error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &parse_error);
  if (!parsed) {
    plan.error = parse_error ? parse_error : "invalid connection string";
    if (parse_error) PQfreemem(parse_error);
    return plan;
  }
  std::string host, hostaddr, port;
  bool attrs_given = false;
  for (PQconninfoOption* o = parsed; o->keyword; ++o) {
    if (!o->val) continue;
    const std::string_view key = o->keyword;
    if (key == "host") {
      host = o->val;
    } else if (key == "hostaddr") {
      hostaddr = o->val;
    } else if (key == "port") {
      port = o->val;
    } else if (key == "target_session_attrs") {
      plan.session_attrs = o->val;
      attrs_given = true;
    } else {
      plan.common.emplace_back(o->keyword, o->val);
    }
  }
  PQconninfoFree(parsed);
  // What the string leaves out comes from the environment, as libpq would take it: the
  // lists must be split here, so they must be known here.
  if (host.empty() && hostaddr.empty()) {
    host = from_env(getenv, "PGHOST");
    hostaddr = from_env(getenv, "PGHOSTADDR");
  }
  if (port.empty()) port = from_env(getenv, "PGPORT");
  if (!attrs_given) plan.session_attrs = from_env(getenv, "PGTARGETSESSIONATTRS");

  const std::vector<std::string> hosts = split_commas(host);
  const std::vector<std::string> addrs = split_commas(hostaddr);
  const std::vector<std::string> ports = split_commas(port);
  // libpq: with both lists given they pair up one to one; a hostaddr list alone names
  // the servers; the port list has one entry for all or one per server.
  const std::size_t servers = hostaddr.empty() ? hosts.size() : addrs.size();
  const bool lists_pair = host.empty() || hostaddr.empty() || hosts.size() == addrs.size();
  const bool ports_fit = ports.size() == 1 || ports.size() == servers;
  if (!lists_pair || !ports_fit) {
    plan.whole_list = true;
    plan.targets.push_back(HostTarget{host, hostaddr, port});
    return plan;
  }
  for (std::size_t i = 0; i < servers; ++i) {
    HostTarget t;
    if (!host.empty()) t.host = hosts[i];
    if (!hostaddr.empty()) t.hostaddr = addrs[i];
    t.port = ports.size() == 1 ? ports[0] : ports[i];
    plan.targets.push_back(std::move(t));
  }
  return plan;
}

std::vector<std::string> session_attrs_passes(const std::string& attrs, std::size_t targets) {
  if (attrs == "prefer-standby" && targets > 1) return {"standby", "any"};
  return {attrs};
}

}  // namespace idem::pg::detail

namespace idem::pg {

std::vector<KeywordValues> connect_attempts(const std::string& conninfo, std::string& error) {
  const detail::HostPlan plan =
      detail::plan_hosts(conninfo, [](const char* name) { return std::getenv(name); });
  std::vector<KeywordValues> out;
  if (!plan.error.empty()) {
    error = plan.error;
    return out;
  }
  for (const std::string& attrs :
       detail::session_attrs_passes(plan.session_attrs, plan.targets.size())) {
    for (const detail::HostTarget& t : plan.targets) {
      KeywordValues kv = plan.common;
      if (!t.host.empty()) kv.emplace_back("host", t.host);
      if (!t.hostaddr.empty()) kv.emplace_back("hostaddr", t.hostaddr);
      if (!t.port.empty()) kv.emplace_back("port", t.port);
      if (!attrs.empty()) kv.emplace_back("target_session_attrs", attrs);
      out.push_back(std::move(kv));
    }
  }
  return out;
}

}  // namespace idem::pg
