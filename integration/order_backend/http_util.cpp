#include "http_util.hpp"

#include <charconv>
#include <limits>
#include <utility>

#include <boost/json/serialize.hpp>

#include "common/text.hpp"

namespace idem::demo {

std::optional<std::string_view> single_header(const Request& req, std::string_view name,
                                              bool* repeated) {
  const auto range = req.equal_range(name);  // Beast compares names case-insensitively
  if (range.first == range.second) {
    return std::nullopt;
  }
  if (repeated != nullptr) {
    *repeated = std::next(range.first) != range.second;
  }
  return range.first->value();
}

bool is_token(std::string_view text, std::size_t max_length) {
  if (text.empty() || text.size() > max_length) {
    return false;
  }
  for (const char c : text) {
    if (c < 0x21 || c > 0x7e) {
      return false;
    }
  }
  return true;
}

bool is_uuid(std::string_view text) {
  if (text.size() != 36) {
    return false;
  }
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? c != '-' : text::hex_value(c) < 0) {
      return false;
    }
  }
  return true;
}

Response json_response(const Request& req, http::status status, const json::value& body) {
  Response res{status, req.version()};
  res.set(http::field::content_type, "application/json");
  res.body() = json::serialize(body);
  res.keep_alive(req.keep_alive());
  res.prepare_payload();
  return res;
}

Response problem(const Request& req, http::status status, std::string_view code,
                 std::string_view title, std::string_view detail, json::object extra) {
  json::object body;
  body["type"] = "urn:idem-order-demo:problem:" + std::string(code);
  body["title"] = title;
  body["status"] = static_cast<int>(status);
  body["code"] = code;
  body["detail"] = detail;
  for (auto& member : extra) {
    body[member.key()] = std::move(member.value());
  }
  Response res{status, req.version()};
  res.set(http::field::content_type, "application/problem+json");
  res.body() = json::serialize(body);
  res.keep_alive(req.keep_alive());
  res.prepare_payload();
  return res;
}

std::optional<std::int64_t> parse_int(std::string_view text, bool allow_negative) {
  if (text.empty() || (!allow_negative && text.front() == '-') || text.front() == '+') {
    return std::nullopt;
  }
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

std::optional<Millis> parse_duration(std::string_view text) {
  struct Unit {
    std::string_view suffix;
    std::int64_t ms;
  };
  // "ms" before "s": the longer suffix must win.
  static constexpr Unit units[] = {
      {"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}};
  for (const auto& unit : units) {
    if (text.size() > unit.suffix.size() && text.ends_with(unit.suffix)) {
      const auto number = parse_int(text.substr(0, text.size() - unit.suffix.size()));
      if (!number || *number > std::numeric_limits<std::int64_t>::max() / unit.ms) {
        return std::nullopt;
      }
      return Millis(*number * unit.ms);
    }
  }
  return std::nullopt;
}

std::optional<HttpUrl> parse_http_url(std::string_view text) {
  constexpr std::string_view scheme = "http://";
  if (!text.starts_with(scheme)) {
    return std::nullopt;
  }
  text.remove_prefix(scheme.size());
  const auto slash = text.find('/');
  std::string_view authority = text.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view{} : text.substr(slash);
  if (authority.empty() || authority.find('@') != std::string_view::npos ||
      path.find_first_of("?#") != std::string_view::npos) {
    return std::nullopt;
  }
  while (path.ends_with('/')) {
    path.remove_suffix(1);
  }

  HttpUrl url;
  url.path_prefix = std::string(path);
  std::string_view host = authority;
  std::string_view port;
  if (authority.front() == '[') {  // IPv6 literal
    const auto close = authority.find(']');
    if (close == std::string_view::npos) {
      return std::nullopt;
    }
    host = authority.substr(1, close - 1);
    const auto rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') {
        return std::nullopt;
      }
      port = rest.substr(1);
    }
  } else if (const auto colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) {
    return std::nullopt;
  }
  url.host = std::string(host);
  if (!port.empty()) {
    const auto n = parse_int(port);
    if (!n || *n < 1 || *n > 65535) {
      return std::nullopt;
    }
    url.port = static_cast<std::uint16_t>(*n);
  }
  return url;
}

}  // namespace idem::demo
