// YAML -> Settings. The walk is explicit (one function per section, one line per key) rather
// than table-driven: every key's type, range and error message is visible next to its name,
// and the struct defaults in settings.hpp stay the single source of default values.
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/text.hpp"
#include "settings/detail.hpp"
#include "settings/settings.hpp"

namespace idem::settings {

namespace {

using detail::SyntaxError;

// A YAML node with where it came from, so every error names file, line and key.
struct Item {
  YAML::Node node;
  std::string path;  // "routes[1].fingerprint.fields[2]"
  int line = 0;      // 1-based; 0 when unknown
};

int line_of(const YAML::Node& n, int fallback) {
  const auto mark = n.Mark();
  return mark.is_null() || mark.line < 0 ? fallback : mark.line + 1;
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "nothing (null)";
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Undefined: break;
  }
  return "nothing";
}

bool is_identifier_key(std::string_view k) {
  return !k.empty() && std::all_of(k.begin(), k.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string child_path(const std::string& parent, std::string_view key) {
  // Keys such as "/currency" (defaults) read better quoted than dotted.
  const std::string k = is_identifier_key(key) ? std::string(key) : detail::json_quote(key);
  if (parent.empty()) return k;
  return is_identifier_key(key) ? parent + "." + k : parent + "[" + k + "]";
}


// Edit distance, to suggest "connect_timeout" for "conect_timeout".
std::size_t distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

class Loader {
 public:
  Loader(std::string file, detail::EnvLookup env, LoadOptions options = {})
      : file_(std::move(file)), env_(std::move(env)), options_(options) {}

  const LoadOptions& options() const { return options_; }

  [[noreturn]] void fail(int line, const std::string& key, const std::string& message) const {
    throw ConfigError(file_, line, key, message);
  }
  [[noreturn]] void fail(const Item& at, const std::string& message) const {
    fail(at.line, at.path, message);
  }

  // The scalar's text after ${VAR} expansion; every typed reader starts here, so
  // "pool_size: ${POOL:-8}" is expanded before it is read as a number.
  std::string text(const Item& it) const {
    if (!it.node.IsScalar()) {
      fail(it, "expected a value, got " + describe(it.node) +
                   (it.node.IsNull() ? " (write \"\" for an empty string)" : ""));
    }
    try {
      return detail::expand_env(it.node.Scalar(), env_);
    } catch (const SyntaxError& e) {
      fail(it, e.what());
    }
  }

  // A string that must not be empty and must not hide control characters (a stray tab or
  // newline in a header name or scope would never match anything).
  std::string word(const Item& it, bool allow_empty = false) const {
    auto s = text(it);
    if (s.empty() && !allow_empty) fail(it, "must not be empty");
    if (std::any_of(s.begin(), s.end(), [](char c) {
          return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
        })) {
      fail(it, "must not contain control characters");
    }
    return s;
  }

  bool boolean(const Item& it) const {
    const auto s = text(it);
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    fail(it, "expected true or false, got '" + s + "'");
  }

  std::int64_t integer(const Item& it, std::int64_t min, std::int64_t max) const {
    const auto s = text(it);
    const auto v = detail::parse_int(s);
    if (!v) fail(it, "expected an integer, got '" + s + "'");
    if (*v < min || *v > max) {
      fail(it, "must be between " + std::to_string(min) + " and " + std::to_string(max) +
                   ", got " + s);
    }
    return *v;
  }

  Millis duration(const Item& it, Millis min) const {
    const auto s = text(it);
    Millis d{};
    try {
      d = detail::duration_checked(s);
    } catch (const SyntaxError& e) {
      fail(it, e.what());
    }
    if (d < min) fail(it, "must be at least " + detail::format_duration(min) + ", got " + s);
    return d;
  }

  std::size_t size(const Item& it, std::size_t min, std::size_t max) const {
    const auto s = text(it);
    std::size_t v = 0;
    try {
      v = detail::size_checked(s);
    } catch (const SyntaxError& e) {
      fail(it, e.what());
    }
    if (v < min || v > max) {
      fail(it, "must be between " + detail::format_size(min) + " and " + detail::format_size(max) +
                   ", got " + s);
    }
    return v;
  }

  template <class E>
  E choice(const Item& it, std::initializer_list<std::pair<std::string_view, E>> options) const {
    const auto s = text(it);
    std::string names;
    for (const auto& [name, value] : options) {
      if (s == name) return value;
      names += (names.empty() ? "" : " | ") + std::string(name);
    }
    fail(it, "invalid value '" + s + "': expected " + names);
  }

  std::string token(const Item& it, std::string_view what) const {
    const auto s = text(it);
    if (!detail::is_token(s)) fail(it, "'" + s + "' is not a valid " + std::string(what));
    return s;
  }

  template <class F>
  auto with_syntax(const Item& it, F&& f) const -> decltype(f()) {
    try {
      return f();
    } catch (const SyntaxError& e) {
      fail(it, e.what());
    }
  }

  std::vector<Item> list(const Item& it) const {
    if (!it.node.IsSequence()) fail(it, "expected a list, got " + describe(it.node));
    std::vector<Item> items;
    std::size_t i = 0;
    for (const auto& n : it.node) {
      items.push_back({n, it.path + "[" + std::to_string(i++) + "]", line_of(n, it.line)});
    }
    return items;
  }

  // A list of names compared case-insensitively (header names): duplicates are refused
  // because they are always a copy-paste slip.
  std::vector<std::string> header_list(const Item& it) const {
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (const auto& h : list(it)) {
      auto name = token(h, "header name");
      if (!seen.insert(idem::text::lowercase(name)).second) fail(h, "header '" + name + "' is listed twice");
      out.push_back(std::move(name));
    }
    return out;
  }

  std::string pointer(const Item& it) const {
    auto p = text(it);
    if (!detail::is_json_pointer(p)) {
      fail(it, "'" + p + "' is not a JSON Pointer (RFC 6901): it must be \"\" or start with '/', "
               "and '~' must be written ~0, '/' inside a name ~1");
    }
    return p;
  }

  // A fingerprint default as JSON text. The YAML tag decides the type: a quoted "100" is a
  // string, a plain 100 a number, so the author's quoting means what it means in JSON.
  std::string json_value(const Item& it) const {
    const auto& n = it.node;
    if (n.IsNull()) return "null";
    if (n.IsSequence()) {
      std::string out = "[";
      bool first = true;
      for (const auto& child : list(it)) {
        out += (first ? "" : ",") + json_value(child);
        first = false;
      }
      return out + "]";
    }
    if (n.IsMap()) {
      // Sorted keys: the canonical form the fingerprint hashes.
      std::map<std::string, std::string> members;
      for (const auto& kv : n) {
        const Item key{kv.first, it.path, line_of(kv.first, it.line)};
        if (!kv.first.IsScalar()) fail(key, "mapping keys must be plain strings");
        const auto& k = kv.first.Scalar();
        const Item value{kv.second, child_path(it.path, k), key.line};
        if (!members.emplace(k, json_value(value)).second) fail(value, "duplicate key '" + k + "'");
      }
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : members) {
        out += (first ? "" : ",") + detail::json_quote(k) + ":" + v;
        first = false;
      }
      return out + "}";
    }
    const std::string tag = n.Tag();
    auto s = text(it);
    if (tag == "!" || tag == "tag:yaml.org,2002:str") return detail::json_quote(s);
    if (tag != "?") {
      fail(it, "unsupported YAML tag '" + tag + "': quote strings, write numbers, true, false "
               "and null plainly");
    }
    if (s == "true" || s == "True" || s == "TRUE") return "true";
    if (s == "false" || s == "False" || s == "FALSE") return "false";
    if (s == "null" || s == "Null" || s == "NULL" || s == "~") return "null";
    if (detail::is_json_number(s)) return s;
    // YAML reads ".5", "+1", "0x1F" or ".inf" as numbers, JSON has no such forms: guessing
    // either way would hash something the author did not mean.
    static const std::regex yaml_number(
        R"([-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?|0o[0-7]+|0x[0-9a-fA-F]+|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN))");
    if (std::regex_match(s, yaml_number)) {
      fail(it, "'" + s + "' is a YAML number but not a JSON number: write it as JSON "
               "(e.g. 0.5, 1, 1e3) or quote it to make it a string");
    }
    return detail::json_quote(s);
  }

 private:
  std::string file_;
  detail::EnvLookup env_;
  LoadOptions options_;
};

// A YAML mapping whose keys are checked against the allowed set when it is opened, so an
// unknown or misspelt key is reported even when a later key has a bad value.
class Map {
 public:
  Map(const Loader& loader, const Item& self, std::initializer_list<std::string_view> allowed)
      : loader_(loader), self_(self) {
    if (self.node.IsNull() && self.path.empty()) return;  // an empty file: all defaults
    if (!self.node.IsMap()) loader.fail(self, "expected a mapping, got " + describe(self.node));
    std::vector<Item> merges;
    for (const auto& kv : self.node) {
      const int line = line_of(kv.first, self.line);
      if (!kv.first.IsScalar()) loader.fail(line, self.path, "keys must be plain names");
      const std::string& key = kv.first.Scalar();
      Item item{kv.second, child_path(self.path, key), line};
      if (key == "<<" && kv.first.Tag() == "?") {
        // YAML merge key ("<<: *route_defaults"), which yaml-cpp 0.7 leaves to the
        // application: routes sharing lease, store and replay settings are the common case.
        if (item.node.IsMap()) {
          merges.push_back(item);
        } else if (item.node.IsSequence()) {
          for (const auto& m : loader.list(item)) merges.push_back(m);
        } else {
          loader.fail(item, "'<<' merges a mapping (or a list of mappings), got " + describe(item.node));
        }
        continue;
      }
      add(loader, key, std::move(item), allowed, true);
    }
    // Explicit keys win over merged ones, and earlier merged mappings over later ones.
    for (const auto& source : merges) {
      if (!source.node.IsMap()) loader.fail(source, "'<<' merges mappings, got " + describe(source.node));
      for (const auto& kv : source.node) {
        if (!kv.first.IsScalar()) loader.fail(source, "keys must be plain names");
        const std::string& key = kv.first.Scalar();
        add(loader, key, Item{kv.second, child_path(self.path, key), line_of(kv.first, source.line)},
            allowed, false);
      }
    }
  }

  std::optional<Item> get(std::string_view key) const {
    for (const auto& [k, item] : entries_) {
      if (k == key) return item;
    }
    return std::nullopt;
  }

  Item required(std::string_view key) const {
    if (auto item = get(key)) return *item;
    loader_.fail(self_.line, child_path(self_.path, key),
                 "missing required key '" + std::string(key) + "'");
  }

  const Item& self() const { return self_; }

 private:
  void add(const Loader& loader, const std::string& key, Item item,
           std::initializer_list<std::string_view> allowed, bool explicit_key) {
    if (key == "<<") loader.fail(item, "nested merge keys are not supported");
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      loader.fail(item, "unknown key '" + key + "'" + suggestion(key, allowed));
    }
    if (std::any_of(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == key; })) {
      if (!explicit_key) return;  // overridden by the mapping itself or an earlier merge
      loader.fail(item, "duplicate key '" + key + "'");
    }
    entries_.emplace_back(key, std::move(item));
  }

