#include "common/text.hpp"

#include <algorithm>

namespace idem::text {

bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return ascii_lower(x) == ascii_lower(y);
         });
}

bool istarts_with(std::string_view s, std::string_view prefix) noexcept {
  return s.size() >= prefix.size() && iequals(s.substr(0, prefix.size()), prefix);
}

bool iends_with(std::string_view s, std::string_view suffix) noexcept {
  return s.size() >= suffix.size() && iequals(s.substr(s.size() - suffix.size()), suffix);
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), ascii_lower);
  return out;
}

std::string uppercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), ascii_upper);
  return out;
}

std::string_view trim(std::string_view s, std::string_view chars) noexcept {
  const auto first = s.find_first_not_of(chars);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(chars) - first + 1);
}

std::string_view trim_end(std::string_view s, std::string_view chars) noexcept {
  const auto last = s.find_last_not_of(chars);
  return last == std::string_view::npos ? std::string_view() : s.substr(0, last + 1);
}

// Sized once and written by index: push_back's capacity check per digit cost more than
// the digits themselves (four digests a protected request).
void append_hex(std::string& out, std::string_view bytes, HexCase c) {
  const std::size_t at = out.size();
  out.resize(at + bytes.size() * 2);
  char* d = out.data() + at;
  for (const char ch : bytes) {
    const auto b = static_cast<unsigned char>(ch);
    *d++ = hex_digit(b >> 4, c);
    *d++ = hex_digit(b, c);
  }
}

std::string to_hex(std::string_view bytes, HexCase c) {
  std::string out;
  append_hex(out, bytes, c);
  return out;
}

std::string to_hex(const unsigned char* data, std::size_t n, HexCase c) {
  return to_hex(std::string_view(reinterpret_cast<const char*>(data), n), c);
}

void append_hex_digits(std::string& out, unsigned value, int digits, HexCase c) {
  for (int shift = (digits - 1) * 4; shift >= 0; shift -= 4) out.push_back(hex_digit(value >> shift, c));
}

std::optional<std::string> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = hex_value(hex[i]);
    const int lo = hex_value(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>((hi << 4) | lo));
  }
  return out;
}

bool is_lower_hex(std::string_view s) noexcept {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

int percent_byte(std::string_view s, std::size_t i) noexcept {
  if (i + 2 >= s.size() || s[i] != '%') return -1;
  const int hi = hex_value(s[i + 1]);
  const int lo = hex_value(s[i + 2]);
  return hi < 0 || lo < 0 ? -1 : (hi << 4) | lo;
}

void append_percent_encoded(std::string& out, unsigned char byte) {
  out.push_back('%');
  out.push_back(hex_digit(byte >> 4, HexCase::upper));
  out.push_back(hex_digit(byte, HexCase::upper));
}

void append_uri_component(std::string& out, std::string_view s) {
  for (const char c : s) {
    if (is_unreserved(c)) {
      out.push_back(c);
    } else {
      append_percent_encoded(out, static_cast<unsigned char>(c));
    }
  }
}

}  // namespace idem::text
