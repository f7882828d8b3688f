// Value syntax of the configuration: units, names, addresses, pointers. Each rule is strict on
// purpose: a configuration that "mostly" parses is how a proxy ends up protecting the wrong
// route or keeping records for seven milliseconds instead of seven days.
#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <set>

#include "common/json_text.hpp"
#include "common/text.hpp"
#include "settings/detail.hpp"
#include "settings/settings.hpp"

namespace idem::settings {

namespace {

std::string format_error(const std::string& file, int line, const std::string& key,
                         const std::string& message) {
  // "file:line: key: message", the shape compilers use, so editors can jump to the spot.
  std::string out = file.empty() ? std::string("<config>") : file;
  // Appended piecewise: `":" + std::to_string(line)` trips a GCC 12 -Wrestrict false positive.
  if (line > 0) {
    out += ':';
    out += std::to_string(line);
  }
  out += ": ";
  if (!key.empty()) {
    out += key;
    out += ": ";
  }
  out += message;
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Leading decimal digits of text as an unsigned value; nullopt on overflow. `used` receives
// how many characters were digits.
std::optional<std::uint64_t> leading_number(std::string_view text, std::size_t& used) {
  used = 0;
  while (used < text.size() && is_digit(text[used])) ++used;
  if (used == 0) return std::nullopt;
  std::uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + used, value);
  if (ec != std::errc{} || ptr != text.data() + used) return std::nullopt;
  return value;
}

Millis duration_or_throw(std::string_view text) {
  static constexpr char kExpected[] =
      "expected an integer followed by a unit: ms, s, m, h or d (e.g. 250ms, 5s, 24h)";
  if (text.empty()) throw detail::SyntaxError(std::string("empty duration: ") + kExpected);
  if (text.front() == '-') throw detail::SyntaxError("a duration cannot be negative");
  std::size_t used = 0;
  std::size_t digits = 0;
  while (digits < text.size() && is_digit(text[digits])) ++digits;
  if (digits == 0) {
    throw detail::SyntaxError("invalid duration '" + std::string(text) + "': " + kExpected);
  }
  const std::string_view unit = text.substr(digits);
  std::int64_t factor = 0;
  if (unit == "ms") factor = 1;
  else if (unit == "s") factor = 1000;
  else if (unit == "m") factor = 60'000;
  else if (unit == "h") factor = 3'600'000;
  else if (unit == "d") factor = 86'400'000;
  else if (unit.empty()) {
    // A bare number is the classic seconds-or-milliseconds trap; make the author say which.
    throw detail::SyntaxError("duration '" + std::string(text) + "' has no unit: " + kExpected);
  } else {
    throw detail::SyntaxError("invalid duration unit '" + std::string(unit) + "' in '" +
                              std::string(text) + "': " + kExpected);
  }
  const auto n = leading_number(text, used);
  constexpr auto kMax = std::numeric_limits<Millis::rep>::max();
  if (!n || *n > static_cast<std::uint64_t>(kMax / factor)) {
    throw detail::SyntaxError("duration '" + std::string(text) + "' is too large");
  }
  return Millis(static_cast<Millis::rep>(*n) * factor);
}

std::size_t size_or_throw(std::string_view text) {
  static constexpr char kExpected[] =
      "expected bytes as an integer, or an integer with unit B, KiB, MiB or GiB (e.g. 64KiB)";
  if (text.empty()) throw detail::SyntaxError(std::string("empty size: ") + kExpected);
  if (text.front() == '-') throw detail::SyntaxError("a size cannot be negative");
  std::size_t used = 0;
  const auto n = leading_number(text, used);
  if (used == 0) {
    throw detail::SyntaxError("invalid size '" + std::string(text) + "': " + kExpected);
  }
  const std::string_view unit = text.substr(used);
  std::uint64_t factor = 0;
  if (unit.empty() || unit == "B") factor = 1;
  else if (unit == "KiB") factor = 1ull << 10;
  else if (unit == "MiB") factor = 1ull << 20;
  else if (unit == "GiB") factor = 1ull << 30;
  else if (unit == "KB" || unit == "kB" || unit == "MB" || unit == "GB" || unit == "k" ||
           unit == "K" || unit == "M" || unit == "G") {
    // Whether "MB" means 10^6 or 2^20 depends on who wrote it; only IEC units are unambiguous.
    throw detail::SyntaxError("size unit '" + std::string(unit) +
                              "' is ambiguous: use KiB, MiB or GiB (powers of 1024) or plain bytes");
  } else {
    throw detail::SyntaxError("invalid size unit '" + std::string(unit) + "' in '" +
                              std::string(text) + "': " + kExpected);
  }
  constexpr auto kMax = std::numeric_limits<std::size_t>::max();
  if (!n || *n > kMax / factor) {
    throw detail::SyntaxError("size '" + std::string(text) + "' is too large");
  }
  return static_cast<std::size_t>(*n * factor);
}

bool is_hostname(std::string_view h) {
  if (h.empty() || h.size() > 253) return false;
  std::size_t label = 0;
  char prev = '.';
  for (char c : h) {
    if (c == '.') {
      if (label == 0 || prev == '-') return false;  // labels neither empty nor ending in '-'
      label = 0;
      prev = c;
      continue;
    }
    if (c == '-' && label == 0) return false;  // nor starting with one
    prev = c;
    // '_' is not valid in DNS host names, but container runtimes hand out such names and
    // resolvers accept them; refusing them would only push people to IP addresses.
    if (!is_alpha(c) && !is_digit(c) && c != '-' && c != '_') return false;
    if (++label > 63) return false;
  }
  if (prev == '-') return false;
  return label > 0 || h.size() > 1;  // a trailing dot (FQDN) is fine, a lone "." is not
}

bool looks_like_ipv4(std::string_view h) {
  return !h.empty() &&
         std::all_of(h.begin(), h.end(), [](char c) { return is_digit(c) || c == '.'; });
}

bool valid_inet(int family, std::string_view text) {
  std::array<unsigned char, 16> buf{};
  const std::string s(text);
  return inet_pton(family, s.c_str(), buf.data()) == 1;
}

// Host part of an endpoint or URL authority, brackets already removed by the caller when
// `bracketed`.
void check_host(std::string_view host, bool bracketed) {
  if (host.empty()) throw detail::SyntaxError("missing host");
  if (bracketed) {
    if (!valid_inet(AF_INET6, host)) {
      throw detail::SyntaxError("'" + std::string(host) + "' is not a valid IPv6 address");
    }
    return;
  }
  if (looks_like_ipv4(host)) {
    if (!valid_inet(AF_INET, host)) {
      throw detail::SyntaxError("'" + std::string(host) + "' is not a valid IPv4 address");
    }
    return;
  }
  if (!is_hostname(host)) {
    throw detail::SyntaxError("'" + std::string(host) + "' is not a valid host name");
  }
}

std::uint16_t parse_port(std::string_view text, int min) {
  std::size_t used = 0;
  const auto n = leading_number(text, used);
  if (text.empty() || used != text.size() || !n || *n > 65535 ||
      *n < static_cast<std::uint64_t>(min)) {
    throw detail::SyntaxError("invalid port '" + std::string(text) + "' (expected " +
                              std::to_string(min) + "..65535)");
  }
  return static_cast<std::uint16_t>(*n);
}

// Splits "host:port" / "[v6]:port" / "host" (when the port is optional) into parts.
struct HostPort {
  std::string host;
  std::optional<std::string_view> port;
};

HostPort split_host_port(std::string_view text) {
  HostPort hp;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) throw detail::SyntaxError("missing ']' after IPv6 address");
    const auto host = text.substr(1, close - 1);
    check_host(host, true);
    hp.host = std::string(host);
    const auto rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') throw detail::SyntaxError("expected ':' and a port after ']'");
      hp.port = rest.substr(1);
    }
    return hp;
  }
  const auto colon = text.rfind(':');
  if (colon != std::string_view::npos && text.find(':') != colon) {
    throw detail::SyntaxError("IPv6 addresses must be written in brackets, e.g. [::1]:8080");
  }
  const auto host = text.substr(0, colon);
  check_host(host, false);
  hp.host = std::string(host);
  if (colon != std::string_view::npos) hp.port = text.substr(colon + 1);
  return hp;
}