  static std::string suggestion(const std::string& key,
                                std::initializer_list<std::string_view> allowed) {
    std::string best;
    std::size_t best_distance = 3;  // beyond two edits a guess is more confusing than helpful
    std::string all;
    for (auto a : allowed) {
      all += (all.empty() ? "" : ", ") + std::string(a);
      const auto d = distance(key, a);
      if (d < best_distance) {
        best_distance = d;
        best = std::string(a);
      }
    }
    if (!best.empty()) return " (did you mean '" + best + "'?)";
    return " (allowed here: " + all + ")";
  }

  const Loader& loader_;
  Item self_;
  std::vector<std::pair<std::string, Item>> entries_;
};

constexpr std::size_t KiB = 1u << 10;
constexpr std::size_t MiB = 1u << 20;
constexpr std::size_t GiB = 1u << 30;
constexpr Millis kOneMs{1};

void parse_upstream_tls(const Loader& L, const Item& it, UpstreamTls& t) {
  Map m(L, it, {"ca_file", "server_name", "verify"});
  // "" is each key's documented default (the system's trust store; the url's host), and
  // what check-config prints for it: accepted, so that the printed file loads back.
  if (auto v = m.get("ca_file")) t.ca_file = L.word(*v, true);
  if (auto v = m.get("server_name")) {
    t.server_name = L.word(*v, true);
    if (t.server_name.find_first_of(" /:@[]") != std::string::npos) {
      L.fail(*v, "'" + t.server_name + "' is not a host name or an IP address");
    }
  }
  if (auto v = m.get("verify")) t.verify = L.boolean(*v);
}

void parse_upstream(const Loader& L, const Item& it, UpstreamSettings& u) {
  Map m(L, it, {"url", "connect_timeout", "response_timeout", "max_response_body", "tls"});
  const auto url = m.required("url");
  L.with_syntax(url, [&] { detail::parse_upstream_url(L.text(url), u); });
  if (auto v = m.get("connect_timeout")) u.connect_timeout = L.duration(*v, kOneMs);
  if (auto v = m.get("response_timeout")) u.response_timeout = L.duration(*v, kOneMs);
  if (auto v = m.get("max_response_body")) u.max_response_body = L.size(*v, 1, GiB);
  if (auto v = m.get("tls")) {
    // Settings for a connection that is never made would hide the mistake of a url that
    // still says http://.
    if (!u.https) L.fail(*v, "upstream.tls needs an https:// upstream url");
    parse_upstream_tls(L, *v, u.tls);
  }
}

