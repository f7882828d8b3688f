#include "common/json_text.hpp"

#include "common/text.hpp"

namespace idem::text {
namespace {

constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD

void append_u_escape(std::string& out, unsigned value) {
  out += "\\u";
  append_hex_digits(out, value, 4);
}

}  // namespace

std::pair<std::size_t, bool> utf8_sequence(std::string_view s, std::size_t i) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {1, true};
  std::size_t need = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xbf;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    need = 1;
  } else if (b0 == 0xe0) {
    need = 2, lo = 0xa0;
  } else if ((b0 >= 0xe1 && b0 <= 0xec) || b0 == 0xee || b0 == 0xef) {
    need = 2;
  } else if (b0 == 0xed) {
    need = 2, hi = 0x9f;
  } else if (b0 == 0xf0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xf1 && b0 <= 0xf3) {
    need = 3;
  } else if (b0 == 0xf4) {
    need = 3, hi = 0x8f;
  } else {
    return {1, false};
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return {k, false};
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return {k, false};
    lo = 0x80;
    hi = 0xbf;
  }
  return {need + 1, true};
}

namespace {

// Printable ASCII other than '"' and '\\' goes out as it is.
constexpr bool plain_json_byte(unsigned char u) noexcept {
  return u >= 0x20 && u < 0x7f && u != '"' && u != '\\';
}

}  // namespace

void append_json_escaped(std::string& out, std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    // Runs of plain bytes (nearly all of a log line's values) are appended whole.
    std::size_t run = i;
    while (run < s.size() && plain_json_byte(static_cast<unsigned char>(s[run]))) ++run;
    if (run != i) {
      out.append(s.data() + i, run - i);
      i = run;
      continue;
    }
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      const auto [len, ok] = utf8_sequence(s, i);
      if (!ok) {
        out += kReplacement;
      } else if (len == 3 && u == 0xe2 && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
                 (static_cast<unsigned char>(s[i + 2]) & 0xfe) == 0xa8) {
        append_u_escape(out, 0x2028u + (static_cast<unsigned char>(s[i + 2]) & 1u));
      } else {
        out.append(s.substr(i, len));
      }
      i += len;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          append_u_escape(out, u);
        } else {
          out += c;
        }
    }
    ++i;
  }
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  append_json_escaped(out, s);
  out += '"';
}

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  append_json_string(out, s);
  return out;
}

}  // namespace idem::text