bool is_visible_or_utf8(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u > 0x20 && u != 0x7f;
}

}  // namespace

// what() stays the bare message because callers print file, line and key themselves
// (main's error output, the reload log line); full_message() is for everyone else.
ConfigError::ConfigError(std::string file, int line, std::string key, const std::string& message)
    : std::runtime_error(message), file_(std::move(file)), line_(line), key_(std::move(key)) {}

std::string ConfigError::full_message() const { return format_error(file_, line_, key_, what()); }

bool StoreSettings::stores(int status) const {
  const bool listed = std::any_of(statuses.begin(), statuses.end(), [status](const StatusPattern& p) {
    return status >= p.low && status <= p.high;
  });
  return listed && std::find(except.begin(), except.end(), status) == except.end();
}

std::optional<Millis> parse_duration(std::string_view text) {
  try {
    return duration_or_throw(text);
  } catch (const detail::SyntaxError&) {
    return std::nullopt;
  }
}

std::optional<std::size_t> parse_size(std::string_view text) {
  try {
    return size_or_throw(text);
  } catch (const detail::SyntaxError&) {
    return std::nullopt;
  }
}

namespace detail {

Millis duration_checked(std::string_view text) { return duration_or_throw(text); }
std::size_t size_checked(std::string_view text) { return size_or_throw(text); }

std::string format_duration(Millis d) {
  struct Unit {
    std::int64_t ms;
    const char* name;
  };
  static constexpr Unit kUnits[] = {
      {86'400'000, "d"}, {3'600'000, "h"}, {60'000, "m"}, {1000, "s"}};
  const auto n = d.count();
  if (n != 0) {
    for (const auto& u : kUnits) {
      if (n % u.ms == 0) return std::to_string(n / u.ms) + u.name;
    }
  }
  return std::to_string(n) + "ms";
}

std::string format_size(std::size_t bytes) {
  struct Unit {
    std::size_t factor;
    const char* name;
  };
  static constexpr Unit kUnits[] = {{1u << 30, "GiB"}, {1u << 20, "MiB"}, {1u << 10, "KiB"}};
  if (bytes != 0) {
    for (const auto& u : kUnits) {
      if (bytes % u.factor == 0) return std::to_string(bytes / u.factor) + u.name;
    }
  }
  return std::to_string(bytes);
}

std::optional<std::int64_t> parse_int(std::string_view text) {
  if (text.empty()) return std::nullopt;
  const bool negative = text.front() == '-';
  const auto digits = negative ? text.substr(1) : text;
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), is_digit)) return std::nullopt;
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

bool is_token(std::string_view s) {
  static constexpr std::string_view kSpecials = "!#$%&'*+-.^_`|~";
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return is_alpha(c) || is_digit(c) || kSpecials.find(c) != std::string_view::npos;
  });
}