// Top-level `tls`: the listener's certificate, key and (for client certificates) CAs.
ListenerTls parse_listener_tls(const Loader& L, const Item& it) {
  ListenerTls t;
  Map m(L, it, {"cert_file", "key_file", "client_ca_file"});
  t.cert_file = L.word(m.required("cert_file"));
  t.key_file = L.word(m.required("key_file"));
  if (auto v = m.get("client_ca_file")) t.client_ca_file = L.word(*v, true);
  return t;
}

// A section written as a single value is reported without quoting it (the generic message
// quotes it): a database URL or token pasted where the mapping belongs carries a secret.
void refuse_secret_scalar(const Loader& L, const Item& it, std::string_view keys) {
  if (it.node.IsScalar()) {
    L.fail(it, "expected a mapping (" + std::string(keys) +
                   "), got a single value (not shown: it may hold a secret)");
  }
}

void parse_database(const Loader& L, const Item& it, DatabaseSettings& d) {
  refuse_secret_scalar(L, it, "url, pool_size, ...");
  Map m(L, it, {"url", "pool_size", "connect_timeout", "statement_timeout", "migrate",
                "start_wait", "batching", "batch_max"});
  const auto url = m.required("url");
  d.url = L.text(url);
  if (d.url.empty()) {
    L.fail(url, "must not be empty (a libpq URI such as postgresql://user@host/db, or conninfo)");
  }
  // Read as libpq will read it (without connecting), while the file and line are known:
  // a value libpq refuses would otherwise pass check-config and a reload, and fail at the
  // first connection. The message quotes nothing of the value (it holds the password).
  if (auto problem = detail::database_url_problem(d.url)) {
    L.fail(url, "expected a libpq URI (postgresql://...) or conninfo (host=... dbname=...): " +
                    *problem);
  }
  if (auto v = m.get("pool_size")) d.pool_size = static_cast<int>(L.integer(*v, 1, 1000));
  if (auto v = m.get("connect_timeout")) d.connect_timeout = L.duration(*v, kOneMs);
  if (auto v = m.get("statement_timeout")) d.statement_timeout = L.duration(*v, kOneMs);
  if (auto v = m.get("start_wait")) d.start_wait = L.duration(*v, Millis{0});
  if (auto v = m.get("batching")) d.batching = L.boolean(*v);
  if (auto v = m.get("batch_max")) d.batch_max = static_cast<int>(L.integer(*v, 2, 1000));
  if (auto v = m.get("migrate")) {
    d.migrate = L.choice<MigrateMode>(
        *v, {{"check", MigrateMode::check}, {"auto", MigrateMode::automatic}, {"off", MigrateMode::off}});
  }
}

// Accepted issuers or audiences: a non-empty list of distinct, non-empty values.
std::vector<std::string> value_list(const Loader& L, const Item& it) {
  std::vector<std::string> out;
  for (const auto& e : L.list(it)) {
    auto value = L.word(e);
    if (std::find(out.begin(), out.end(), value) != out.end()) {
      L.fail(e, "'" + value + "' is listed twice");
    }
    out.push_back(std::move(value));
  }
  if (out.empty()) L.fail(it, "must list at least one value");
  return out;
}

// Returns whether principal_claim was written (it needs tenant.principal_header).
bool parse_jwt(const Loader& L, const Item& it, JwtSettings& j) {
  Map m(L, it, {"jwks_file", "issuers", "audiences", "tenant_claim", "principal_claim", "leeway"});
  j.jwks_file = L.word(m.required("jwks_file"));
  j.issuers = value_list(L, m.required("issuers"));
  j.audiences = value_list(L, m.required("audiences"));
  j.tenant_claim = L.word(m.required("tenant_claim"));
  bool principal_claim = false;
  if (auto v = m.get("principal_claim")) {
    j.principal_claim = L.word(*v);
    principal_claim = true;
  }
  if (auto v = m.get("leeway")) {
    j.leeway = L.duration(*v, Millis{0});
    // A token that stays valid for long past its expiry is no longer short-lived.
    if (j.leeway > Millis{5 * 60 * 1000}) L.fail(*v, "must be at most 5m");
  }
  if (j.principal_claim == j.tenant_claim) {
    L.fail(principal_claim ? m.get("principal_claim")->line : it.line, it.path + ".principal_claim",
           "the principal claim must differ from the tenant claim");
  }
  return principal_claim;
}

void parse_mtls(const Loader& L, const Item& it, MtlsSettings& t) {
  Map m(L, it, {"uri_prefix"});
  const auto v = m.required("uri_prefix");
  t.uri_prefix = L.word(v);
  // The tenant is the segment after the prefix: a prefix that does not end a segment would
  // let "tenant/acme" and "tenant-other/acme" both map.
  if (t.uri_prefix.find(':') == std::string::npos || t.uri_prefix.back() != '/') {
    L.fail(v, "expected a URI prefix ending in '/', e.g. spiffe://orders.example/tenant/");
  }
}

void parse_tenant(const Loader& L, const Item& it, TenantSettings& t) {
  Map m(L, it, {"header", "principal_header", "from", "jwt", "mtls"});
  if (auto v = m.get("header")) t.header = L.token(*v, "header name");
  if (auto v = m.get("principal_header")) {
    const auto s = L.text(*v);
    t.principal_header = s.empty() ? s : L.token(*v, "header name");
  }
  if (auto v = m.get("from")) {
    t.from = L.choice<TenantSource>(
        *v, {{"header", TenantSource::header}, {"jwt", TenantSource::jwt}, {"mtls", TenantSource::mtls}});
  }
  // A jwt or mtls section under another mode would read as protection that is not there.
  const auto jwt = m.get("jwt");
  const auto mtls = m.get("mtls");
  if (jwt && t.from != TenantSource::jwt) L.fail(*jwt, "tenant.jwt applies only with tenant.from: jwt");
  if (mtls && t.from != TenantSource::mtls) L.fail(*mtls, "tenant.mtls applies only with tenant.from: mtls");
  if (t.from == TenantSource::jwt) {
    const auto section = m.required("jwt");
    if (parse_jwt(L, section, t.jwt) && t.principal_header.empty()) {
      L.fail(section.line, section.path + ".principal_claim",
             "principal_claim needs tenant.principal_header (the header the gateway sets it in)");
    }
  }
  if (t.from == TenantSource::mtls) parse_mtls(L, m.required("mtls"), t.mtls);
}

