// Small pieces of HTTP text handling the fingerprint needs: media types, query strings.
#include <algorithm>
#include <utility>
#include <vector>

#include "idempotency/internal.hpp"

namespace idem::idempotency::detail {

namespace {

using text::iequals;

// RFC 9110 tchar: media type and subtype are tokens.
bool is_tchar(char c) noexcept {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_token(std::string_view s) noexcept {
  return !s.empty() && std::all_of(s.begin(), s.end(), is_tchar);
}

// application/x-www-form-urlencoded decoding: '+' is a space, %XX a byte. A '%' that
// does not start a valid escape is kept as a literal '%' (as WHATWG URL parsing does),
// so a sloppy client still gets a stable canonical form instead of a hard failure.
std::string form_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (const int byte = text::percent_byte(s, i); byte >= 0) {
      out.push_back(static_cast<char>(byte));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// RFC 3986 unreserved characters stay literal; every other byte becomes %XX (upper
// case). One spelling per byte string, whatever escaping the client chose.
using text::append_uri_component;

}  // namespace

bool is_json_media_type(std::string_view content_type) noexcept {
  std::string_view mt = content_type.substr(0, content_type.find(';'));
  mt = trim_ows(mt);
  const std::size_t slash = mt.find('/');
  if (slash == std::string_view::npos) return false;
  const std::string_view type = mt.substr(0, slash);
  const std::string_view subtype = mt.substr(slash + 1);
  if (!is_token(type) || !is_token(subtype) || !iequals(type, "application")) return false;
  // Structured syntax suffix (RFC 6839): application/problem+json, application/vnd.x+json.
  // A bare "+json" has no actual subtype and is not a media type anyone registers.
  return iequals(subtype, "json") || (subtype.size() > 5 && text::iends_with(subtype, "+json"));
}

namespace {

// The query's parameters as canonical_query reads them: split on '&', empty parts dropped,
// name and value split at the first '=', each form-decoded. `malformed` (when asked for)
// says, per parameter, whether its raw value has a '%' that starts no valid escape.
std::vector<std::pair<std::string, std::string>> query_params(std::string_view raw,
                                                               std::vector<bool>* malformed = nullptr) {
  std::vector<std::pair<std::string, std::string>> params;
  std::size_t pos = 0;
  while (pos <= raw.size()) {
    std::size_t amp = raw.find('&', pos);
    if (amp == std::string_view::npos) amp = raw.size();
    const std::string_view part = raw.substr(pos, amp - pos);
    pos = amp + 1;
    if (part.empty()) continue;
    const std::size_t eq = part.find('=');
    const std::string_view value = eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1);
    params.emplace_back(form_decode(part.substr(0, eq)), form_decode(value));
    if (malformed != nullptr) {
      bool bad = false;
      for (std::size_t i = 0; i < value.size() && !bad; ++i) {
        bad = value[i] == '%' && text::percent_byte(value, i) < 0;
      }
      malformed->push_back(bad);
    }
  }
  return params;
}

std::string join_canonical(std::vector<std::pair<std::string, std::string>> params) {
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [name, value] : params) {
    if (!out.empty()) out.push_back('&');
    append_uri_component(out, name);
    out.push_back('=');
    append_uri_component(out, value);
  }
  return out;
}

}  // namespace

// Canonical query string. Rules, chosen so that spellings a form-decoding backend reads
// identically collapse, and nothing it reads differently does:
//   - split on '&', drop empty parts (a&&b == a&b, trailing '&' ignored);
//   - name/value split at the first '='; "a" and "a=" are the same (empty value), as in
//     form decoding;
//   - decode with form rules ('+' is a space, %XX a byte, a malformed '%' stays literal);
//   - re-encode: unreserved characters literal, every other byte %XX upper case (so a
//     space is always %20 and a literal plus always %2B);
//   - sort by (decoded name, decoded value) bytewise; join as name=value with '&'.
// Repeated names are kept (a=1&a=1 differs from a=1). Sorting means a=2&a=1 equals
// a=1&a=2: a backend that treats repeated parameters as an ordered list would see a
// difference we do not. That trade-off is accepted because the usual query on a
// mutating route is a flag set, where order is noise.
std::string canonical_query(std::string_view raw) { return join_canonical(query_params(raw)); }

std::string canonical_query(std::string_view raw, std::string_view excluded) {
  auto params = query_params(raw);
  std::erase_if(params, [&](const auto& p) { return p.first == excluded; });
  return join_canonical(std::move(params));
}

QueryValues query_values(std::string_view raw, std::string_view name) {
  std::vector<bool> malformed;
  QueryValues out;
  auto params = query_params(raw, &malformed);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].first != name) continue;
    out.values.push_back(std::move(params[i].second));
    out.malformed = out.malformed || malformed[i];
  }
  return out;
}

}  // namespace idem::idempotency::detail
