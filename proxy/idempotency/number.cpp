// Exact canonicalization of JSON numbers.
//
// Why not RFC 8785's number rule: it serializes the nearest IEEE double, so
// 12345678901234567890123 and 12345678901234567890124 would share a fingerprint while a
// backend using decimals (most order APIs: money) sees two different amounts. We keep
// every digit instead and only remove what cannot matter: sign of zero, leading zeros,
// trailing zeros and the choice of where the decimal point and exponent go.
//
// The canonical form. Write the value as  (-)0.D x 10^n  where D is the significant
// digit string (no leading or trailing zeros, k = |D| digits) and n the position of the
// decimal point. Then, exactly like ECMAScript's Number::toString lays out digits:
//   k <= n <= 21      D followed by n-k zeros            1000, 100000000000000000000
//   0 < n <= 21       D with a '.' after n digits        1.5, 1234.5678
//   -6 < n <= 0       "0." then -n zeros then D          0.1, 0.000001
//   otherwise         d[.ddd]e(+|-)X with X = |n-1|     1e+21, 1.2345678901234567890123e+22, 1e-7
// zero is "0" and a negative value is "-" followed by the form of its magnitude.
// Every output is a plain decimal reading of the value, so two different values can
// never produce the same text (the form is injective), and for numbers whose digits are
// what a double would print, the text matches RFC 8785's.
#include <cstdint>
#include <cstdlib>

#include "idempotency/internal.hpp"

namespace idem::idempotency::detail {

namespace {

bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

// Beyond this the value is astronomically far from anything a backend could store, and
// bounding it keeps every position computation far from int64 overflow. Boost.JSON
// already refuses exponents beyond INT_MAX; this is the same idea, stated here. It bounds
// both the exponent as written and the value's own (scientific) exponent: bounding only the
// written one would accept 10e1000000000 but refuse 1e1000000001, the same value and its
// canonical form (found by fuzz/json).
constexpr std::int64_t kMaxExponent = 1'000'000'000;

}  // namespace

// Why one function of ~80 lines: the scan of the grammar and the digits' positions it
// fills in are used by the normalization right after; split, the pieces would share half a
// dozen out-parameters, which is harder to check against RFC 8785 than one pass.
std::optional<std::string> canonical_number(std::string_view s) {
  std::size_t i = 0;
  const bool negative = i < s.size() && s[i] == '-';
  if (negative) ++i;

  // int = zero / digit1-9 *DIGIT
  const std::size_t int_begin = i;
  if (i >= s.size() || !is_digit(s[i])) return std::nullopt;
  if (s[i] == '0') {
    ++i;
  } else {
    while (i < s.size() && is_digit(s[i])) ++i;
  }
  const std::string_view int_part = s.substr(int_begin, i - int_begin);

  std::string_view frac_part;
  if (i < s.size() && s[i] == '.') {
    const std::size_t b = ++i;
    while (i < s.size() && is_digit(s[i])) ++i;
    if (i == b) return std::nullopt;
    frac_part = s.substr(b, i - b);
  }

  std::int64_t exponent = 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool exp_negative = false;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) exp_negative = s[i++] == '-';
    const std::size_t b = i;
    while (i < s.size() && is_digit(s[i])) {
      exponent = exponent * 10 + (s[i] - '0');
      if (exponent > kMaxExponent) return std::nullopt;
      ++i;
    }
    if (i == b) return std::nullopt;
    if (exp_negative) exponent = -exponent;
  }
  if (i != s.size()) return std::nullopt;

  // All digits as one string; the value is digits x 10^(exponent - |frac|).
  std::string digits;
  digits.reserve(int_part.size() + frac_part.size());
  digits.append(int_part).append(frac_part);
  std::int64_t scale = exponent - static_cast<std::int64_t>(frac_part.size());

  const std::size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return std::string("0");  // -0 == 0
  const std::size_t last = digits.find_last_not_of('0');
  scale += static_cast<std::int64_t>(digits.size() - 1 - last);
  const std::string_view d = std::string_view(digits).substr(first, last - first + 1);

  const auto k = static_cast<std::int64_t>(d.size());
  const std::int64_t n = k + scale;
  // The value is d.ddd x 10^(n-1): the exponent its canonical form writes.
  if (n - 1 > kMaxExponent || n - 1 < -kMaxExponent) return std::nullopt;

  std::string out;
  if (negative) out.push_back('-');
  if (k <= n && n <= 21) {
    out.append(d);
    out.append(static_cast<std::size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out.append(d.substr(0, static_cast<std::size_t>(n)));
    out.push_back('.');
    out.append(d.substr(static_cast<std::size_t>(n)));
  } else if (-6 < n && n <= 0) {
    out.append("0.");
    out.append(static_cast<std::size_t>(-n), '0');
    out.append(d);
  } else {
    out.push_back(d.front());
    if (k > 1) {
      out.push_back('.');
      out.append(d.substr(1));
    }
    const std::int64_t e = n - 1;
    out.push_back('e');
    out.push_back(e < 0 ? '-' : '+');
    out.append(std::to_string(e < 0 ? -e : e));
  }
  return out;
}

}  // namespace idem::idempotency::detail