void parse_limits(const Loader& L, const Item& it, Limits& l) {
  Map m(L, it, {"max_header_bytes", "max_request_body", "header_timeout", "body_timeout",
                "idle_timeout", "max_connections", "drain_timeout"});
  // A request line plus a handful of headers does not fit in less than 1KiB.
  if (auto v = m.get("max_header_bytes")) l.max_header_bytes = L.size(*v, KiB, MiB);
  if (auto v = m.get("max_request_body")) l.max_request_body = L.size(*v, 1, GiB);
  if (auto v = m.get("header_timeout")) l.header_timeout = L.duration(*v, kOneMs);
  if (auto v = m.get("body_timeout")) l.body_timeout = L.duration(*v, kOneMs);
  if (auto v = m.get("idle_timeout")) l.idle_timeout = L.duration(*v, kOneMs);
  if (auto v = m.get("max_connections")) {
    l.max_connections = static_cast<std::size_t>(L.integer(*v, 1, 1'000'000));
  }
  // Zero is allowed: exit as soon as the listeners are closed, cutting off whatever runs.
  if (auto v = m.get("drain_timeout")) l.drain_timeout = L.duration(*v, Millis{0});
}

void parse_admin(const Loader& L, const Item& it, AdminSettings& a) {
  refuse_secret_scalar(L, it, "listen, token");
  Map m(L, it, {"listen", "token"});
  if (auto v = m.get("listen")) {
    const auto s = L.text(*v);
    if (s.empty()) {
      a.listen.reset();
    } else {
      a.listen = L.with_syntax(*v, [&] { return detail::parse_endpoint(s); });
    }
  }
  if (auto v = m.get("token")) a.token = L.word(*v, true);
}

void parse_log(const Loader& L, const Item& it, LogSettings& l) {
  Map m(L, it, {"level", "format"});
  if (auto v = m.get("level")) {
    l.level = L.choice<LogLevel>(*v, {{"trace", LogLevel::trace},
                                      {"debug", LogLevel::debug},
                                      {"info", LogLevel::info},
                                      {"warn", LogLevel::warn},
                                      {"error", LogLevel::error}});
  }
  if (auto v = m.get("format")) {
    l.format = L.choice<LogFormat>(*v, {{"json", LogFormat::json}, {"text", LogFormat::text}});
  }
}

