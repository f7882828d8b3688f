#include "gateway/headers.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "common/time_text.hpp"

namespace idem::gateway {
namespace {

char cgi_fold(char c) noexcept { return c == '_' ? '-' : text::ascii_lower(c); }

}  // namespace

bool same_name_for_cgi(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (cgi_fold(a[i]) != cgi_fold(b[i])) return false;
  }
  return true;
}

std::vector<std::string_view> field_values(const boost::beast::http::fields& fields,
                                           std::string_view name) {
  std::vector<std::string_view> out;
  for (const auto& f : fields) {
    if (iequals(f.name_string(), name)) out.emplace_back(f.value());
  }
  return out;
}

namespace {

// The members of one comma-separated list value, trimmed, empty members skipped.
template <class Out>
void list_members(std::string_view value, Out&& out) {
  std::size_t pos = 0;
  while (pos <= value.size()) {
    const auto comma = value.find(',', pos);
    auto token = value.substr(pos, comma == std::string_view::npos ? std::string_view::npos
                                                                   : comma - pos);
    token = text::trim_ows(token);
    if (!token.empty()) out(token);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
}

// The fixed hop-by-hop fields, by the code Beast gives every known field name when it is
// parsed or inserted: a comparison per field instead of a search per name. Expect is
// answered here (the session sends 100 Continue itself); passing it on would make the
// backend send an interim response the client already had.
bool fixed_hop_by_hop(boost::beast::http::field f) noexcept {
  using boost::beast::http::field;
  switch (f) {
    case field::connection:
    case field::keep_alive:
    case field::proxy_connection:
    case field::te:
    case field::trailer:
    case field::transfer_encoding:
    case field::upgrade:
    case field::proxy_authenticate:
    case field::proxy_authorization:
    case field::expect:
      return true;
    default:
      return false;
  }
}

std::string_view name_of(const boost::beast::http::fields::value_type& f) noexcept {
  const auto n = f.name_string();
  return {n.data(), n.size()};
}

}  // namespace

std::vector<std::string_view> connection_tokens(const boost::beast::http::fields& fields) {
  std::vector<std::string_view> out;
  for (auto value : field_values(fields, "Connection")) {
    list_members(value, [&](std::string_view token) { out.push_back(token); });
  }
  return out;
}

// One walk over the list, erasing by position: erasing by name searched the fields' index
// for each of the ten names, on every message, for fields that are nearly never there.
void strip_hop_by_hop(boost::beast::http::fields& fields) {
  // Tokens listed in Connection name further per-hop fields (RFC 9110 §7.6.1). Copied: the
  // views point into the fields that are about to be erased.
  std::vector<std::string> named;
  for (const auto& f : fields) {
    if (f.name() == boost::beast::http::field::connection) {
      list_members(f.value(), [&](std::string_view token) { named.emplace_back(token); });
    }
  }
  for (auto it = fields.begin(); it != fields.end();) {
    const bool hop = fixed_hop_by_hop(it->name()) ||
                     std::any_of(named.begin(), named.end(), [&](const std::string& n) {
                       return iequals(name_of(*it), n);
                     });
    it = hop ? fields.erase(it) : std::next(it);
  }
}

void set_owner_headers(boost::beast::http::fields& fields, std::string_view operation_id,
                       const store::Ownership& owner, const std::string& record_reference) {
  const auto set = [&](std::string_view name, std::string_view value) {
    fields.set(boost::beast::string_view(name.data(), name.size()),
               boost::beast::string_view(value.data(), value.size()));
  };
  set(kOperationIdHeader, operation_id);
  set(kAttemptHeader, std::to_string(owner.attempt));
  set(kFencingTokenHeader, std::to_string(owner.fence));
  set(kRecordCreatedHeader, rfc3339_from_us(owner.created_at_us));
  set(kRecordExpiresHeader, rfc3339_from_us(owner.expires_at_us));
  if (!record_reference.empty()) set(kRecordHeader, record_reference);
}

// One walk, as strip_hop_by_hop: seven searches by name a response cost more than
// comparing each field's name with the seven (a length check rules out nearly all).
void strip_replay_markers(boost::beast::http::fields& fields) {
  const auto listed = [](std::string_view name, const auto& names) {
    return std::any_of(names.begin(), names.end(), [&](std::string_view n) { return iequals(name, n); });
  };
  for (auto it = fields.begin(); it != fields.end();) {
    const auto name = name_of(*it);
    const bool marker = listed(name, kReplayMarkers) || listed(name, kBackendControls);
    it = marker ? fields.erase(it) : std::next(it);
  }
}

TargetParts split_target(std::string_view target) noexcept {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return {target, {}};
  return {target.substr(0, q), target.substr(q + 1)};
}

std::string resource_id_from_location(std::string_view location) {
  std::string out;
  out.reserve(location.size());
  for (const char ch : location) {
    const auto c = static_cast<unsigned char>(ch);
    if (c > 0x20 && c < 0x7f) {
      out.push_back(ch);
    } else {
      text::append_percent_encoded(out, c);
    }
  }
  return out;
}

namespace {

// An authority as a re-fetch compares it: the host in lower case (IPv6 in brackets), the
// port when one was written. nullopt when it is not host[:port] (user information, stray
// characters): such a Location is never followed.
struct Authority {
  std::string host;
  std::optional<unsigned> port;
};

std::optional<Authority> read_authority(std::string_view a) {
  Authority out;
  std::string_view host = a;
  std::string_view port;
  if (!a.empty() && a.front() == '[') {
    const auto close = a.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = a.substr(0, close + 1);
    const auto rest = a.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::nullopt;
      port = rest.substr(1);
    }
  } else if (const auto colon = a.rfind(':'); colon != std::string_view::npos) {
    host = a.substr(0, colon);
    port = a.substr(colon + 1);
  }
  if (host.empty()) return std::nullopt;
  for (const char c : host) {
    const auto u = static_cast<unsigned char>(c);
    // reg-name, IPv4 and IP-literal characters; '@' (user information), '%' (an encoded
    // host two readers may decode differently) and anything else make it unfollowable.
    const bool ok = (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') ||
                    c == '-' || c == '.' || c == '_' || c == '~' || c == '[' || c == ']' || c == ':';
    if (!ok) return std::nullopt;
  }
  out.host = text::lowercase(host);
  // RFC 3986 §3.2.3: an empty port is the scheme's default.
  if (!port.empty()) {
    unsigned n = 0;
    for (const char c : port) {
      if (c < '0' || c > '9' || n > 65535) return std::nullopt;
      n = n * 10 + static_cast<unsigned>(c - '0');
    }
    if (n == 0 || n > 65535) return std::nullopt;
    out.port = n;
  }
  return out;
}

// Whether `candidate` (a Host field, or an entry of replay.hosts) names the authority of
// `location`, whose scheme's default port is `default_port`. A candidate without a port
// stands for the default one, as a Host field without a port does for its scheme; ports
// are compared by number, so "shop:80" and "http://shop/" agree.
bool same_authority(const Authority& location, unsigned default_port, std::string_view candidate) {
  const auto c = read_authority(text::trim_ows(candidate));
  if (!c || c->host != location.host) return false;
  return c->port.value_or(default_port) == location.port.value_or(default_port);
}

}  // namespace

std::string refetch_target(std::string_view id, std::string_view request_host,
                           const std::vector<std::string>& hosts) {
  id = id.substr(0, id.find('#'));
  for (const auto& [scheme, default_port] : {std::pair<std::string_view, unsigned>{"http://", 80},
                                             std::pair<std::string_view, unsigned>{"https://", 443}}) {
    if (id.size() < scheme.size() || !iequals(id.substr(0, scheme.size()), scheme)) continue;
    const auto rest = id.substr(scheme.size());
    const auto path = rest.find_first_of("/?");
    const auto location = read_authority(rest.substr(0, path));
    if (!location) return {};
    const bool own = same_authority(*location, default_port, request_host) ||
                     std::any_of(hosts.begin(), hosts.end(), [&](const std::string& h) {
                       return same_authority(*location, default_port, h);
                     });
    if (!own) return {};
    if (path == std::string_view::npos) return "/";
    if (rest[path] == '?') {
      // Appended rather than `"/" + std::string(...)`, on which GCC 12's -Wrestrict
      // warns falsely in optimised builds.
      std::string target(1, '/');
      target.append(rest.substr(path));
      return target;
    }
    return std::string(rest.substr(path));
  }
  // "//host/..." is a network-path reference: another authority, never followed.
  if (id.empty() || id.front() != '/' || id.starts_with("//")) return {};
  return std::string(id);
}

}  // namespace idem::gateway
