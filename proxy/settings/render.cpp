// The effective configuration as YAML (check-config). Written by hand rather than through
// YAML::Emitter so the layout mirrors the documented example key for key, and so two
// properties are under our control: the text loads back to the same Settings, and no secret
// survives masking.
#include <algorithm>
#include <array>
#include <charconv>
#include <string>
#include <vector>

#include "common/text.hpp"
#include "settings/detail.hpp"
#include "settings/settings.hpp"

namespace idem::settings {

namespace {

constexpr std::string_view kMask = "****";

// YAML double-quoted scalar. `expandable` doubles '$' because the loader expands ${VAR} in
// every value (but never in keys): without it a literal "$HOME"-like text would not survive
// a round trip.
std::string yaml_quote(std::string_view s, bool expandable = true) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '$' && expandable) {
      out += "$$";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      text::append_hex_digits(out, u, 2);
    } else if (u == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) {
      // NEL, LS and PS are line breaks to a YAML reader: a raw one would be folded away.
      out += "\\N";
      ++i;
    } else if (u == 0xe2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[i + 2]) == 0xa8 ||
                static_cast<unsigned char>(s[i + 2]) == 0xa9)) {
      out += static_cast<unsigned char>(s[i + 2]) == 0xa8 ? "\\L" : "\\P";
      i += 2;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// YAML allows an implicit key ("key": value) of at most 1024 characters (YAML 1.2 §7.4.2;
// yaml-cpp refuses a longer one, counting the quotes). A longer key is written as an
// explicit one (? "key" : value), which any length may use (finding 14 of the config
// fuzzer: a rendered default with a 1288-byte member name did not load). 1000 bytes keeps
// a margin, and bytes are never fewer than characters.
constexpr std::size_t kImplicitKeyMax = 1000;

// A fingerprint default is stored as compact JSON; JSON is YAML flow syntax once a space
// follows ':' and ','. String escapes of JSON are all valid YAML double-quoted escapes.
std::string json_to_yaml_flow(std::string_view json) {
  std::string out;
  std::vector<char> stack;  // '{' or '['
  bool expect_key = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '"') {
      const bool is_key = !stack.empty() && stack.back() == '{' && expect_key;
      std::string quoted(1, c);
      for (++i; i < json.size(); ++i) {
        const char d = json[i];
        if (d == '\\' && i + 1 < json.size()) {
          quoted += d;
          quoted += json[++i];
        } else if (d == '"') {
          quoted += d;
          break;
        } else if (d == '$' && !is_key) {
          quoted += "$$";
        } else {
          quoted += d;
        }
      }
      if (is_key && quoted.size() > kImplicitKeyMax) out += "? ";
      out += quoted;
      continue;
    }
    out += c;
    switch (c) {
      case '{': stack.push_back('{'); expect_key = true; break;
      case '[': stack.push_back('['); break;
      case '}': case ']':
        if (!stack.empty()) stack.pop_back();
        break;
      case ':': out += ' '; expect_key = false; break;
      case ',':
        out += ' ';
        expect_key = !stack.empty() && stack.back() == '{';
        break;
      default: break;
    }
  }
  return out;
}

std::string flow_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + yaml_quote(items[i]);
  return out + "]";
}

std::string status_list(const std::vector<StatusPattern>& patterns) {
  std::vector<std::string> parts;
  for (const auto& p : patterns) {
    if (p.low == p.high) {
      parts.push_back(std::to_string(p.low));
    } else if (p.low % 100 == 0 && p.high == p.low + 99) {
      // Appended piece by piece: `"\"" + std::string&&` trips GCC 12's -Wrestrict at -O2
      // (a false positive in its inlined string insert).
      std::string range = "\"";
      range += std::to_string(p.low / 100);
      range += "xx\"";
      parts.push_back(std::move(range));
    } else {
      // Not produced by the loader, but the struct allows it: spell the range out so it
      // still loads back as the same set of codes.
      for (int code = p.low; code <= p.high; ++code) parts.push_back(std::to_string(code));
    }
  }
  std::string out = "[";
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out + "]";
}

const char* name(MigrateMode m) {
  switch (m) {
    case MigrateMode::check: return "check";
    case MigrateMode::automatic: return "auto";
    case MigrateMode::off: return "off";
  }
  return "check";
}