void parse_cleanup(const Loader& L, const Item& it, CleanupSettings& c) {
  Map m(L, it, {"interval", "batch"});
  if (auto v = m.get("interval")) c.interval = L.duration(*v, kOneMs);
  if (auto v = m.get("batch")) c.batch = static_cast<std::size_t>(L.integer(*v, 1, 100'000));
}

void parse_replay_cache(const Loader& L, const Item& it, ReplayCacheSettings& c) {
  Map m(L, it, {"enabled", "max_bytes", "ttl"});
  if (auto v = m.get("enabled")) c.enabled = L.boolean(*v);
  if (auto v = m.get("max_bytes")) c.max_bytes = L.size(*v, 0, 4 * GiB);
  if (auto v = m.get("ttl")) c.ttl = L.duration(*v, kOneMs);
}

void parse_tracing(const Loader& L, const Item& it, TracingSettings& t) {
  Map m(L, it, {"otlp_endpoint", "sample"});
  if (auto v = m.get("otlp_endpoint")) {
    t.otlp_endpoint = L.text(*v);
    if (!t.otlp_endpoint.empty()) {
      UpstreamSettings u;
      L.with_syntax(*v, [&] { detail::parse_upstream_url(t.otlp_endpoint, u); });
      // Spans go to a collector beside the sidecar (an agent or node collector); TLS to it
      // is not implemented, so a URL that asks for it is refused rather than sent in clear.
      if (u.https) L.fail(*v, "https is not supported for otlp_endpoint: use a local collector over http://");
      t.host = u.host;
      t.port = u.port;
      t.path = u.base_path.empty() ? "/v1/traces" : u.base_path;
    }
  }
  if (auto v = m.get("sample")) {
    const auto text = L.text(*v);
    double d = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
    if (ec != std::errc{} || end != text.data() + text.size() || !(d >= 0 && d <= 1)) {
      L.fail(*v, "must be a number from 0 to 1 (the share of new traces sampled)");
    }
    t.sample = d;
  }
}

void parse_encryption(const Loader& L, const Item& it, EncryptionSettings& e) {
  Map m(L, it, {"keys", "active", "allow_clear_backend_records"});
  const auto keys = m.required("keys");
  const auto items = L.list(keys);
  if (items.empty()) L.fail(keys, "must be a non-empty list of {id, file}");
  std::set<std::string> ids;
  for (const auto& k : items) {
    Map km(L, k, {"id", "file"});
    EncryptionKeyFile f;
    const auto id = km.required("id");
    f.id = L.word(id);
    if (f.id.size() > 64 || f.id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
                                std::string::npos) {
      L.fail(id, "a key id is 1-64 of A-Z a-z 0-9 . _ - (it is stored with every record)");
    }
    if (!ids.insert(f.id).second) L.fail(id, "key id '" + f.id + "' is listed twice");
    f.file = L.word(km.required("file"));
    e.keys.push_back(std::move(f));
  }
  const auto active = m.required("active");
  e.active = L.word(active);
  if (ids.count(e.active) == 0) L.fail(active, "'" + e.active + "' is not the id of one of encryption.keys");
  if (auto v = m.get("allow_clear_backend_records")) e.allow_clear_backend_records = L.boolean(*v);
}

// Returns the line of key.header, for the cross-check against the tenant headers. Whether
// key.pointer suits the body's format is checked when the route is compiled.
int parse_key(const Loader& L, const Item& it, KeySettings& k) {
  Map m(L, it, {"from", "header", "pointer", "param", "required", "max_length"});
  int header_line = it.line;
  if (auto v = m.get("from")) {
    k.from = L.choice<KeySource>(
        *v, {{"header", KeySource::header}, {"body", KeySource::body}, {"query", KeySource::query}});
  }
  if (auto v = m.get("header")) {
    k.header = L.token(*v, "header name");
    header_line = v->line;
  }
  // Each source has its own address, and only that one: a pointer on a query route (or a
  // param on a body route) would read as a second place the key may come from.
  const auto pointer = m.get("pointer");
  const auto param = m.get("param");
  if (pointer && k.from != KeySource::body) L.fail(*pointer, "key.pointer is only used with key.from: body");
  if (param && k.from != KeySource::query) L.fail(*param, "key.param is only used with key.from: query");
  if (k.from == KeySource::body) {
    const auto v = pointer ? *pointer : m.required("pointer");
    k.pointer = L.word(v);
    if (!detail::is_key_pointer(k.pointer)) {
      L.fail(v, "'" + k.pointer + "' is neither a JSON Pointer to a member (\"/idempotency_key\", "
                "no '*' segment) nor a form field path (\"idempotency_key\", \"meta[key]\")");
    }
  }
  if (k.from == KeySource::query) k.param = L.word(param ? *param : m.required("param"));
  if (auto v = m.get("required")) k.required = L.boolean(*v);
  if (auto v = m.get("max_length")) k.max_length = static_cast<std::size_t>(L.integer(*v, 1, 1024));
  return header_line;
}

void parse_body_format(const Loader& L, const Map& m, FingerprintSettings& f) {
  if (auto v = m.get("format")) {
    f.format = L.choice<BodyFormat>(
        *v, {{"json", BodyFormat::json}, {"form", BodyFormat::form}, {"raw", BodyFormat::raw}});
  }
  // A setting of another format would read as a rule that is never applied.
  if (auto v = m.get("media_types")) {
    if (f.format != BodyFormat::raw) L.fail(*v, "fingerprint.media_types needs fingerprint.format: raw");
    for (const auto& e : L.list(*v)) {
      auto mt = idem::text::lowercase(L.text(e));
      const auto slash = mt.find('/');
      if (slash == std::string::npos || !detail::is_token(mt.substr(0, slash)) ||
          !detail::is_token(mt.substr(slash + 1))) {
        L.fail(e, "'" + mt + "' is not a media type type/subtype (write it without parameters, e.g. "
                  "application/x-protobuf)");
      }
      if (std::find(f.media_types.begin(), f.media_types.end(), mt) != f.media_types.end()) {
        L.fail(e, "'" + mt + "' is listed twice");
      }
      f.media_types.push_back(std::move(mt));
    }
  }
  if (auto v = m.get("repeated_names")) {
    if (f.format != BodyFormat::form) L.fail(*v, "fingerprint.repeated_names needs fingerprint.format: form");
    f.repeated_names = L.choice<RepeatedNames>(*v, {{"reject", RepeatedNames::reject}, {"list", RepeatedNames::list}});
  }
}

// Raw bytes have no members to select, ignore or default. (An empty ignore or defaults asks
// for nothing, and is accepted; `fields: []` would still mean "none of the body".)
void check_raw_members(const Loader& L, const Map& m, const FingerprintSettings& f) {
  if (f.format != BodyFormat::raw) return;
  for (const char* key : {"fields", "ignore", "defaults"}) {
    const auto v = m.get(key);
    const bool asked = std::string_view(key) == "fields" ? v.has_value()
                       : std::string_view(key) == "ignore" ? !f.ignore.empty()
                                                           : !f.defaults.empty();
    if (asked) {
      L.fail(*v, std::string("fingerprint.") + key + " selects members of a parsed body; "
                 "fingerprint.format: raw hashes the exact bytes");
    }
  }
}

void parse_fingerprint(const Loader& L, const Item& it, FingerprintSettings& f) {
  Map m(L, it, {"format", "media_types", "repeated_names", "version", "fields", "ignore",
                "defaults", "headers", "query"});
  parse_body_format(L, m, f);
  if (auto v = m.get("version")) f.version = L.word(*v);
  if (auto v = m.get("fields")) {
    f.fields.emplace();
    for (const auto& p : L.list(*v)) f.fields->push_back(L.pointer(p));
  }
  if (auto v = m.get("ignore")) {
    for (const auto& p : L.list(*v)) f.ignore.push_back(L.pointer(p));
  }
  if (auto v = m.get("defaults")) {
    if (!v->node.IsMap()) L.fail(*v, "expected a mapping of JSON Pointer to value, got " + describe(v->node));
    for (const auto& kv : v->node) {
      const int line = line_of(kv.first, v->line);
      if (!kv.first.IsScalar()) L.fail(line, v->path, "keys must be JSON Pointers");
      // Keys are names, not values: they are not ${VAR}-expanded, like every other key.
      const std::string ptr = kv.first.Scalar();
      const Item value{kv.second, child_path(v->path, ptr), line};
      if (!detail::is_json_pointer(ptr)) {
        L.fail(value, "'" + ptr + "' is not a JSON Pointer (RFC 6901): it must be \"\" or start "
                      "with '/', and '~' must be written ~0, '/' inside a name ~1");
      }
      if (!f.defaults.emplace(ptr, L.json_value(value)).second) L.fail(value, "duplicate key '" + ptr + "'");
    }
  }
  if (auto v = m.get("headers")) f.headers = L.header_list(*v);
  if (auto v = m.get("query")) f.query = L.boolean(*v);
  check_raw_members(L, m, f);
}

void parse_store(const Loader& L, const Item& it, StoreSettings& s) {
  Map m(L, it, {"statuses", "except"});
  if (auto v = m.get("statuses")) {
    s.statuses.clear();
    for (const auto& e : L.list(*v)) {
      const auto t = L.text(e);
      if (t.size() == 3 && t[0] >= '2' && t[0] <= '5' && (t[1] == 'x' || t[1] == 'X') &&
          (t[2] == 'x' || t[2] == 'X')) {
        const int base = (t[0] - '0') * 100;
        s.statuses.push_back({base, base + 99});
        continue;
      }
      const auto code = detail::parse_int(t);
      if (!code || *code < 100 || *code > 599) {
        L.fail(e, "expected a status class 2xx..5xx or a status code 100..599, got '" + t + "'");
      }
      s.statuses.push_back({static_cast<int>(*code), static_cast<int>(*code)});
    }
  }
  if (auto v = m.get("except")) {
    s.except.clear();
    for (const auto& e : L.list(*v)) s.except.push_back(static_cast<int>(L.integer(e, 100, 599)));
  }
}

// Headers the proxy itself computes for every response it sends: replaying a stored copy
// would contradict the framing of the replay.
bool is_framing_header(std::string_view name) {
  static const std::set<std::string> kNames{
      "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
      "upgrade",    "content-length", "idempotent-replayed", "idempotent-replay-body",
      "x-idempotency-recorded", "x-idempotency-directive"};
  return kNames.count(idem::text::lowercase(name)) != 0;
}

bool is_route_name(std::string_view s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_' || c == '.';
  });
}

// A path template with exactly one {operation_id} segment (the status resource, the
// reconciliation lookup).
std::string operation_path(const Loader& L, const Item& it) {
  const auto path = L.text(it);
  L.with_syntax(it, [&] { detail::check_route_path(path); });
  if (path.find("{operation_id}") == std::string::npos ||
      path.find('{') != path.rfind('{')) {
    L.fail(it, "must contain the segment {operation_id} once, and no other parameter");
  }
  return path;
}

