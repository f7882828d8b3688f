// Fuzz target "target": the one normalization of a request target (server/target.hpp),
// which decides what route matching, the fingerprint, the access log and the backend see.
//
// Input: byte 0 (bit 0) says whether the method is OPTIONS; the rest is the request-target
// as it appears on the request line (any bytes).
//
// Properties:
//   1. Differential: normalize_target() accepts exactly what an independent reading of the
//      documented rules accepts (Reference below, written from RFC 3986 and RFC 9112 §3.2,
//      sharing no code with target.cpp or common/text.cpp), with the same form, target and
//      authority; a refusal has a reason.
//   2. Idempotent: normalizing an accepted target again accepts it as itself, in
//      origin-form (or "*" for OPTIONS) — the gateway and the backend cannot be handed two
//      spellings of one path by normalizing twice.
//   3. What an accepted target never contains: a "." or ".." path segment, a
//      percent-encoded unreserved character, a lower-case hex digit in a percent-encoding,
//      a malformed percent-encoding, a '#', a byte outside visible ASCII, a path that does
//      not start with '/', or a path that starts with "//" (a network-path reference to
//      any URI-reference parser a backend may use: "//evil.example/orders" reads as host
//      evil.example, path /orders).
//   4. The authority of an absolute-form target is a valid Host value (it replaces Host).
//   5. remove_dot_segments() agrees with the reference's segment-stack resolution on the
//      path and, applied twice, changes nothing.
//
// covers: proxy/server/target.cpp
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/target.hpp"
#include "support/check.hpp"

