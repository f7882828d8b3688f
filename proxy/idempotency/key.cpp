#include "idempotency/key.hpp"

#include "idempotency/internal.hpp"

namespace idem::idempotency {

namespace {

KeyParse invalid(std::string reason) {
  KeyParse r;
  r.status = KeyStatus::invalid;
  r.reason = std::move(reason);
  return r;
}

bool visible_ascii(char c) noexcept {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x21 && u <= 0x7E;
}

// Unquotes an RFC 8941 sf-string. Only the two escapes the RFC defines are accepted,
// and nothing may follow the closing quote: parameters (";a=1") or a second list member
// would make the key's meaning depend on how much of the field a reader looks at.
// Returns false with *why set on malformed input.
bool unquote(std::string_view v, std::string& out, const char** why) {
  // v[0] is the opening quote.
  for (std::size_t i = 1; i < v.size(); ++i) {
    const char c = v[i];
    if (c == '\\') {
      if (i + 1 >= v.size() || (v[i + 1] != '"' && v[i + 1] != '\\')) {
        *why = "quoted key has an escape other than \\\" or \\\\";
        return false;
      }
      out.push_back(v[++i]);
    } else if (c == '"') {
      if (i + 1 != v.size()) {
        *why = "quoted key is followed by other characters (parameters or a list)";
        return false;
      }
      return true;
    } else {
      out.push_back(c);
    }
  }
  *why = "quoted key has no closing quote";
  return false;
}

}  // namespace

KeyParse parse_key(std::span<const std::string_view> values, std::size_t max_length) {
  if (values.empty()) return {};  // missing
  // Two field lines could be two keys; picking one would let a client and the proxy
  // disagree about which operation a request belongs to.
  if (values.size() > 1) return invalid("several Idempotency-Key values");

  const std::string_view v = detail::trim_ows(values.front());
  if (v.empty()) return invalid("empty Idempotency-Key");

  std::string key;
  if (v.front() == '"') {
    const char* why = nullptr;
    key.reserve(v.size());
    if (!unquote(v, key, &why)) return invalid(why);
    if (key.empty()) return invalid("empty Idempotency-Key");
  } else {
    // A bare "a, b" is how an intermediary folds two field lines into one: refuse it
    // rather than guess. Inside quotes a comma is unambiguous and allowed.
    if (v.find(',') != std::string_view::npos) {
      return invalid("Idempotency-Key contains ',' (reads as several values)");
    }
    key.assign(v);
  }

  // Checked after unquoting so "a b" is refused however it is written: keys end up in
  // logs hashes, SQL parameters and upstream headers, where invisible or non-ASCII
  // characters invite confusion.
  for (const char c : key) {
    if (!visible_ascii(c)) {
      return invalid("Idempotency-Key has a character outside visible ASCII (0x21-0x7E)");
    }
  }
  if (key.size() > max_length) {
    return invalid("Idempotency-Key longer than " + std::to_string(max_length) + " characters");
  }

  KeyParse r;
  r.status = KeyStatus::ok;
  r.key = std::move(key);
  return r;
}

}  // namespace idem::idempotency
