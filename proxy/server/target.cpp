#include "server/target.hpp"

#include "common/text.hpp"

namespace idem::server {
namespace {

// RFC 3986 §2.3.
constexpr bool is_unreserved(unsigned char c) noexcept { return text::is_unreserved(static_cast<char>(c)); }

// RFC 3986 §2.2.
constexpr bool is_sub_delim(unsigned char c) noexcept {
  switch (c) {
    case '!': case '$': case '&': case '\'': case '(': case ')':
    case '*': case '+': case ',': case ';': case '=':
      return true;
    default:
      return false;
  }
}

// pchar minus pct-encoded, plus '/' (RFC 3986 §3.3).
constexpr bool is_path_char(unsigned char c) noexcept {
  return is_unreserved(c) || is_sub_delim(c) || c == ':' || c == '@' || c == '/';
}

// The query is not part of route matching, and clients commonly send characters such as
// '|', '{' or '"' unencoded there; any visible ASCII but '#' is accepted as it is.
constexpr bool is_query_char(unsigned char c) noexcept { return c > 0x20 && c < 0x7f && c != '#'; }

using text::ascii_lower;
using text::iequals;

// An origin-form path may start with an empty segment (RFC 9112 §3.2.1 allows "//x"), but
// every URI-reference parser reads "//evil.example/orders" as the authority evil.example
// and the path /orders (RFC 3986 §4.2, a network-path reference): a backend framework that
// parses the target that way runs a route the gateway never matched, and no loose
// comparison of segments can see it (the route has one segment, the target two). Found
// writing fuzz/target's properties.
constexpr std::string_view kNetworkPath =
    "a path starting with \"//\" (it reads as a network-path reference to an authority)";

NormalizedTarget refuse(std::string_view why) {
  NormalizedTarget out;
  out.problem = why;
  return out;
}

// Appends `in` to `out` with percent-encodings normalized: unreserved characters decoded,
// the others kept with upper-case hex digits. Returns a reason when `in` is not acceptable.
std::string_view append_normalized(std::string& out, std::string_view in, bool is_path) {
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto c = static_cast<unsigned char>(in[i]);
    if (c == '%') {
      const int byte = text::percent_byte(in, i);
      if (byte < 0) return "malformed percent-encoding";
      const auto decoded = static_cast<unsigned char>(byte);
      if (is_path && decoded == 0) return "a percent-encoded NUL in the path";
      if (is_unreserved(decoded)) {
        out.push_back(static_cast<char>(decoded));
      } else {
        text::append_percent_encoded(out, decoded);
      }
      i += 2;
      continue;
    }
    if (c >= 0x80) return "a byte outside ASCII in the request target (percent-encode it)";
    if (is_path ? !is_path_char(c) : !is_query_char(c)) {
      return is_path ? "a character that must be percent-encoded in the path"
                     : "a control character in the query";
    }
    out.push_back(static_cast<char>(c));
  }
  return {};
}

// scheme "://" at the start of `raw` (RFC 3986 §3.1); the scheme without the separator.
std::string_view scheme_of(std::string_view raw) noexcept {
  const auto sep = raw.find("://");
  if (sep == std::string_view::npos || sep == 0) return {};
  const auto first = static_cast<unsigned char>(raw[0]);
  if (!((first >= 'a' && first <= 'z') || (first >= 'A' && first <= 'Z'))) return {};
  for (std::size_t i = 1; i < sep; ++i) {
    const auto c = static_cast<unsigned char>(raw[i]);
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '+' || c == '-' || c == '.';
    if (!ok) return {};
  }
  return raw.substr(0, sep);
}

bool is_port(std::string_view p) noexcept {
  if (p.size() > 5) return false;
  for (const char c : p) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool valid_reg_name(std::string_view host) noexcept {
  for (std::size_t i = 0; i < host.size(); ++i) {
    const auto c = static_cast<unsigned char>(host[i]);
    if (c == '%') {
      if (text::percent_byte(host, i) < 0) return false;
      i += 2;
      continue;
    }
    if (!is_unreserved(c) && !is_sub_delim(c)) return false;
  }
  return true;
}

// Nearly every target is already normal: origin-form, no percent-encoding, no dot segment,
// only characters that need no decision. Recognized in one pass, it is taken as it is.
bool already_normal(std::string_view raw) noexcept {
  if (raw.empty() || raw.front() != '/' || raw.starts_with("//")) return false;
  bool in_query = false;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const auto c = static_cast<unsigned char>(raw[i]);
    if (c == '%' || c == '#') return false;
    if (in_query) {
      if (!is_query_char(c)) return false;
      continue;
    }
    if (c == '?') {
      in_query = true;
      continue;
    }
    if (!is_path_char(c)) return false;
    if (c == '/' && i + 1 < raw.size() && raw[i + 1] == '.') return false;
  }
  return true;
}

}  // namespace

