// database.url checked at load, the way libpq will read it when the pool connects. A value
// libpq refuses would otherwise pass check-config and a reload, and fail only at the first
// connection (a reload would then leave the store unusable, not be refused); and the
// renderer's masking, which stops at the first text it cannot read as a pair, would print a
// conninfo that does not load again (fuzzing finding 7, docs/fuzzing.md).
//
// libpq's own error text is never passed on: it quotes the offending word ("missing "="
// after "..."", "invalid percent-encoded token: "...""), and that word may be the password.
// For conninfo, the reason is found by a reading of the same grammar that names positions
// only; for a URI, libpq's rules are too many to restate, so the reason is generic.
#include <libpq-fe.h>

#include <memory>
#include <set>
#include <string>

#include "settings/detail.hpp"

namespace idem::settings::detail {

namespace {

bool conninfo_space(char c) {
  // libpq uses isspace() in the C locale.
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string nth(std::size_t n) {
  const auto tens = n % 100;
  const char* suffix = "th";
  if (tens < 11 || tens > 13) {
    switch (n % 10) {
      case 1: suffix = "st"; break;
      case 2: suffix = "nd"; break;
      case 3: suffix = "rd"; break;
      default: break;
    }
  }
  return std::to_string(n) + suffix;
}

// The keywords the linked libpq knows: PQconninfoParse("") lists them all (unlike
// PQconndefaults, it reads no environment variable and no service file).
std::set<std::string> libpq_keywords() {
  std::set<std::string> out;
  char* err = nullptr;
  std::unique_ptr<PQconninfoOption, void (*)(PQconninfoOption*)> opts(PQconninfoParse("", &err),
                                                                       PQconninfoFree);
  if (err != nullptr) PQfreemem(err);
  for (auto* o = opts.get(); o != nullptr && o->keyword != nullptr; ++o) out.insert(o->keyword);
  return out;
}

// Why libpq refused a conninfo string (conninfo_parse in libpq's fe-connect.c reads
// whitespace-separated "key = value" pairs; a value is bare up to whitespace or
// single-quoted, with backslash escaping the next byte in both). Positions only.
std::string conninfo_reason(std::string_view s) {
  const auto keywords = libpq_keywords();
  std::size_t i = 0;
  for (std::size_t pair = 1;; ++pair) {
    while (i < s.size() && conninfo_space(s[i])) ++i;
    if (i >= s.size()) break;
    const auto key_start = i;
    while (i < s.size() && s[i] != '=' && !conninfo_space(s[i])) ++i;
    const auto key = s.substr(key_start, i - key_start);
    while (i < s.size() && conninfo_space(s[i])) ++i;
    if (i >= s.size() || s[i] != '=') {
      return "the " + nth(pair) + " word is not a key = value pair";
    }
    if (key.empty()) return "the " + nth(pair) + " pair has no parameter name before '='";
    ++i;
    while (i < s.size() && conninfo_space(s[i])) ++i;
    if (i < s.size() && s[i] == '\'') {
      for (++i; i < s.size() && s[i] != '\''; ++i) {
        if (s[i] == '\\') ++i;
      }
      if (i >= s.size()) return "the value of the " + nth(pair) + " pair has no closing quote";
      ++i;
    } else {
      for (; i < s.size() && !conninfo_space(s[i]); ++i) {
        if (s[i] == '\\') ++i;
      }
    }
    if (keywords.count(std::string(key)) == 0) {
      return "the " + nth(pair) + " pair names a parameter libpq does not know";
    }
  }
  return "libpq refused it";
}

}  // namespace

std::optional<std::string> database_url_problem(const std::string& url) {
  // libpq reads a C string: whatever follows a NUL (a "\0" in YAML) would be dropped
  // silently, part of a password included.
  if (url.find('\0') != std::string::npos) return "it contains a NUL byte";
  char* err = nullptr;
  // Parses only: no connection, no environment, no service file.
  PQconninfoOption* opts = PQconninfoParse(url.c_str(), &err);
  if (err != nullptr) PQfreemem(err);  // never shown, see above
  if (opts != nullptr) {
    PQconninfoFree(opts);
    return std::nullopt;
  }
  const bool uri = url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0;
  std::string reason =
      uri ? "libpq refused the URI (postgresql://[user[:password]@][host][:port][/dbname]"
            "[?param=value&...], with reserved characters percent-encoded)"
          : conninfo_reason(url) +
                " (conninfo is key = value pairs separated by spaces, such as host=db "
                "dbname=orders; quote a value with spaces as 'a b')";
  return reason + "; the text is not shown, it may hold the password";
}

}  // namespace idem::settings::detail
