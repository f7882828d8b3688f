#include "idempotency/key.hpp"

#include <optional>
#include <stdexcept>

#include "idempotency/form.hpp"
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

  return check_key(std::move(key), max_length, "Idempotency-Key");
}

KeyParse check_key(std::string key, std::size_t max_length, std::string_view where) {
  if (key.empty()) return invalid("empty " + std::string(where));
  // Checked after unquoting so "a b" is refused however it is written: keys end up in
  // logs hashes, SQL parameters and upstream headers, where invisible or non-ASCII
  // characters invite confusion.
  for (const char c : key) {
    if (!visible_ascii(c)) {
      return invalid(std::string(where) + " has a character outside visible ASCII (0x21-0x7E)");
    }
  }
  if (key.size() > max_length) {
    return invalid(std::string(where) + " longer than " + std::to_string(max_length) + " characters");
  }

  KeyParse r;
  r.status = KeyStatus::ok;
  r.key = std::move(key);
  return r;
}

std::vector<std::string> key_member_segments(std::string_view pointer, settings::BodyFormat format) {
  std::string why;
  if (format == settings::BodyFormat::form && !pointer.empty() && pointer.front() != '/') {
    auto path = form_field_path(pointer);
    if (!path) {
      throw std::invalid_argument("key.pointer \"" + std::string(pointer) +
                                  "\": not a form field path naming one value (name[key]...)");
    }
    return std::move(*path);
  }
  if (pointer.empty() || pointer.front() != '/') {
    throw std::invalid_argument("key.pointer \"" + std::string(pointer) +
                                "\": a JSON body names its key member by a JSON Pointer, e.g. "
                                "\"/idempotency_key\"");
  }
  auto segments = detail::parse_pointer(pointer, &why);
  if (!segments) throw std::invalid_argument("key.pointer \"" + std::string(pointer) + "\": " + why);
  for (const auto& seg : *segments) {
    // '*' is "every element" in the fingerprint's pointers; a key is one value.
    if (seg == "*") throw std::invalid_argument("key.pointer \"" + std::string(pointer) + "\": a key is one member, not '*'");
  }
  return std::move(*segments);
}

KeySpec KeySpec::compile(const settings::KeySettings& s, settings::BodyFormat format) {
  KeySpec spec;
  spec.from = s.from;
  spec.header = s.header;
  spec.max_length = s.max_length;
  spec.param = s.param;
  if (s.from == settings::KeySource::body) {
    if (format == settings::BodyFormat::raw) {
      throw std::invalid_argument("key.from: body needs a body with members; fingerprint.format: raw has none");
    }
    spec.member = key_member_segments(s.pointer, format);
    spec.pointer = s.pointer;
  }
  return spec;
}

namespace {

// Where the route reads the key, in words for reasons (configuration, never the key).
std::string place(const KeySpec& spec) {
  if (spec.from == settings::KeySource::body) return "the body member " + spec.pointer;
  return "the query parameter " + spec.param;
}

KeyParse placement(KeyStatus status, std::string reason) {
  KeyParse r;
  r.status = status;
  r.reason = std::move(reason);
  return r;
}

// The key's value at the route's place: nullopt when it is not there; a refusal when it is
// there but unusable.
std::optional<KeyParse> read_at_place(const KeySpec& spec, const KeySources& in) {
  if (spec.from == settings::KeySource::body) {
    const Json* v = in.body == nullptr ? nullptr : detail::find_pointer(*in.body, spec.member);
    if (v == nullptr) return std::nullopt;
    const auto* text = std::get_if<std::string>(&v->value());
    if (text == nullptr) return invalid(place(spec) + " must be a string");
    return check_key(*text, spec.max_length, place(spec));
  }
  const auto found = detail::query_values(in.query, spec.param);
  if (found.values.empty()) return std::nullopt;
  // Two parameters could be two keys; a backend might take either.
  if (found.values.size() > 1) return invalid("several values of " + place(spec));
  if (found.malformed) return invalid(place(spec) + " has a '%' that starts no valid escape");
  return check_key(found.values.front(), spec.max_length, place(spec));
}

}  // namespace

KeyParse read_key(const KeySpec& spec, const KeySources& in) {
  if (spec.from == settings::KeySource::header) return parse_key(in.header_values, spec.max_length);
  auto at_place = read_at_place(spec, in);
  const bool in_header = !in.header_values.empty();
  if (at_place && in_header) {
    return placement(KeyStatus::ambiguous, "the idempotency key was sent both in " + place(spec) +
                                                " and in the " + spec.header + " header; send it once, in " +
                                                place(spec));
  }
  if (in_header) {
    return placement(KeyStatus::misplaced, "this route reads the idempotency key from " + place(spec) +
                                                ", not from the " + spec.header + " header");
  }
  if (!at_place) return placement(KeyStatus::missing, "this route requires the idempotency key in " + place(spec));
  return std::move(*at_place);
}

}  // namespace idem::idempotency