namespace {

using idem::fuzz::printable;
namespace srv = idem::server;

// ------------------------------------------------------------------------ the reference
// Character classes of RFC 3986, spelled out as sets rather than ranges.
constexpr std::string_view kAlpha = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
constexpr std::string_view kDigit = "0123456789";
constexpr std::string_view kHexUpper = "0123456789ABCDEF";

bool in(std::string_view set, char c) { return set.find(c) != std::string_view::npos; }
bool unreserved(char c) { return in(kAlpha, c) || in(kDigit, c) || in("-._~", c); }  // §2.3
bool sub_delim(char c) { return in("!$&'()*+,;=", c); }                              // §2.2
bool pchar(char c) { return unreserved(c) || sub_delim(c) || c == ':' || c == '@'; }  // §3.3
int hex(char c) {
  if (in(kDigit, c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

struct RefTarget {
  srv::TargetForm form = srv::TargetForm::origin;
  std::string target;
  std::string authority;
};

// §6.2.2.2: one spelling per character. `path`: a '/' separates, NUL is refused, and only
// pchar may appear unencoded; in the query any visible ASCII byte may (the documented
// leniency for query strings clients send unencoded).
std::optional<std::string> normalize_component(std::string_view s, bool path) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '%') {
      if (i + 2 >= s.size()) return std::nullopt;  // "%" or "%X" at the end
      const int hi = hex(s[i + 1]);
      const int lo = hex(s[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      const char decoded = static_cast<char>(hi * 16 + lo);
      if (path && decoded == '\0') return std::nullopt;
      if (unreserved(decoded)) {
        out.push_back(decoded);
      } else {
        out.push_back('%');
        out.push_back(kHexUpper[hi]);
        out.push_back(kHexUpper[lo]);
      }
      i += 2;
      continue;
    }
    const bool allowed = path ? (pchar(c) || c == '/') : (c > ' ' && c < 0x7f && c != '#');
    if (!allowed) return std::nullopt;
    out.push_back(c);
  }
  return out;
}

// §5.2.4 for an absolute path, as a stack of segments instead of the RFC's two buffers:
// "." is dropped, ".." drops the previous segment (even an empty one); a "." or ".." in
// last position leaves the path ending in '/'.
std::string resolve_dots(std::string_view path) {
  std::vector<std::string_view> stack;
  bool trailing_slash = false;
  std::size_t pos = 1;  // past the leading '/'
  while (true) {
    const std::size_t slash = path.find('/', pos);
    const std::string_view seg = path.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos);
    const bool last = slash == std::string_view::npos;
    if (seg == ".") {
      trailing_slash = last;
    } else if (seg == "..") {
      if (!stack.empty()) stack.pop_back();
      trailing_slash = last;
    } else {
      stack.push_back(seg);
      trailing_slash = false;
    }
    if (last) break;
    pos = slash + 1;
  }
  std::string out;
  for (const auto seg : stack) {
    out.push_back('/');
    out.append(seg);
  }
  if (trailing_slash || out.empty()) out.push_back('/');
  return out;
}

// host [":" port] of an absolute-form target: an IP-literal ("[" unreserved / sub-delims /
// ":" "]", the documented leniency: not checked as an IPv6 address) or a non-empty
// reg-name; port 0 to 5 digits.
bool valid_authority(std::string_view a) {
  std::string_view port;
  bool has_port = false;
  if (!a.empty() && a.front() == '[') {
    const std::size_t close = a.find(']');
    if (close == std::string_view::npos || close == 1) return false;
    for (const char c : a.substr(1, close - 1)) {
      if (!unreserved(c) && !sub_delim(c) && c != ':') return false;
    }
    const std::string_view rest = a.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      has_port = true;
      port = rest.substr(1);
    }
  } else {
    const std::size_t colon = a.find(':');
    const std::string_view host = a.substr(0, colon);
    if (colon != std::string_view::npos) {
      has_port = true;
      port = a.substr(colon + 1);
    }
    if (host.empty()) return false;
    for (std::size_t i = 0; i < host.size(); ++i) {
      if (host[i] == '%') {
        if (i + 2 >= host.size() || hex(host[i + 1]) < 0 || hex(host[i + 2]) < 0) return false;
        i += 2;
      } else if (!unreserved(host[i]) && !sub_delim(host[i])) {
        return false;
      }
    }
  }
  if (has_port) {
    if (port.size() > 5) return false;
    for (const char c : port) {
      if (!in(kDigit, c)) return false;
    }
  }
  return true;
}

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::optional<RefTarget> reference(std::string_view raw, bool options) {
  if (in(raw, '#')) return std::nullopt;  // RFC 9112 §3.2: no fragment
  RefTarget out;
  if (raw == "*") {  // §3.2.4
    if (!options) return std::nullopt;
    out.form = srv::TargetForm::asterisk;
    out.target = "*";
    return out;
  }
  std::string_view rest = raw;
  if (rest.empty() || rest.front() != '/') {
    // absolute-form (§3.2.2): scheme "://" authority path-abempty [ "?" query ]
    const std::size_t colon = rest.find(':');
    if (colon == std::string_view::npos || colon == 0 || !in(kAlpha, rest[0])) return std::nullopt;
    for (const char c : rest.substr(0, colon)) {
      if (!in(kAlpha, c) && !in(kDigit, c) && !in("+-.", c)) return std::nullopt;
    }
    const std::string_view scheme = rest.substr(0, colon);
    if (rest.substr(colon, 3) != "://") return std::nullopt;
    if (!iequal(scheme, "http") && !iequal(scheme, "https")) return std::nullopt;
    rest.remove_prefix(colon + 3);
    std::size_t end = 0;
    while (end < rest.size() && rest[end] != '/' && rest[end] != '?') ++end;
    const std::string_view authority = rest.substr(0, end);
    if (in(authority, '@')) return std::nullopt;  // userinfo (RFC 9110 §4.2.4)
    if (!valid_authority(authority)) return std::nullopt;
    out.form = srv::TargetForm::absolute;
    for (const char c : authority) out.authority.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c);
    rest.remove_prefix(end);
  }
  const std::size_t q = rest.find('?');
  std::string_view raw_path = rest.substr(0, q);
  const auto path = normalize_component(raw_path.empty() ? std::string_view("/") : raw_path, true);
  if (!path) return std::nullopt;
  out.target = resolve_dots(*path);
  if (out.target.starts_with("//")) return std::nullopt;  // a network-path reference
  if (q != std::string_view::npos) {
    const auto query = normalize_component(rest.substr(q + 1), false);
    if (!query) return std::nullopt;
    out.target += "?" + *query;
  }
  return out;
}

// ------------------------------------------------------------------------ properties
const char* form_name(srv::TargetForm f) {
  switch (f) {
    case srv::TargetForm::origin: return "origin";
    case srv::TargetForm::absolute: return "absolute";
    case srv::TargetForm::asterisk: return "asterisk";
  }
  return "?";
}