const char* name(LogLevel l) {
  switch (l) {
    case LogLevel::trace: return "trace";
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warn";
    case LogLevel::error: return "error";
  }
  return "info";
}

const char* name(TenantSource t) {
  switch (t) {
    case TenantSource::header: return "header";
    case TenantSource::jwt: return "jwt";
    case TenantSource::mtls: return "mtls";
  }
  return "header";
}

const char* name(LogFormat f) { return f == LogFormat::text ? "text" : "json"; }
const char* name(Unmatched u) { return u == Unmatched::reject ? "reject" : "pass"; }
const char* yes_no(bool b) { return b ? "true" : "false"; }

// libpq conninfo: key = value pairs, values bare or single-quoted with backslash escapes.
// A conninfo value may itself hold a connection URI (libpq reads a `dbname` that looks
// like one as a whole connection string), so any `scheme://user:password@` inside a value
// has its password masked. Found by fuzz/config (a URI with a password, from
// ${DATABASE_URL}, written into a conninfo `user` value, showed in check-config).
std::string mask_embedded_userinfo(std::string_view v) {
  std::string out(v);
  for (std::size_t from = 0; (from = out.find("://", from)) != std::string::npos;) {
    const std::size_t authority = from + 3;
    const std::size_t end = std::min(out.find_first_of("/?#", authority), out.size());
    const std::size_t at = out.rfind('@', end == 0 ? 0 : end - 1);
    if (at != std::string::npos && at >= authority) {
      const std::size_t colon = out.find(':', authority);
      if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, kMask);
    }
    from = authority;
  }
  return out;
}

std::string mask_conninfo(std::string_view s) {
  std::string out;
  std::size_t i = 0;
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (i < s.size()) {
    while (i < s.size() && space(s[i])) out += s[i++];
    if (i >= s.size()) break;
    const auto key_start = i;
    while (i < s.size() && s[i] != '=' && !space(s[i])) ++i;
    const auto key = s.substr(key_start, i - key_start);
    out += key;
    while (i < s.size() && space(s[i])) out += s[i++];
    if (i >= s.size() || s[i] != '=') {
      // Not conninfo as libpq reads it; whatever follows might be a secret, so it goes.
      if (i < s.size()) out += kMask;
      break;
    }
    out += s[i++];
    while (i < s.size() && space(s[i])) out += s[i++];
    const auto value_start = i;
    if (i < s.size() && s[i] == '\'') {
      for (++i; i < s.size() && s[i] != '\''; ++i) {
        if (s[i] == '\\') ++i;
      }
      if (i < s.size()) ++i;  // closing quote
    } else {
      for (; i < s.size() && !space(s[i]); ++i) {
        if (s[i] == '\\') ++i;
      }
    }
    i = std::min(i, s.size());
    if (key == "password" || key == "sslpassword") {
      out += kMask;
    } else {
      out += mask_embedded_userinfo(s.substr(value_start, i - value_start));
    }
    if (i < s.size() && !space(s[i])) {
      // Text glued to a closing quote: libpq refuses it, and it may be the rest of a
      // password whose quoting went wrong.
      out += kMask;
      break;
    }
  }
  return out;
}

std::string mask_uri(std::string_view s) {
  const auto scheme_end = s.find("://");
  const std::size_t start = scheme_end + 3;
  std::string out(s.substr(0, start));
  // libpq ends the credentials at the first '@' before any '/': mirror it, so what is
  // masked is exactly what libpq would send as the password.
  std::size_t at = start;
  while (at < s.size() && s[at] != '@' && s[at] != '/') ++at;
  std::size_t rest = start;
  if (at < s.size() && s[at] == '@') {
    const auto creds = s.substr(start, at - start);
    const auto colon = creds.find(':');
    if (colon == std::string_view::npos) {
      out += creds;
    } else {
      out += creds.substr(0, colon + 1);
      out += kMask;
    }
    out += '@';
    rest = at + 1;
  }
  const auto query = s.find('?', rest);
  out += s.substr(rest, query == std::string_view::npos ? s.npos : query - rest);
  if (query == std::string_view::npos) return out;
  out += '?';
  std::size_t i = query + 1;
  while (true) {
    const auto amp = s.find('&', i);
    const auto param = s.substr(i, amp == std::string_view::npos ? s.npos : amp - i);
    const auto eq = param.find('=');
    const auto key = param.substr(0, eq);
    if (eq != std::string_view::npos && (key == "password" || key == "sslpassword")) {
      out += key;
      out += '=';
      out += kMask;
    } else {
      out += param;
    }
    if (amp == std::string_view::npos) break;
    out += '&';
    i = amp + 1;
  }
  return out;
}

}  // namespace