bool is_json_pointer(std::string_view s) {
  if (s.empty()) return true;
  if (s.front() != '/') return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '~' && (i + 1 >= s.size() || (s[i + 1] != '0' && s[i + 1] != '1'))) return false;
  }
  return true;
}

bool is_key_pointer(std::string_view s) {
  if (s.empty()) return false;
  if (s.front() == '/') {
    if (!is_json_pointer(s)) return false;
    // "*" means every element of an array: a key is one value, never a list of them.
    for (std::size_t at = 0; at != std::string_view::npos;) {
      const auto next = s.find('/', at + 1);
      if (s.substr(at + 1, next == std::string_view::npos ? next : next - at - 1) == "*") return false;
      at = next;
    }
    return true;
  }
  // A form field path: name[a][b], no group empty ("[]" appends, so it names no one value).
  const auto open = s.find('[');
  if (open == 0 || s.substr(0, open).find(']') != std::string_view::npos) return false;
  for (std::size_t i = open; i < s.size();) {
    if (s[i] != '[') return false;
    const auto close = s.find(']', i);
    if (close == std::string_view::npos || close == i + 1) return false;
    if (s.substr(i + 1, close - i - 1).find('[') != std::string_view::npos) return false;
    i = close + 1;
  }
  return true;
}

bool is_json_number(std::string_view s) {
  std::size_t i = 0;
  const auto digits = [&] {
    const auto start = i;
    while (i < s.size() && is_digit(s[i])) ++i;
    return i - start;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i >= s.size()) return false;
  if (s[i] == '0') {
    ++i;
  } else if (digits() == 0) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

Endpoint parse_endpoint(std::string_view text) {
  if (text.empty()) throw SyntaxError("empty address: expected host:port");
  auto hp = split_host_port(text);
  if (!hp.port) throw SyntaxError("missing port in '" + std::string(text) + "': expected host:port");
  // Port 0 asks the kernel for a free port; tests start many sidecars side by side.
  return Endpoint{std::move(hp.host), parse_port(*hp.port, 0)};
}

std::string parse_authority(std::string_view text) {
  if (text.empty()) throw SyntaxError("empty host: expected host or host:port");
  if (text.find_first_of("/?#@") != std::string_view::npos || text.find("://") != std::string_view::npos) {
    throw SyntaxError("'" + std::string(text) + "' is not a host or host:port (no scheme, path or user information)");
  }
  auto hp = split_host_port(text);
  std::string out = text::lowercase(hp.host);
  if (out.find(':') != std::string::npos) out = "[" + out + "]";
  if (hp.port) out += ":" + std::to_string(parse_port(*hp.port, 1));
  return out;
}

std::string format_endpoint(const Endpoint& e) {
  const bool v6 = e.host.find(':') != std::string::npos;
  return (v6 ? "[" + e.host + "]" : e.host) + ":" + std::to_string(e.port);
}

void parse_upstream_url(std::string_view url, UpstreamSettings& out) {
  const auto scheme_end = url.find("://");
  const std::string scheme =
      text::lowercase(url.substr(0, scheme_end == std::string_view::npos ? 0 : scheme_end));
  if (scheme != "http" && scheme != "https") {
    throw SyntaxError("invalid upstream url '" + std::string(url) +
                      "': expected http[s]://host[:port][/path]");
  }
  const bool https = scheme == "https";
  const auto rest = url.substr(scheme_end + 3);
  if (rest.find_first_of("?#") != std::string_view::npos) {
    throw SyntaxError("the upstream url cannot carry a query or fragment");
  }
  const auto slash = rest.find('/');
  const auto authority = rest.substr(0, slash);
  if (authority.find('@') != std::string_view::npos) {
    throw SyntaxError("the upstream url cannot carry user information");
  }
  if (authority.empty()) throw SyntaxError("the upstream url has no host");
  auto hp = split_host_port(authority);
  const std::uint16_t port = hp.port ? parse_port(*hp.port, 1) : (https ? 443 : 80);
  std::string base(slash == std::string_view::npos ? std::string_view{} : rest.substr(slash));
  if (!std::all_of(base.begin(), base.end(), is_visible_or_utf8)) {
    throw SyntaxError("the upstream url path contains spaces or control characters");
  }
  // The request path is appended to the base, so "/api/" + "/orders" must not become
  // "/api//orders".
  while (!base.empty() && base.back() == '/') base.pop_back();
  out.url = std::string(url);
  out.https = https;
  out.host = std::move(hp.host);
  out.port = port;
  out.base_path = std::move(base);
}

void check_route_path(std::string_view path) {
  if (path.empty() || path.front() != '/') throw SyntaxError("a route path must start with '/'");
  if (path.find_first_of("?#") != std::string_view::npos) {
    throw SyntaxError("a route path cannot contain '?' or '#': routes match the path only");
  }
  if (!std::all_of(path.begin(), path.end(), is_visible_or_utf8)) {
    throw SyntaxError("a route path cannot contain spaces or control characters");
  }
  std::set<std::string_view> params;
  std::size_t start = 1;
  while (true) {
    const auto end = path.find('/', start);
    const auto seg = path.substr(start, end == std::string_view::npos ? path.npos : end - start);
    const bool last = end == std::string_view::npos;
    if (seg.empty() && !last) throw SyntaxError("a route path cannot contain an empty segment ('//')");
    if (seg == "." || seg == "..") throw SyntaxError("a route path cannot contain '.' or '..' segments");
    if (seg.find_first_of("{}") != std::string_view::npos) {
      if (seg.size() < 3 || seg.front() != '{' || seg.back() != '}') {
        throw SyntaxError("template parameters must be whole segments such as /{id}/, not '" +
                          std::string(seg) + "'");
      }
      const auto name = seg.substr(1, seg.size() - 2);
      const bool ident = (is_alpha(name.front()) || name.front() == '_') &&
                         std::all_of(name.begin(), name.end(), [](char c) {
                           return is_alpha(c) || is_digit(c) || c == '_';
                         });
      if (!ident) {
        throw SyntaxError("invalid template parameter name '" + std::string(name) +
                          "' (letters, digits and '_')");
      }
      if (!params.insert(name).second) {
        throw SyntaxError("template parameter '" + std::string(name) + "' appears twice");
      }
    }
    if (last) break;
    start = end + 1;
  }
}

std::string route_shape(std::string_view path) {
  std::string out;
  out.reserve(path.size());
  bool in_param = false;
  for (char c : path) {
    if (c == '{') {
      in_param = true;
      out += "{}";
    } else if (c == '}') {
      in_param = false;
    } else if (!in_param) {
      out += c;
    }
  }
  return out;
}

std::string json_quote(std::string_view s) { return text::json_quote(s); }

std::string expand_env(std::string_view text, const EnvLookup& env) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c != '$' || i + 1 >= text.size()) {
      out += c;
      continue;
    }
    const char next = text[i + 1];
    if (next == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (next != '{') {
      out += c;
      continue;
    }
    const auto close = text.find('}', i + 2);
    if (close == std::string_view::npos) throw SyntaxError("unterminated '${' (missing '}')");
    const auto body = text.substr(i + 2, close - i - 2);
    const auto sep = body.find(":-");
    const auto name = body.substr(0, sep);
    const bool valid_name = !name.empty() && (is_alpha(name.front()) || name.front() == '_') &&
                            std::all_of(name.begin(), name.end(), [](char ch) {
                              return is_alpha(ch) || is_digit(ch) || ch == '_';
                            });
    if (!valid_name) {
      throw SyntaxError("invalid variable reference '${" + std::string(body) +
                        "}': expected ${NAME} or ${NAME:-default}");
    }
    const std::string key(name);
    const char* value = env ? env(key) : nullptr;
    if (sep == std::string_view::npos) {
      if (value == nullptr) {
        throw SyntaxError("environment variable " + key + " is not set (write ${" + key +
                          ":-default} to give a default)");
      }
      out += value;
    } else if (value != nullptr && *value != '\0') {
      out += value;
    } else {
      // As in a shell, ":-" also covers a variable that is set but empty.
      out += body.substr(sep + 2);
    }
    i = close;
  }
  return out;
}

}  // namespace detail
}  // namespace idem::settings
