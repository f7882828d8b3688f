#pragma once
// JSON string escaping shared by everything that writes JSON by hand (problem documents,
// log lines, stored header lists, configuration values). One implementation, so every
// writer repairs malformed UTF-8 and escapes controls the same way. The fingerprint's
// canonical JSON (idempotency/) follows RFC 8785 instead and has its own writer.
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace idem::text {

// Length of the UTF-8 sequence at s[i] and whether it is well-formed (Unicode Table 3-7:
// no overlongs, surrogates or code points above U+10FFFF). When it is ill-formed, the
// length is that of its maximal subpart, to be replaced by one U+FFFD (at least 1).
std::pair<std::size_t, bool> utf8_sequence(std::string_view s, std::size_t i) noexcept;

// Appends `s` escaped for the inside of a JSON string (no quotes): `"` `\` and controls
// escaped (DEL too), malformed UTF-8 replaced by U+FFFD, and U+2028/U+2029 escaped, which
// are valid JSON but end a line for JavaScript and line-based log shippers.
void append_json_escaped(std::string& out, std::string_view s);

// The same with the surrounding quotes.
void append_json_string(std::string& out, std::string_view s);
std::string json_quote(std::string_view s);

}  // namespace idem::text