// async, replay, on_unknown_outcome and reconcile (docs/configuration.md, §4.8).
void parse_long_operations(const Loader& L, Map& m, RouteSettings& r) {
  if (auto v = m.get("async")) {
    Map a(L, *v, {"after", "status_path"});
    AsyncSettings async;
    async.after = L.duration(a.required("after"), Millis(1));
    async.status_path = operation_path(L, a.required("status_path"));
    r.async = std::move(async);
  }
  if (auto v = m.get("replay")) {
    Map p(L, *v, {"mode", "hosts"});
    if (auto mode = p.get("mode")) {
      r.replay_mode = L.choice<ReplayMode>(
          *mode, {{"stored", ReplayMode::stored}, {"refetch", ReplayMode::refetch}});
    }
    if (auto hosts = p.get("hosts")) {
      // Hosts to follow mean nothing to stored replays: a list there would read as a
      // re-fetch that never happens.
      if (r.replay_mode != ReplayMode::refetch) L.fail(*hosts, "replay.hosts needs replay.mode: refetch");
      for (const auto& h : L.list(*hosts)) {
        auto authority = L.with_syntax(h, [&] { return detail::parse_authority(L.text(h)); });
        if (std::find(r.refetch_hosts.begin(), r.refetch_hosts.end(), authority) != r.refetch_hosts.end()) {
          L.fail(h, "'" + authority + "' is listed twice");
        }
        r.refetch_hosts.push_back(std::move(authority));
      }
    }
  }
  if (auto v = m.get("on_unknown_outcome")) {
    r.on_unknown_outcome = L.choice<UnknownOutcome>(
        *v, {{"retake", UnknownOutcome::retake}, {"reconcile", UnknownOutcome::reconcile}});
  }
  const auto reconcile = m.get("reconcile");
  if (reconcile) {
    Map c(L, *reconcile, {"method", "path"});
    if (auto method = c.get("method")) {
      r.reconcile.method = idem::text::uppercase(L.token(*method, "HTTP method"));
    }
    r.reconcile.path = operation_path(L, c.required("path"));
  }
  if (r.on_unknown_outcome == UnknownOutcome::reconcile && !reconcile) {
    L.fail(*m.get("on_unknown_outcome"),
           "on_unknown_outcome: reconcile needs reconcile: {method, path} on the route");
  }
  if (reconcile && r.on_unknown_outcome != UnknownOutcome::reconcile) {
    L.fail(*reconcile, "reconcile is only used with on_unknown_outcome: reconcile");
  }
}

struct RouteLines {
  int name = 0, method_path = 0, retention = 0, lease = 0, key_header = 0, async_after = 0,
      completion = 0;
};

void check_route(const Loader& L, const Item& it, const TenantSettings& tenant,
                 const RouteLines& lines, const RouteSettings& r);

RouteSettings parse_route(const Loader& L, const Item& it, const TenantSettings& tenant,
                          RouteLines& lines) {
  RouteSettings r;
  Map m(L, it, {"name", "method", "path", "scope", "key", "fingerprint", "retention", "lease",
                "wait", "retry_after", "mismatch_status", "store", "replay_headers",
                "max_stored_body", "completion", "async", "replay", "on_unknown_outcome",
                "reconcile", "same_payload_new_key"});
  const auto name = m.required("name");
  r.name = L.text(name);
  if (!is_route_name(r.name)) {
    L.fail(name, "route names are 1..64 letters, digits, '-', '_' or '.' (they become metric "
                 "labels), got '" + r.name + "'");
  }
  lines.name = name.line;
  const auto method = m.required("method");
  r.method = idem::text::uppercase(L.token(method, "HTTP method"));
  const auto path = m.required("path");
  r.path = L.text(path);
  L.with_syntax(path, [&] { detail::check_route_path(r.path); });
  lines.method_path = path.line;

  if (auto v = m.get("scope")) {
    r.scope = L.word(*v);
  } else {
    r.scope = r.method + " " + r.path;
  }
  if (auto v = m.get("key")) {
    lines.key_header = parse_key(L, *v, r.key);
  } else {
    lines.key_header = it.line;
  }
  r.source_line = it.line;
  if (auto v = m.get("fingerprint")) {
    // Some fingerprint rules are checked later, when the route is compiled; they point here.
    r.source_line = v->line;
    parse_fingerprint(L, *v, r.fingerprint);
  }
  lines.retention = lines.lease = it.line;
  if (auto v = m.get("retention")) {
    r.retention = L.duration(*v, kOneMs);
    lines.retention = v->line;
  }
  // Renewal runs every lease/3 against the database clock; below a second that is a
  // renewal storm and clock jitter decides ownership.
  if (auto v = m.get("lease")) {
    r.lease = L.duration(*v, Millis(1000));
    lines.lease = v->line;
  }
  if (auto v = m.get("wait")) r.wait = L.duration(*v, kOneMs);
  // Retry-After carries whole seconds.
  if (auto v = m.get("retry_after")) r.retry_after = L.duration(*v, Millis(1000));
  if (auto v = m.get("mismatch_status")) {
    const auto s = L.text(*v);
    if (s != "409" && s != "422") L.fail(*v, "must be 409 or 422, got '" + s + "'");
    r.mismatch_status = s == "409" ? 409 : 422;
  }
  if (auto v = m.get("store")) parse_store(L, *v, r.store);
  if (auto v = m.get("replay_headers")) {
    r.replay_headers = L.header_list(*v);
    for (const auto& h : L.list(*v)) {
      if (is_framing_header(h.node.Scalar())) {
        L.fail(h, "'" + h.node.Scalar() +
                      "' frames one response or is one of idemproxy's own fields; it cannot be "
                      "replayed");
      }
    }
  }
  // One record is one bytea read in one statement; PostgreSQL refuses values of 1GB.
  if (auto v = m.get("max_stored_body")) r.max_stored_body = L.size(*v, 0, 512 * MiB);
  if (auto v = m.get("completion")) {
    r.completion = L.choice<Completion>(
        *v, {{"sidecar", Completion::sidecar}, {"backend", Completion::backend}});
    lines.completion = v->line;
  }
  parse_long_operations(L, m, r);
  if (auto v = m.get("same_payload_new_key")) {
    Map p(L, *v, {"window", "action"});
    SamePayloadSettings sp;
    // Shorter than a second is no client's retry interval; longer than a day is a second
    // order of the same thing rather than a retry.
    if (auto w = p.get("window")) {
      sp.window = L.duration(*w, Millis(1000));
      if (sp.window > Millis(24LL * 3600 * 1000)) L.fail(*w, "must be at most 1d");
    }
    if (auto a = p.get("action")) {
      sp.action = L.choice<SamePayloadAction>(*a, {{"count", SamePayloadAction::count},
                                                   {"warn", SamePayloadAction::warn},
                                                   {"reject", SamePayloadAction::reject}});
    }
    r.same_payload_new_key = sp;
  }
  if (auto v = m.get("async")) lines.async_after = v->line;
  check_route(L, it, tenant, lines, r);
  return r;
}

