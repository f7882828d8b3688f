#pragma once
// Small ASCII and hex helpers that every component needs: case-insensitive comparison
// (HTTP field names, schemes, media types), HTTP optional whitespace, hex digits in both
// directions and percent-encoded bytes. One implementation, so no component lowercases
// with the C locale and another by hand, or accepts "%4g" where the rest refuses it.
//
// Everything here is locale-independent ASCII: bytes >= 0x80 are never letters or digits.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace idem::text {

// ------------------------------------------------------------------------ ASCII case

constexpr char ascii_lower(char c) noexcept {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}
constexpr char ascii_upper(char c) noexcept {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
}

// Equal but for ASCII letter case (as HTTP compares field names and tokens).
bool iequals(std::string_view a, std::string_view b) noexcept;
bool istarts_with(std::string_view s, std::string_view prefix) noexcept;
bool iends_with(std::string_view s, std::string_view suffix) noexcept;

std::string lowercase(std::string_view s);
std::string uppercase(std::string_view s);

// -------------------------------------------------------------------------- trimming

// `s` without the characters of `chars` at either end (or at its end only).
std::string_view trim(std::string_view s, std::string_view chars) noexcept;
std::string_view trim_end(std::string_view s, std::string_view chars) noexcept;

// HTTP optional whitespace (SP, HTAB) removed from both ends (RFC 9110 §5.6.3).
inline std::string_view trim_ows(std::string_view s) noexcept { return trim(s, " \t"); }

// ------------------------------------------------------------------------------- hex

enum class HexCase { lower, upper };

// The value of one hex digit (either case), or -1.
constexpr int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The digit for a value 0..15.
constexpr char hex_digit(unsigned v, HexCase c = HexCase::lower) noexcept {
  return (c == HexCase::lower ? "0123456789abcdef" : "0123456789ABCDEF")[v & 0xfu];
}

// Two digits a byte, in order.
void append_hex(std::string& out, std::string_view bytes, HexCase c = HexCase::lower);
std::string to_hex(std::string_view bytes, HexCase c = HexCase::lower);
std::string to_hex(const unsigned char* data, std::size_t n, HexCase c = HexCase::lower);

// `value` as exactly `digits` hex digits, most significant first (for \uXXXX, \xXX).
void append_hex_digits(std::string& out, unsigned value, int digits, HexCase c = HexCase::lower);

// The bytes of an even-length string of hex digits (either case); nullopt otherwise.
std::optional<std::string> from_hex(std::string_view hex);

// True when every character is a lower-case hex digit (and there is at least one).
bool is_lower_hex(std::string_view s) noexcept;

// ------------------------------------------------------------------ percent-encoding

// RFC 3986 §2.3 unreserved characters: the ones no URI component ever needs to escape.
constexpr bool is_unreserved(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

// The byte that the "%XX" at s[i] stands for, or -1 when s[i] does not start a complete,
// valid escape.
int percent_byte(std::string_view s, std::size_t i) noexcept;

// Appends "%XX" for `byte`, with upper-case digits as RFC 3986 §2.1 recommends.
void append_percent_encoded(std::string& out, unsigned char byte);

// Appends `s` with every byte but the unreserved ones percent-encoded: one spelling per
// byte string, safe in any URI component.
void append_uri_component(std::string& out, std::string_view s);

}  // namespace idem::text
