#pragma once
// Header hygiene shared by the forward and the response paths (RFC 9110 §7.6.1).
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/http/fields.hpp>

namespace idem::gateway {

// Removes hop-by-hop fields: the fixed list plus every field named in Connection.
void strip_hop_by_hop(boost::beast::http::fields& fields);

// Every value of a field (case-insensitive name), in order.
std::vector<std::string_view> field_values(const boost::beast::http::fields& fields,
                                           std::string_view name);

bool iequals(std::string_view a, std::string_view b) noexcept;

// Splits "path?query" of an origin-form target.
struct TargetParts {
  std::string_view path;
  std::string_view query;  // without '?', "" when none
};
TargetParts split_target(std::string_view target) noexcept;

}  // namespace idem::gateway
