#pragma once
// Property checks for the fuzz targets. A violated property aborts, so libFuzzer saves the
// input as a crash artifact exactly as it would for a sanitizer report; the message names
// the property, never just "assertion failed".
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace idem::fuzz {

// Printable rendering of arbitrary bytes for failure messages (C-style escapes, capped).
inline std::string printable(std::string_view s, std::size_t cap = 400) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < cap; ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u == '\\') {
      out += "\\\\";
    } else if (u >= 0x20 && u < 0x7f) {
      out.push_back(static_cast<char>(u));
    } else {
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xF]);
    }
  }
  if (s.size() > cap) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

[[noreturn]] inline void property_failed(const char* expr, const std::string& detail,
                                         const char* file, int line) {
  std::fprintf(stderr, "\n=== PROPERTY VIOLATED at %s:%d\n  %s\n%s%s\n", file, line, expr,
               detail.empty() ? "" : "  ", detail.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace idem::fuzz

// IDEM_CHECK(condition, detail): detail is any expression yielding a std::string; it is
// only evaluated when the check fails.
#define IDEM_CHECK(cond, detail)                                                    \
  do {                                                                              \
    if (!(cond)) ::idem::fuzz::property_failed(#cond, (detail), __FILE__, __LINE__); \
  } while (0)
