#include "gateway/inbound.hpp"

#include <algorithm>
#include <vector>

#include "gateway/headers.hpp"

namespace idem::gateway {
namespace {

// Fields whose removal by a Connection option would change what the backend is asked,
// besides the decided headers: the virtual host, and the media type the body was read as.
constexpr std::array<std::string_view, 2> kConnectionMayNotName = {"Host", "Content-Type"};

// Headers with which frameworks let a request name another method than its own (Express's
// method-override, ASP.NET Core, Symfony, Google APIs...).
constexpr std::array<std::string_view, 3> kMethodOverrides = {
    "X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"};

bool is_trusted(std::string_view name) noexcept {
  return std::any_of(kTrustedHeaders.begin(), kTrustedHeaders.end(),
                     [&](std::string_view t) { return same_name_for_cgi(name, t); });
}

// A decided header's look-alike: the same for a CGI backend, but not the same field.
bool is_look_alike(std::string_view name, std::span<const std::string> decided) noexcept {
  return std::any_of(decided.begin(), decided.end(), [&](const std::string& d) {
    return same_name_for_cgi(name, d) && !iequals(name, d);
  });
}

}  // namespace

InboundCheck sanitize_inbound(boost::beast::http::fields& fields,
                              std::span<const std::string> decided) {
  InboundCheck out;

  for (auto it = fields.begin(); it != fields.end();) {
    const std::string_view name = it->name_string();
    if (is_trusted(name) || is_look_alike(name, decided)) {
      it = fields.erase(it);
      ++out.dropped;
    } else {
      ++it;
    }
  }

  for (const auto token : connection_tokens(fields)) {
    const auto named = [&](std::string_view d) { return same_name_for_cgi(token, d); };
    const auto d = std::find_if(decided.begin(), decided.end(), named);
    if (d != decided.end()) {
      out.ok = false;
      out.problem = "Connection names " + *d + ", a header idemproxy decides by";
      return out;
    }
    const auto f = std::find_if(kConnectionMayNotName.begin(), kConnectionMayNotName.end(), named);
    if (f != kConnectionMayNotName.end()) {
      out.ok = false;
      out.problem = "Connection names " + std::string(*f) + ", which must reach the backend";
      return out;
    }
  }

  if (fields.count(boost::beast::http::field::content_type) > 1) {
    out.ok = false;
    out.problem = "more than one Content-Type field";
  }
  return out;
}

InboundCheck check_inbound(boost::beast::http::fields& fields, std::string_view method,
                           std::string_view path, const Runtime& runtime,
                           const CompiledRoute* matched) {
  InboundCheck out = sanitize_inbound(fields, runtime.decided_headers());
  if (!out.ok) return out;
  auto refuse = [&](const CompiledRoute& route, std::string_view why) {
    out.ok = false;
    out.problem = std::string(why) + " the route " + route.settings->name + " (" +
                  route.settings->method + " " + route.settings->path + ")";
    return out;
  };
  if (!matched) {
    if (const auto* near = runtime.resembles(method, path)) {
      return refuse(*near, "the request target is not in the exact form of");
    }
  }
  for (const auto& f : fields) {
    const std::string_view name = f.name_string();
    const bool override_header = std::any_of(kMethodOverrides.begin(), kMethodOverrides.end(),
                                             [&](std::string_view o) { return same_name_for_cgi(o, name); });
    if (!override_header) continue;
    std::string_view other = f.value();
    if (iequals(other, method)) continue;
    if (matched) return refuse(*matched, "a method override on a request to");
    const auto* route = runtime.match(other, path);
    if (!route) route = runtime.resembles(other, path);
    if (route) return refuse(*route, "a method override that a backend may read as");
  }
  return out;
}

}  // namespace idem::gateway
