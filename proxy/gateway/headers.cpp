#include "gateway/headers.hpp"

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

std::vector<std::string_view> connection_tokens(const boost::beast::http::fields& fields) {
  std::vector<std::string_view> out;
  for (auto value : field_values(fields, "Connection")) {
    std::size_t pos = 0;
    while (pos <= value.size()) {
      auto comma = value.find(',', pos);
      auto token = value.substr(pos, comma == std::string_view::npos ? std::string_view::npos
                                                                     : comma - pos);
      token = text::trim_ows(token);
      if (!token.empty()) out.push_back(token);
      if (comma == std::string_view::npos) break;
      pos = comma + 1;
    }
  }
  return out;
}

void strip_hop_by_hop(boost::beast::http::fields& fields) {
  // Tokens listed in Connection name further per-hop fields (RFC 9110 §7.6.1). Copied: the
  // views point into the fields that are about to be erased.
  std::vector<std::string> named;
  for (auto token : connection_tokens(fields)) named.emplace_back(token);
  // Expect is answered here (the session sends 100 Continue itself); passing it on would
  // make the backend send an interim response the client already had.
  static constexpr std::array<std::string_view, 10> fixed = {
      "Connection",        "Keep-Alive", "Proxy-Connection",    "TE",
      "Trailer",           "Transfer-Encoding", "Upgrade", "Proxy-Authenticate",
      "Proxy-Authorization", "Expect"};
  for (auto name : fixed) fields.erase(boost::beast::string_view(name.data(), name.size()));
  for (const auto& name : named) fields.erase(name);
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

void strip_replay_markers(boost::beast::http::fields& fields) {
  for (auto name : kReplayMarkers) fields.erase(boost::beast::string_view(name.data(), name.size()));
  for (auto name : kBackendControls) fields.erase(boost::beast::string_view(name.data(), name.size()));
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

std::string refetch_target(std::string_view id) {
  id = id.substr(0, id.find('#'));
  for (std::string_view scheme : {"http://", "https://"}) {
    if (id.size() >= scheme.size() && iequals(id.substr(0, scheme.size()), scheme)) {
      const auto rest = id.substr(scheme.size());
      const auto path = rest.find_first_of("/?");
      if (path == std::string_view::npos) return "/";
      if (rest[path] == '?') return "/" + std::string(rest.substr(path));
      return std::string(rest.substr(path));
    }
  }
  // "//host/..." is a network-path reference: another authority, never followed.
  if (id.empty() || id.front() != '/' || id.starts_with("//")) return {};
  return std::string(id);
}

}  // namespace idem::gateway