// Property 3 on an accepted target.
void check_shape(std::string_view target, std::string_view raw) {
  const std::string where = " in " + printable(target) + " (from " + printable(raw) + ")";
  if (target == "*") return;
  IDEM_CHECK(!target.empty() && target.front() == '/', "not starting with '/'" + where);
  IDEM_CHECK(!target.starts_with("//"), "a path starting with \"//\"" + where);
  for (std::size_t i = 0; i < target.size(); ++i) {
    const auto c = static_cast<unsigned char>(target[i]);
    IDEM_CHECK(c > 0x20 && c < 0x7f && c != '#', "a byte outside visible ASCII, or '#'" + where);
    if (c != '%') continue;
    IDEM_CHECK(i + 2 < target.size() && in(kHexUpper, target[i + 1]) && in(kHexUpper, target[i + 2]),
               "a malformed or lower-case percent-encoding" + where);
    const char decoded = static_cast<char>(hex(target[i + 1]) * 16 + hex(target[i + 2]));
    IDEM_CHECK(!unreserved(decoded), "a percent-encoded unreserved character" + where);
  }
  const std::string_view path = target.substr(0, target.find('?'));
  std::size_t pos = 1;
  while (pos <= path.size()) {
    const std::size_t slash = std::min(path.find('/', pos), path.size());
    const std::string_view seg = path.substr(pos, slash - pos);
    IDEM_CHECK(seg != "." && seg != "..", "a dot segment" + where);
    pos = slash + 1;
  }
}

void run(std::string_view raw, bool options) {
  const srv::NormalizedTarget got = srv::normalize_target(raw, options);
  const std::optional<RefTarget> want = reference(raw, options);
  const std::string what = printable(raw) + (options ? " (OPTIONS)" : "");

  // Property 1.
  IDEM_CHECK(got.ok == want.has_value(),
             what + (got.ok ? ": accepted as " + printable(got.target) + ", the reference refuses it"
                            : ": refused (" + std::string(got.problem) + "), the reference accepts it as " +
                                  printable(want->target)));
  IDEM_CHECK(got.ok == got.problem.empty(), what + ": a refusal needs a reason, an acceptance none");
  if (!got.ok) return;
  IDEM_CHECK(got.form == want->form, what + ": form " + form_name(got.form) + " vs " + form_name(want->form));
  IDEM_CHECK(got.target == want->target, what + ": target " + printable(got.target) + " vs " + printable(want->target));
  IDEM_CHECK(got.authority == want->authority,
             what + ": authority " + printable(got.authority) + " vs " + printable(want->authority));

  // Property 2.
  const srv::NormalizedTarget again = srv::normalize_target(got.target, options);
  IDEM_CHECK(again.ok && again.target == got.target &&
                 again.form == (got.form == srv::TargetForm::asterisk ? srv::TargetForm::asterisk
                                                                      : srv::TargetForm::origin),
             what + ": normalizing " + printable(got.target) + " again gives " +
                 (again.ok ? printable(again.target) : "a refusal: " + std::string(again.problem)));

  // Properties 3 and 4.
  check_shape(got.target, raw);
  if (got.form == srv::TargetForm::absolute) {
    IDEM_CHECK(srv::valid_host_value(got.authority), what + ": authority " + printable(got.authority) + " is no Host value");
  }
}

// Property 5, on any string that starts with '/'.
void run_dots(std::string_view raw) {
  if (raw.empty() || raw.front() != '/') return;
  const std::string once = srv::remove_dot_segments(raw);
  IDEM_CHECK(once == resolve_dots(raw),
             "remove_dot_segments(" + printable(raw) + ") = " + printable(once) + ", the reference: " +
                 printable(resolve_dots(raw)));
  IDEM_CHECK(srv::remove_dot_segments(once) == once, "remove_dot_segments is not idempotent on " + printable(raw));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool options = (data[0] & 1) != 0;
  const std::string_view raw(reinterpret_cast<const char*>(data) + 1, size - 1);
  run(raw, options);
  run_dots(raw.substr(0, raw.find('?')));
  return 0;
}
