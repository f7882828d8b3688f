#include "gateway/headers.hpp"

#include <array>
#include <cctype>

namespace idem::gateway {

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
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

void strip_hop_by_hop(boost::beast::http::fields& fields) {
  // Tokens listed in Connection name further per-hop fields (RFC 9110 §7.6.1).
  std::vector<std::string> named;
  for (auto value : field_values(fields, "Connection")) {
    std::size_t pos = 0;
    while (pos <= value.size()) {
      auto comma = value.find(',', pos);
      auto token = value.substr(pos, comma == std::string_view::npos ? std::string_view::npos
                                                                     : comma - pos);
      while (!token.empty() && (token.front() == ' ' || token.front() == '\t'))
        token.remove_prefix(1);
      while (!token.empty() && (token.back() == ' ' || token.back() == '\t'))
        token.remove_suffix(1);
      if (!token.empty()) named.emplace_back(token);
      if (comma == std::string_view::npos) break;
      pos = comma + 1;
    }
  }
  // Expect is answered here (the session sends 100 Continue itself); passing it on would
  // make the backend send an interim response the client already had.
  static constexpr std::array<std::string_view, 10> fixed = {
      "Connection",        "Keep-Alive", "Proxy-Connection",    "TE",
      "Trailer",           "Transfer-Encoding", "Upgrade", "Proxy-Authenticate",
      "Proxy-Authorization", "Expect"};
  for (auto name : fixed) fields.erase(boost::beast::string_view(name.data(), name.size()));
  for (const auto& name : named) fields.erase(name);
}

TargetParts split_target(std::string_view target) noexcept {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return {target, {}};
  return {target.substr(0, q), target.substr(q + 1)};
}

}  // namespace idem::gateway