// The rules that tie a route's keys to each other and to the tenant settings.
void check_route(const Loader& L, const Item& it, const TenantSettings& tenant,
                 const RouteLines& lines, const RouteSettings& r) {
  if (r.retention < r.lease) {
    L.fail(lines.retention, it.path + ".retention",
           "retention (" + detail::format_duration(r.retention) + ") must be at least the lease (" +
               detail::format_duration(r.lease) + "): a record must outlive its claim");
  }
  // The key's place must exist in the body's format: raw bytes have no members, and a JSON
  // body names them by JSON Pointer only ("meta[key]" is a form's way).
  if (r.key.from == KeySource::body && r.fingerprint.format == BodyFormat::raw) {
    L.fail(lines.key_header, it.path + ".key.from",
           "key.from: body needs a body with members; fingerprint.format: raw has none");
  }
  if (r.key.from == KeySource::body && r.fingerprint.format == BodyFormat::json &&
      r.key.pointer.front() != '/') {
    L.fail(lines.key_header, it.path + ".key.pointer",
           "'" + r.key.pointer + "' is a form field path; a JSON body names its key member by JSON "
           "Pointer, e.g. '/" + r.key.pointer + "'");
  }
  const auto key_header = idem::text::lowercase(r.key.header);
  if (key_header == idem::text::lowercase(tenant.header) ||
      (!tenant.principal_header.empty() && key_header == idem::text::lowercase(tenant.principal_header))) {
    L.fail(lines.key_header, it.path + ".key.header",
           "the idempotency key header '" + r.key.header + "' is also the tenant or principal header");
  }
}

// A backend that completes its own records (completion: backend) writes them with the SQL
// functions of migration 0004, in its own transaction and without idemproxy's keys: they
// are stored in clear whatever `encryption` says. A configuration that asks for encryption
// at rest must not get clear customer data silently, so the combination needs an explicit
// opt-in. (encryption is parsed before routes, so its settings are known here.)
void check_clear_backend_records(const Loader& L, const EncryptionSettings& e, const RouteLines& lines,
                                 const std::string& route_path, const RouteSettings& r) {
  if (e.keys.empty() || e.allow_clear_backend_records || r.completion != Completion::backend) return;
  L.fail(lines.completion, route_path + ".completion",
         "completion: backend stores this route's answers in clear, although encryption is "
         "configured: the backend writes the record in its own transaction without "
         "idemproxy's keys. Use completion: sidecar, or set "
         "encryption.allow_clear_backend_records: true to accept clear records for this route");
}

Settings parse_root(const Loader& L, const Item& root) {
  Settings s;
  Map m(L, root, {"listen", "tls", "workers", "upstream", "database", "tenant", "limits", "admin",
                  "log", "cleanup", "replay_cache", "tracing", "encryption", "unmatched",
                  "policy_path", "routes"});
  if (auto v = m.get("listen")) s.listen = L.with_syntax(*v, [&] { return detail::parse_endpoint(L.text(*v)); });
  if (auto v = m.get("tls")) s.tls = parse_listener_tls(L, *v);
  if (auto v = m.get("workers")) s.workers = static_cast<int>(L.integer(*v, 0, 1024));
  parse_upstream(L, m.required("upstream"), s.upstream);
  // Present either way (the file is a whole configuration); read only by commands that
  // connect, so that a ${DATABASE_URL} it names need not be set for one that does not.
  const auto database = m.required("database");
  if (L.options().database) parse_database(L, database, s.database);
  // Tenant first: routes check their key header against it.
  if (auto v = m.get("tenant")) {
    parse_tenant(L, *v, s.tenant);
    // The certificate is the identity: without client certificates there is none.
    if (s.tenant.from == TenantSource::mtls && (!s.tls || s.tls->client_ca_file.empty())) {
      L.fail(*v, "tenant.from: mtls needs tls.client_ca_file (client certificates)");
    }
  }
  if (auto v = m.get("limits")) parse_limits(L, *v, s.limits);
  if (auto v = m.get("admin")) parse_admin(L, *v, s.admin);
  if (auto v = m.get("log")) parse_log(L, *v, s.log);
  if (auto v = m.get("cleanup")) parse_cleanup(L, *v, s.cleanup);
  if (auto v = m.get("replay_cache")) parse_replay_cache(L, *v, s.replay_cache);
  if (auto v = m.get("tracing")) parse_tracing(L, *v, s.tracing);
  if (auto v = m.get("encryption")) parse_encryption(L, *v, s.encryption);
  if (auto v = m.get("unmatched")) {
    s.unmatched = L.choice<Unmatched>(*v, {{"pass", Unmatched::pass}, {"reject", Unmatched::reject}});
  }
  if (auto v = m.get("policy_path")) {
    s.policy_path = L.text(*v);
    if (!s.policy_path.empty()) {
      L.with_syntax(*v, [&] { detail::check_route_path(s.policy_path); });
      if (s.policy_path.find('{') != std::string::npos) L.fail(*v, "cannot be a template");
    }
  }
  if (auto v = m.get("routes")) {
    std::map<std::string, std::string> names;   // name -> path of first use
    std::map<std::string, std::string> shapes;  // "METHOD shape" -> path of first use
    for (const auto& item : L.list(*v)) {
      RouteLines lines;
      auto r = parse_route(L, item, s.tenant, lines);
      if (auto [at, fresh] = names.emplace(r.name, item.path); !fresh) {
        L.fail(lines.name, item.path + ".name", "duplicate route name '" + r.name + "' (also " + at->second + ")");
      }
      const auto shape = r.method + " " + detail::route_shape(r.path);
      if (auto [at, fresh] = shapes.emplace(shape, item.path); !fresh) {
        L.fail(lines.method_path, item.path + ".path",
               r.method + " " + r.path + " matches the same requests as " + at->second);
      }
      // The exchange behind a 202 is still bounded by the upstream's timeout: an `after`
      // that never comes first would promise a status resource that is never used.
      if (r.async && r.async->after >= s.upstream.response_timeout) {
        L.fail(lines.async_after, item.path + ".async.after",
               "async.after (" + detail::format_duration(r.async->after) +
                   ") must be shorter than upstream.response_timeout (" +
                   detail::format_duration(s.upstream.response_timeout) + ")");
      }
      check_clear_backend_records(L, s.encryption, lines, item.path, r);
      s.routes.push_back(std::move(r));
    }
  }
  return s;
}

// yaml-cpp resolves an alias to the anchored node itself, so a document is a graph, not a
// tree: an alias inside its own anchor (`&a [1, *a]`) is a cycle that every walk below
// would follow until the stack overflows, and aliases of aliases expand exponentially
// ("billion laughs": a few hundred bytes that render to gigabytes of fingerprint defaults).
// Either would crash a running proxy on reload instead of refusing the file. Both are
// refused by bounding the nodes a walk of the expanded document visits; the walk itself
// keeps its own stack, so it is safe on the documents it refuses. Found by fuzz/config.
constexpr std::size_t kMaxExpandedNodes = 100'000;

