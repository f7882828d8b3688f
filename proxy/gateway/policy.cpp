#include "gateway/policy.hpp"

#include "common/json_text.hpp"
#include "gateway/headers.hpp"

namespace idem::gateway {
namespace {

void member(std::string& out, std::string_view name, bool first = false) {
  if (!first) out += ',';
  text::append_json_string(out, name);
  out += ':';
}

void string_member(std::string& out, std::string_view name, std::string_view value,
                   bool first = false) {
  member(out, name, first);
  text::append_json_string(out, value);
}

// Durations in whole seconds, as Retry-After and the IETF draft's discussion speak of them.
std::string seconds(Millis d) { return std::to_string(d.count() / 1000); }

void route_policy(std::string& out, const settings::RouteSettings& r) {
  out += '{';
  string_member(out, "name", r.name, true);
  string_member(out, "method", r.method);
  string_member(out, "path", r.path);
  member(out, "key");
  out += '{';
  // Where a client puts the key: the header, or a body member or query parameter (the
  // header then being where it must not also be).
  string_member(out, "from",
                r.key.from == settings::KeySource::body    ? "body"
                : r.key.from == settings::KeySource::query ? "query"
                                                           : "header",
                true);
  string_member(out, "header", r.key.header);
  if (r.key.from == settings::KeySource::body) string_member(out, "pointer", r.key.pointer);
  if (r.key.from == settings::KeySource::query) string_member(out, "param", r.key.param);
  member(out, "required");
  out += r.key.required ? "true" : "false";
  member(out, "max_length");
  out += std::to_string(r.key.max_length);
  out += '}';
  member(out, "retention_seconds");
  out += seconds(r.retention);
  member(out, "mismatch_status");
  out += std::to_string(r.mismatch_status);
  string_member(out, "expiry_header", kKeyExpiresHeader);
  string_member(out, "replay", r.replay_mode == settings::ReplayMode::refetch ? "refetch" : "stored");
  if (r.async) {
    member(out, "async");
    out += '{';
    member(out, "after_ms", true);
    out += std::to_string(r.async->after.count());
    string_member(out, "status_path", r.async->status_path);
    out += '}';
  }
  out += '}';
}

}  // namespace

std::string policy_document(const settings::Settings& s) {
  std::string out = "{";
  string_member(out, "version", "1", true);
  member(out, "routes");
  out += '[';
  bool first = true;
  for (const auto& r : s.routes) {
    if (!first) out += ',';
    first = false;
    route_policy(out, r);
  }
  out += "]}\n";
  return out;
}

}  // namespace idem::gateway
