// Small pieces of HTTP text handling the fingerprint needs: media types, query strings.
#include <algorithm>
#include <optional>
#include <string>
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

std::string media_type_essence(std::string_view content_type) {
  const std::string_view mt = trim_ows(content_type.substr(0, content_type.find(';')));
  const std::size_t slash = mt.find('/');
  if (slash == std::string_view::npos || !is_token(mt.substr(0, slash)) || !is_token(mt.substr(slash + 1))) {
    return {};
  }
  return text::lowercase(mt);
}

std::optional<std::string> media_type_charset(std::string_view content_type) {
  std::size_t pos = content_type.find(';');
  while (pos != std::string_view::npos) {
    const std::size_t next = content_type.find(';', pos + 1);
    const std::string_view param = trim_ows(content_type.substr(pos + 1, next == std::string_view::npos ? next : next - pos - 1));
    pos = next;
    const std::size_t eq = param.find('=');
    if (eq == std::string_view::npos || !iequals(trim_ows(param.substr(0, eq)), "charset")) continue;
    std::string_view value = trim_ows(param.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    return text::lowercase(value);
  }
  return std::nullopt;
}

namespace {

// RFC 9110 §5.6.4 quoted-string at s[i] ('"' there); advances i past it. qdtext and
// quoted-pair bytes: HTAB, SP, visible ASCII, obs-text.
std::optional<std::string> quoted_string(std::string_view s, std::size_t& i) {
  std::string out;
  for (++i; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"') {
      ++i;
      return out;
    }
    if (c == '\\') {
      if (++i >= s.size()) return std::nullopt;
      const auto e = static_cast<unsigned char>(s[i]);
      if (e != '\t' && (e < 0x20 || e == 0x7f)) return std::nullopt;
      out.push_back(static_cast<char>(e));
      continue;
    }
    if (c != '\t' && (c < 0x20 || c == 0x7f)) return std::nullopt;
    out.push_back(static_cast<char>(c));
  }
  return std::nullopt;  // no closing quote
}

std::size_t token_end(std::string_view s, std::size_t i) {
  while (i < s.size() && is_tchar(s[i])) ++i;
  return i;
}

void skip_ows(std::string_view s, std::size_t& i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
}

}  // namespace

// media-type = type "/" subtype parameters; parameters = *( OWS ";" OWS [ parameter ] );
// parameter = token "=" ( token / quoted-string ). One spelling per media type, so that a
// raw body's fingerprint does not depend on case, spacing, quoting or parameter order, and
// nothing two readers could read differently (a repeated parameter) is accepted.
std::optional<std::string> canonical_media_type(std::string_view ct) {
  std::size_t i = 0;
  skip_ows(ct, i);
  const std::size_t type_end = token_end(ct, i);
  if (type_end == i || type_end >= ct.size() || ct[type_end] != '/') return std::nullopt;
  const std::size_t sub_end = token_end(ct, type_end + 1);
  if (sub_end == type_end + 1) return std::nullopt;
  std::string out = text::lowercase(ct.substr(i, sub_end - i));
  std::vector<std::pair<std::string, std::string>> params;
  i = sub_end;
  for (;;) {
    skip_ows(ct, i);
    if (i == ct.size()) break;
    if (ct[i] != ';') return std::nullopt;
    ++i;
    skip_ows(ct, i);
    if (i == ct.size() || ct[i] == ';') continue;  // an empty parameter
    const std::size_t name_end = token_end(ct, i);
    if (name_end == i || name_end >= ct.size() || ct[name_end] != '=') return std::nullopt;
    std::string name = text::lowercase(ct.substr(i, name_end - i));
    i = name_end + 1;
    std::string value;
    if (i < ct.size() && ct[i] == '"') {
      auto q = quoted_string(ct, i);
      if (!q) return std::nullopt;
      value = std::move(*q);
    } else {
      const std::size_t value_end = token_end(ct, i);
      if (value_end == i) return std::nullopt;
      value = std::string(ct.substr(i, value_end - i));
      i = value_end;
    }
    if (name == "charset") value = text::lowercase(value);
    for (const auto& p : params) {
      if (p.first == name) return std::nullopt;
    }
    params.emplace_back(std::move(name), std::move(value));
  }
  std::sort(params.begin(), params.end());
  for (const auto& [name, value] : params) {
    out += ';';
    out += name;
    out += '=';
    if (is_token(value)) {
      out += value;
    } else {
      out += '"';
      for (const char c : value) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
      }
      out += '"';
    }
  }
  return out;
}

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