std::string mask_database_url(std::string_view url) {
  // A second URI after the first (libpq refuses such a string, but check-config prints it
  // before anything connects) has its password masked too.
  if (url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0) {
    return mask_embedded_userinfo(mask_uri(url));
  }
  return mask_conninfo(url);
}

namespace {

// The effective configuration as block YAML, one key a line.
struct YamlOut {
  std::string text;

  void line(int indent, std::string_view key, const std::string& value) {
    text.append(static_cast<std::size_t>(indent), ' ');
    if (key.size() > kImplicitKeyMax) {
      // An explicit block key: "? key", then ": value" on the next line at the same indent.
      text += "? ";
      text += key;
      text += '\n';
      text.append(static_cast<std::size_t>(indent), ' ');
    } else {
      text += key;
    }
    text += ": ";
    text += value;
    text += '\n';
  }
  void section(int indent, std::string_view key) {
    text.append(static_cast<std::size_t>(indent), ' ');
    text += key;
    text += ":\n";
  }
};

using detail::format_duration;
using detail::format_size;

// The sections beyond the contract's: trace export and encryption at rest.
void render_extensions(YamlOut& y, const Settings& s) {
  y.section(0, "tracing");
  y.line(2, "otlp_endpoint", yaml_quote(s.tracing.otlp_endpoint));
  {
    std::array<char, 32> buf{};
    const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), s.tracing.sample);
    y.line(2, "sample", std::string(buf.data(), ec == std::errc{} ? end : buf.data()));
  }

  if (!s.encryption.keys.empty()) {
    // Key files by path only: their contents are never printed.
    std::string keys = "[";
    for (const auto& k : s.encryption.keys) {
      if (keys.size() > 1) keys += ", ";
      keys += "{id: " + yaml_quote(k.id) + ", file: " + yaml_quote(k.file) + "}";
    }
    y.section(0, "encryption");
    y.line(2, "keys", keys + "]");
    y.line(2, "active", yaml_quote(s.encryption.active));
    y.line(2, "allow_clear_backend_records", s.encryption.allow_clear_backend_records ? "true" : "false");
  }
}

