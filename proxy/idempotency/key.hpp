#pragma once
// Idempotency-Key header parsing. Pure code: no I/O.
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace idem::idempotency {

enum class KeyStatus {
  ok,
  missing,  // no field with that name
  invalid,  // empty, too long, several values, not visible ASCII, malformed sf-string
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

}  // namespace idem::idempotency