void check_expansion(const YAML::Node& root, const std::string& file) {
  std::vector<YAML::Node> pending{root};  // copies share the node (never assign: it writes)
  std::size_t visited = 0;
  while (!pending.empty()) {
    const YAML::Node n = pending.back();
    pending.pop_back();
    if (++visited > kMaxExpandedNodes) {
      throw ConfigError(file, line_of(n, 0), "",
                        "the document expands to more than " + std::to_string(kMaxExpandedNodes) +
                            " YAML nodes (counting an alias each time it is used): an alias "
                            "inside its own anchor, or aliases of aliases nested too deeply");
    }
    if (n.IsSequence()) {
      for (const auto& child : n) pending.push_back(child);
    } else if (n.IsMap()) {
      for (const auto& kv : n) {
        pending.push_back(kv.first);
        pending.push_back(kv.second);
      }
    }
  }
}

// Watches the parser's events for the first two documents without building them: how many
// there are, where each starts (a second document that starts where the first did means the
// parser made no progress), and the line of the second one's first node (for the error).
// For the first document it also counts the nodes it expands to (an alias counts as the
// nodes of its anchor, each time it is used) and sees an alias used inside its own
// anchor, from the events alone: a cycle or a "billion laughs" is refused at once, where
// walking the built document to find out cost a second of CPU per such file.
class DocumentProbe : public YAML::EventHandler {
 public:
  int documents() const noexcept { return documents_; }
  bool progressed() const noexcept { return documents_ < 2 || starts_[1] != starts_[0]; }
  int second_line() const noexcept { return second_line_; }
  // The first document's expanded size, capped just above kMaxExpandedNodes.
  std::size_t expanded_nodes() const noexcept { return total_; }
  // Whether an alias is used inside its own anchor, and the line of the first such use.
  bool cycle() const noexcept { return cycle_; }
  int cycle_line() const noexcept { return cycle_line_; }

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (documents_ < 2) starts_[documents_] = mark.pos;
    ++documents_;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { leaf(mark, anchor); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                const std::string&) override {
    leaf(mark, anchor);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    node(mark);
    if (documents_ != 1) return;
    if (!cycle_ && open_anchors_.count(anchor) != 0) {
      cycle_ = true;
      cycle_line_ = mark.is_null() ? 0 : mark.line + 1;
    }
    const auto it = sizes_.find(anchor);
    add(it == sizes_.end() ? 1 : it->second);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    YAML::anchor_t anchor;
    std::size_t nodes;  // the collection itself and everything in it, expanded
  };

  void node(const YAML::Mark& mark) {
    if (documents_ == 2 && second_line_ == 0) second_line_ = mark.is_null() ? 0 : mark.line + 1;
  }
  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor) {
    node(mark);
    if (documents_ != 1) return;
    if (anchor != YAML::NullAnchor) sizes_[anchor] = 1;
    add(1);
  }
  void open(const YAML::Mark& mark, YAML::anchor_t anchor) {
    node(mark);
    if (documents_ != 1) return;
    open_.push_back({anchor, 1});
    if (anchor != YAML::NullAnchor) open_anchors_.insert(anchor);
  }
  void close() {
    if (documents_ != 1 || open_.empty()) return;
    const Frame f = open_.back();
    open_.pop_back();
    if (f.anchor != YAML::NullAnchor) {
      sizes_[f.anchor] = f.nodes;
      open_anchors_.erase(f.anchor);
    }
    add(f.nodes);
  }
  // Adds n expanded nodes to the innermost open collection, or to the document. Counts
  // saturate just above the bound: an exponential expansion never overflows.
  void add(std::size_t n) {
    auto sat = [](std::size_t a, std::size_t b) { return std::min(a + b, kMaxExpandedNodes + 1); };
    if (open_.empty()) {
      total_ = sat(total_, n);
    } else {
      open_.back().nodes = sat(open_.back().nodes, n);
    }
  }

  int documents_ = 0;
  int starts_[2] = {0, 0};
  int second_line_ = 0;
  std::vector<Frame> open_;
  std::unordered_map<YAML::anchor_t, std::size_t> sizes_;  // closed anchors, expanded
  std::unordered_set<YAML::anchor_t> open_anchors_;
  std::size_t total_ = 0;
  bool cycle_ = false;
  int cycle_line_ = 0;
};

}  // namespace

namespace detail {

std::shared_ptr<const Settings> load_text(const std::string& yaml, const std::string& name,
                                          const EnvLookup& env, LoadOptions options) {
  YAML::Node root;
  DocumentProbe probe;
  try {
    // Never YAML::LoadAll: it loops until the parser reports the end of the stream, and
    // on a stream that starts with ',' yaml-cpp 0.7 yields empty documents forever without
    // consuming anything, so a one-character typo made the process allocate until it died
    // (found by fuzz/config). Two documents are all we need to see.
    std::istringstream in(yaml);
    YAML::Parser parser(in);
    while (probe.documents() < 2 && parser.HandleNextDocument(probe)) {
    }
    if (probe.documents() > 0) root = YAML::Load(yaml);  // the first document only
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 0 : e.mark.line + 1;
    throw ConfigError(name, line, "", "YAML syntax error: " + e.msg);
  }
  if (probe.documents() > 1) {
    if (!probe.progressed()) {
      throw ConfigError(name, probe.second_line(), "",
                        "YAML syntax error: unexpected character (the parser cannot go on from here)");
    }
    throw ConfigError(name, probe.second_line(), "", "expected one YAML document, found several");
  }
  if (probe.cycle()) {
    throw ConfigError(name, probe.cycle_line(), "",
                      "an alias is used inside its own anchor (like `&a [1, *a]`): the document "
                      "would expand without end");
  }
  if (probe.expanded_nodes() > kMaxExpandedNodes) {
    throw ConfigError(name, 0, "",
                      "the document expands to more than " + std::to_string(kMaxExpandedNodes) +
                          " YAML nodes (counting an alias each time it is used): aliases of "
                          "aliases nested too deeply");
  }
  const Loader loader(name, env, options);
  // The probe's count bounds every walk below; this walk of the built document checks
  // the same bound again, so that no walk depends on the two readings agreeing.
  check_expansion(root, name);
  auto s = std::make_shared<Settings>(parse_root(loader, Item{root, "", line_of(root, 0)}));
  s->source_file = name;
  return s;
}

}  // namespace detail

std::shared_ptr<const Settings> load_text(const std::string& yaml, const std::string& name,
                                          LoadOptions options) {
  return detail::load_text(
      yaml, name, [](const std::string& var) { return std::getenv(var.c_str()); }, options);
}

std::shared_ptr<const Settings> load_file(const std::string& path, LoadOptions options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path, 0, "", std::string("cannot read the file: ") + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError(path, 0, "", "cannot read the file");
  return load_text(text.str(), path, options);
}

}  // namespace idem::settings