// Every key above `routes`, in the order the documentation lists them. Why one function
// of ~85 lines: it is a flat list, one line per key, and reading it top to bottom against
// the documentation is the review; split, the order would be spread over several places.
void render_globals(YamlOut& y, const Settings& s) {
  y.line(0, "listen", yaml_quote(detail::format_endpoint(s.listen)));
  // Paths only: a key file's contents never pass through here.
  if (s.tls) {
    y.section(0, "tls");
    y.line(2, "cert_file", yaml_quote(s.tls->cert_file));
    y.line(2, "key_file", yaml_quote(s.tls->key_file));
    y.line(2, "client_ca_file", yaml_quote(s.tls->client_ca_file));
  } else {
    y.text += "# tls: not set, the listener speaks plain HTTP\n";
  }
  y.line(0, "workers", std::to_string(s.workers) + (s.workers == 0 ? "  # one per CPU" : ""));

  y.section(0, "upstream");
  y.line(2, "url", yaml_quote(s.upstream.url));
  y.line(2, "connect_timeout", format_duration(s.upstream.connect_timeout));
  y.line(2, "response_timeout", format_duration(s.upstream.response_timeout));
  y.line(2, "max_response_body", format_size(s.upstream.max_response_body));
  if (s.upstream.https) {
    y.section(2, "tls");
    y.line(4, "ca_file", yaml_quote(s.upstream.tls.ca_file));
    y.line(4, "server_name", yaml_quote(s.upstream.tls.server_name));
    y.line(4, "verify", yes_no(s.upstream.tls.verify));
  }

  y.section(0, "database");
  y.line(2, "url", yaml_quote(mask_database_url(s.database.url)));
  y.line(2, "pool_size", std::to_string(s.database.pool_size));
  y.line(2, "connect_timeout", format_duration(s.database.connect_timeout));
  y.line(2, "statement_timeout", format_duration(s.database.statement_timeout));
  y.line(2, "migrate", name(s.database.migrate));
  y.line(2, "start_wait", format_duration(s.database.start_wait));
  y.line(2, "batching", yes_no(s.database.batching));
  y.line(2, "batch_max", std::to_string(s.database.batch_max));

  y.section(0, "tenant");
  y.line(2, "header", yaml_quote(s.tenant.header));
  y.line(2, "principal_header", yaml_quote(s.tenant.principal_header));
  y.line(2, "from", name(s.tenant.from));
  if (s.tenant.from == TenantSource::jwt) {
    const auto& j = s.tenant.jwt;
    y.section(2, "jwt");
    y.line(4, "jwks_file", yaml_quote(j.jwks_file));
    y.line(4, "issuers", flow_list(j.issuers));
    y.line(4, "audiences", flow_list(j.audiences));
    y.line(4, "tenant_claim", yaml_quote(j.tenant_claim));
    // Written only where the loader accepts it (it needs a principal header).
    if (!s.tenant.principal_header.empty()) y.line(4, "principal_claim", yaml_quote(j.principal_claim));
    y.line(4, "leeway", format_duration(j.leeway));
  }
  if (s.tenant.from == TenantSource::mtls) {
    y.section(2, "mtls");
    y.line(4, "uri_prefix", yaml_quote(s.tenant.mtls.uri_prefix));
  }

  y.section(0, "limits");
  y.line(2, "max_header_bytes", format_size(s.limits.max_header_bytes));
  y.line(2, "max_request_body", format_size(s.limits.max_request_body));
  y.line(2, "header_timeout", format_duration(s.limits.header_timeout));
  y.line(2, "body_timeout", format_duration(s.limits.body_timeout));
  y.line(2, "idle_timeout", format_duration(s.limits.idle_timeout));
  y.line(2, "max_connections", std::to_string(s.limits.max_connections));
  y.line(2, "drain_timeout", format_duration(s.limits.drain_timeout));

  y.section(0, "admin");
  y.line(2, "listen", yaml_quote(s.admin.listen ? detail::format_endpoint(*s.admin.listen) : ""));
  y.line(2, "token", yaml_quote(s.admin.token.empty() ? "" : kMask));

  y.section(0, "log");
  y.line(2, "level", name(s.log.level));
  y.line(2, "format", name(s.log.format));

  y.section(0, "cleanup");
  y.line(2, "interval", format_duration(s.cleanup.interval));
  y.line(2, "batch", std::to_string(s.cleanup.batch));

  y.section(0, "replay_cache");
  y.line(2, "enabled", s.replay_cache.enabled ? "true" : "false");
  y.line(2, "max_bytes", format_size(s.replay_cache.max_bytes));
  y.line(2, "ttl", format_duration(s.replay_cache.ttl));

  render_extensions(y, s);

  y.line(0, "unmatched", name(s.unmatched));
  y.line(0, "policy_path", yaml_quote(s.policy_path));
}

void render_fingerprint(YamlOut& y, const FingerprintSettings& f) {
  y.section(4, "fingerprint");
  y.line(6, "format", f.format == BodyFormat::form  ? "form"
                      : f.format == BodyFormat::raw ? "raw"
                                                    : "json");
  // Each written only where the loader accepts it.
  if (f.format == BodyFormat::raw) y.line(6, "media_types", flow_list(f.media_types));
  if (f.format == BodyFormat::form) {
    y.line(6, "repeated_names", f.repeated_names == RepeatedNames::list ? "list" : "reject");
  }
  y.line(6, "version", yaml_quote(f.version));
  if (f.format == BodyFormat::raw) {
    y.text += "      # fields, ignore, defaults: a raw body is hashed as its exact bytes\n";
    y.line(6, "headers", flow_list(f.headers));
    y.line(6, "query", yes_no(f.query));
    return;
  }
  if (f.fields) {
    y.line(6, "fields", flow_list(*f.fields));
  } else {
    y.text += "      # fields: not set, the whole body minus `ignore` is fingerprinted\n";
  }
  y.line(6, "ignore", flow_list(f.ignore));
  if (f.defaults.empty()) {
    y.line(6, "defaults", "{}");
  } else {
    y.section(6, "defaults");
    for (const auto& [ptr, json] : f.defaults) y.line(8, yaml_quote(ptr, false), json_to_yaml_flow(json));
  }
  y.line(6, "headers", flow_list(f.headers));
  y.line(6, "query", yes_no(f.query));
}

