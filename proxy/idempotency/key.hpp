#pragma once
// Where a request's idempotency key is, and whether it is a usable one: the key header
// (parse_key), or wherever the route says (read_key: a header, a member of the parsed body,
// a query parameter). Pure code: no I/O.
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idempotency/json.hpp"
#include "settings/settings.hpp"

namespace idem::idempotency {

enum class KeyStatus {
  ok,
  missing,    // no field with that name (read_key: not in the route's place, nor elsewhere)
  invalid,    // empty, too long, several values, not visible ASCII, malformed sf-string,
              // a body member that is not a string, a malformed %-escape in a parameter
  misplaced,  // read_key: not where the route reads it, but in the key header instead
  ambiguous,  // read_key: where the route reads it, and in the key header as well
};

struct KeyParse {
  KeyStatus status = KeyStatus::missing;
  std::string key;     // the key when ok (unquoted)
  std::string reason;  // human-readable why, when invalid (never echoes the key)
};

// `values` holds every field value the request carried under the key header name, in order.
// The key may be bare (abc) or an RFC 8941 sf-string ("abc"); both mean the same key.
// Rules (docs/http.md): exactly one field; after unquoting 1..max_length characters, each
// visible ASCII (0x21-0x7E); a bare value must not contain ',' (it would read as a list);
// a quoted value allows only \" and \\ escapes and no parameters.
KeyParse parse_key(std::span<const std::string_view> values, std::size_t max_length);

// The rules a key obeys wherever it was sent, once unquoted: 1..max_length characters, each
// visible ASCII. `where` names the place in the reasons ("Idempotency-Key", "the body
// member /idempotency_key").
KeyParse check_key(std::string key, std::size_t max_length, std::string_view where);

// key.pointer as segments: a JSON Pointer ("/idempotency_key", RFC 6901 escapes) or, on a
// form body, also a form field path ("meta[key]" is meta, key). Throws
// std::invalid_argument when it names no one member ("", a "*" segment, an empty bracket),
// or when a JSON body is given a form field path.
std::vector<std::string> key_member_segments(std::string_view pointer, settings::BodyFormat format);

// A route's key settings compiled once per configuration.
struct KeySpec {
  // Throws std::invalid_argument (a configuration error) when key.pointer is unusable
  // for a body of `format`.
  static KeySpec compile(const settings::KeySettings& s,
                         settings::BodyFormat format = settings::BodyFormat::json);

  settings::KeySource from = settings::KeySource::header;
  std::string header;                 // the key header (from: header), or the one that must
                                      // not carry a key (from: body, query)
  std::vector<std::string> member;    // from: body
  std::string pointer;                // from: body, as configured (for reasons)
  std::string param;                  // from: query
  std::size_t max_length = 255;
};

// The places read_key looks.
struct KeySources {
  std::span<const std::string_view> header_values;  // every field of spec.header, in order
  std::string_view query;                            // the raw query, without '?'
  const Json* body = nullptr;                        // from: body, the parsed body
};

// The key where `spec` says, refused when it is also (ambiguous) or instead (misplaced) in
// the key header on a body or query route: a client and a backend could each take another
// one, or the client believes it sent a key the sidecar never reads. Key header routes
// read the header alone, exactly as parse_key. A body member must be a string; a query
// parameter must appear once, with valid %-escapes (its value form-decoded).
KeyParse read_key(const KeySpec& spec, const KeySources& in);

}  // namespace idem::idempotency
