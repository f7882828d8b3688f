#include "common/time_text.hpp"

#include <cstdio>
#include <ctime>

namespace idem {
namespace {

// Writes `value` as exactly `width` decimal digits, zero-padded, and returns the end.
// Hand-written because snprintf's format parsing cost more than the rest of a protected
// request's header work (two timestamps go to the backend with every forward).
char* put_digits(char* at, long long value, int width) noexcept {
  for (int i = width - 1; i >= 0; --i) {
    at[i] = static_cast<char>('0' + value % 10);
    value /= 10;
  }
  return at + width;
}

struct Utc {
  std::tm tm{};
  long long frac_us = 0;  // 0..999999
};

Utc utc_of(std::int64_t epoch_us) noexcept {
  auto secs = static_cast<std::time_t>(epoch_us / 1'000'000);
  long long frac = epoch_us % 1'000'000;
  if (frac < 0) {
    frac += 1'000'000;
    --secs;
  }
  Utc u;
  gmtime_r(&secs, &u.tm);
  u.frac_us = frac;
  return u;
}

// Years outside 0..9999 do not fit four digits; those (never a real record's) keep the
// general formatting below.
bool four_digit_year(const std::tm& t) noexcept {
  return t.tm_year + 1900 >= 0 && t.tm_year + 1900 <= 9999;
}

}  // namespace

std::string rfc3339_from_us(std::int64_t epoch_us) {
  const Utc u = utc_of(epoch_us);
  const std::tm& t = u.tm;
  char buf[40];
  if (!four_digit_year(t)) {
    const int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ",
                                t.tm_year + 1900, t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min,
                                t.tm_sec, u.frac_us);
    return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  }
  char* p = put_digits(buf, t.tm_year + 1900, 4);
  *p++ = '-';
  p = put_digits(p, t.tm_mon + 1, 2);
  *p++ = '-';
  p = put_digits(p, t.tm_mday, 2);
  *p++ = 'T';
  p = put_digits(p, t.tm_hour, 2);
  *p++ = ':';
  p = put_digits(p, t.tm_min, 2);
  *p++ = ':';
  p = put_digits(p, t.tm_sec, 2);
  *p++ = '.';
  p = put_digits(p, u.frac_us, 6);
  *p++ = 'Z';
  return std::string(buf, p);
}

std::string imf_fixdate_from_us(std::int64_t epoch_us) {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::tm t = utc_of(epoch_us).tm;
  char buf[40];
  if (!four_digit_year(t)) {
    const int n = std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT",
                                kDays[t.tm_wday % 7], t.tm_mday, kMonths[t.tm_mon % 12],
                                t.tm_year + 1900, t.tm_hour, t.tm_min, t.tm_sec);
    return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  }
  char* p = buf;
  for (const char* d = kDays[t.tm_wday % 7]; *d != '\0'; ++d) *p++ = *d;
  *p++ = ',';
  *p++ = ' ';
  p = put_digits(p, t.tm_mday, 2);
  *p++ = ' ';
  for (const char* m = kMonths[t.tm_mon % 12]; *m != '\0'; ++m) *p++ = *m;
  *p++ = ' ';
  p = put_digits(p, t.tm_year + 1900, 4);
  *p++ = ' ';
  p = put_digits(p, t.tm_hour, 2);
  *p++ = ':';
  p = put_digits(p, t.tm_min, 2);
  *p++ = ':';
  p = put_digits(p, t.tm_sec, 2);
  for (const char* g = " GMT"; *g != '\0'; ++g) *p++ = *g;
  return std::string(buf, p);
}

}  // namespace idem