void render_route(YamlOut& y, const RouteSettings& r) {
  y.line(2, "- name", yaml_quote(r.name));
  y.line(4, "method", yaml_quote(r.method));
  y.line(4, "path", yaml_quote(r.path));
  y.line(4, "scope", yaml_quote(r.scope));
  y.section(4, "key");
  y.line(6, "from", r.key.from == KeySource::body    ? "body"
                    : r.key.from == KeySource::query ? "query"
                                                     : "header");
  y.line(6, "header", yaml_quote(r.key.header));
  // Written only where the loader accepts them.
  if (r.key.from == KeySource::body) y.line(6, "pointer", yaml_quote(r.key.pointer));
  if (r.key.from == KeySource::query) y.line(6, "param", yaml_quote(r.key.param));
  y.line(6, "required", yes_no(r.key.required));
  y.line(6, "max_length", std::to_string(r.key.max_length));
  render_fingerprint(y, r.fingerprint);
  y.line(4, "retention", format_duration(r.retention));
  y.line(4, "lease", format_duration(r.lease));
  y.line(4, "wait", format_duration(r.wait));
  y.line(4, "retry_after", format_duration(r.retry_after));
  y.line(4, "mismatch_status", std::to_string(r.mismatch_status));
  y.section(4, "store");
  y.line(6, "statuses", status_list(r.store.statuses));
  std::vector<StatusPattern> except;
  for (int code : r.store.except) except.push_back({code, code});
  y.line(6, "except", status_list(except));
  y.line(4, "replay_headers", flow_list(r.replay_headers));
  y.line(4, "max_stored_body", format_size(r.max_stored_body));
  y.line(4, "completion", r.completion == Completion::backend ? "backend" : "sidecar");
  if (r.async) {
    y.section(4, "async");
    y.line(6, "after", format_duration(r.async->after));
    y.line(6, "status_path", yaml_quote(r.async->status_path));
  } else {
    y.text += "    # async: not set, answers wait for the upstream\n";
  }
  y.section(4, "replay");
  y.line(6, "mode", r.replay_mode == ReplayMode::refetch ? "refetch" : "stored");
  // Written only where the loader accepts it (refetch).
  if (r.replay_mode == ReplayMode::refetch) y.line(6, "hosts", flow_list(r.refetch_hosts));
  y.line(4, "on_unknown_outcome",
         r.on_unknown_outcome == UnknownOutcome::reconcile ? "reconcile" : "retake");
  if (r.on_unknown_outcome == UnknownOutcome::reconcile) {
    y.section(4, "reconcile");
    y.line(6, "method", r.reconcile.method);
    y.line(6, "path", yaml_quote(r.reconcile.path));
  }
  if (r.same_payload_new_key) {
    const auto& sp = *r.same_payload_new_key;
    y.section(4, "same_payload_new_key");
    y.line(6, "window", format_duration(sp.window));
    y.line(6, "action", sp.action == SamePayloadAction::reject ? "reject"
                        : sp.action == SamePayloadAction::warn ? "warn"
                                                               : "count");
  } else {
    y.text += "    # same_payload_new_key: not set, a new key for a recent payload is not looked for\n";
  }
}

}  // namespace

std::string render_effective(const Settings& s) {
  YamlOut y;
  y.text += "# idemproxy effective configuration: every key, defaults filled in, secrets shown as ****.\n";
  render_globals(y, s);
  if (s.routes.empty()) {
    y.line(0, "routes", "[]");
    return y.text;
  }
  y.section(0, "routes");
  for (const auto& r : s.routes) render_route(y, r);
  return y.text;
}

}  // namespace idem::settings