bool valid_host_value(std::string_view value) noexcept {
  if (value.empty()) return true;
  std::string_view host = value;
  std::string_view port;
  bool has_port = false;
  if (value.front() == '[') {
    const auto close = value.find(']');
    if (close == std::string_view::npos || close == 1) return false;
    for (std::size_t i = 1; i < close; ++i) {
      const auto c = static_cast<unsigned char>(value[i]);
      if (!is_unreserved(c) && !is_sub_delim(c) && c != ':') return false;
    }
    const auto rest = value.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      has_port = true;
      port = rest.substr(1);
    }
    return !has_port || is_port(port);
  }
  if (const auto colon = value.find(':'); colon != std::string_view::npos) {
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
    has_port = true;
  }
  if (host.empty()) return false;  // ":8080" names no host
  return valid_reg_name(host) && (!has_port || is_port(port));
}

std::string remove_dot_segments(std::string_view path) {
  // Nearly every target has no dot segment: the loop below would only copy it.
  if (path.find("/.") == std::string_view::npos) return std::string(path);
  std::string out;
  out.reserve(path.size());
  std::string_view in = path;
  auto drop_last_segment = [&out] {
    const auto slash = out.rfind('/');
    out.erase(slash == std::string::npos ? 0 : slash);
  };
  while (!in.empty()) {
    // Step numbers are those of RFC 3986 §5.2.4.
    if (in.starts_with("../")) {  // A
      in.remove_prefix(3);
    } else if (in.starts_with("./")) {
      in.remove_prefix(2);
    } else if (in.starts_with("/./")) {  // B
      in.remove_prefix(2);
    } else if (in == "/.") {
      in = "/";
    } else if (in.starts_with("/../")) {  // C
      in.remove_prefix(3);
      drop_last_segment();
    } else if (in == "/..") {
      in = "/";
      drop_last_segment();
    } else if (in == "." || in == "..") {  // D
      in = {};
    } else {  // E: the first segment, with its leading '/', moves to the output
      const auto next = in.find('/', in.front() == '/' ? 1 : 0);
      const auto seg = in.substr(0, next);
      out.append(seg.data(), seg.size());
      in.remove_prefix(seg.size());
    }
  }
  return out;
}

NormalizedTarget normalize_target(std::string_view raw, bool is_options) {
  if (raw.find('#') != std::string_view::npos) {
    return refuse("a fragment in the request target (RFC 9112 §3.2)");
  }
  if (raw == "*") {
    if (!is_options) return refuse("the asterisk target is only for OPTIONS");
    NormalizedTarget out;
    out.ok = true;
    out.form = TargetForm::asterisk;
    out.target = "*";
    return out;
  }

  NormalizedTarget out;
  if (already_normal(raw)) {
    out.ok = true;
    out.target = raw;
    return out;
  }
  std::string_view rest = raw;
  if (rest.empty() || rest.front() != '/') {
    const auto scheme = scheme_of(rest);
    if (scheme.empty()) {
      return refuse("the request target must be in origin-form or absolute-form");
    }
    if (!iequals(scheme, "http") && !iequals(scheme, "https")) {
      return refuse("an absolute-form target with a scheme other than http or https");
    }
    rest.remove_prefix(scheme.size() + 3);
    const auto end = rest.find_first_of("/?");
    const auto authority = rest.substr(0, end);
    if (authority.find('@') != std::string_view::npos) {
      return refuse("userinfo in the request target");  // RFC 9110 §4.2.4
    }
    if (authority.empty() || authority.front() == ':' || !valid_host_value(authority)) {
      return refuse("an absolute-form target without a valid host");
    }
    out.form = TargetForm::absolute;
    out.authority.reserve(authority.size());
    for (const char c : authority) out.authority.push_back(ascii_lower(c));  // §6.2.2.1
    rest.remove_prefix(authority.size());
  }

  const auto q = rest.find('?');
  const auto raw_path = rest.substr(0, q);
  std::string path;
  path.reserve(raw_path.size() + 1);
  if (raw_path.empty()) path.push_back('/');  // "http://host?x" has the path "/"
  if (const auto why = append_normalized(path, raw_path, true); !why.empty()) return refuse(why);
  out.target = remove_dot_segments(path);
  // Checked after dot-segment removal, which can produce it ("/..//x", "/.//x").
  if (out.target.starts_with("//")) return refuse(kNetworkPath);
  if (q != std::string_view::npos) {
    out.target.push_back('?');
    if (const auto why = append_normalized(out.target, rest.substr(q + 1), false); !why.empty()) {
      return refuse(why);
    }
  }
  out.ok = true;
  return out;
}

}  // namespace idem::server
