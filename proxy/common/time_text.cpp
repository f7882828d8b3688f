#include "common/time_text.hpp"

#include <cstdio>
#include <ctime>

namespace idem {

std::string rfc3339_from_us(std::int64_t epoch_us) {
  auto secs = static_cast<std::time_t>(epoch_us / 1'000'000);
  auto frac = epoch_us % 1'000'000;
  if (frac < 0) {
    frac += 1'000'000;
    --secs;
  }
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char buf[40];
  const int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ",
                              utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour,
                              utc.tm_min, utc.tm_sec, static_cast<long long>(frac));
  return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
}

std::string imf_fixdate_from_us(std::int64_t epoch_us) {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  auto secs = static_cast<std::time_t>(epoch_us / 1'000'000);
  if (epoch_us % 1'000'000 < 0) --secs;
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char buf[40];
  const int n = std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT",
                              kDays[utc.tm_wday % 7], utc.tm_mday, kMonths[utc.tm_mon % 12],
                              utc.tm_year + 1900, utc.tm_hour, utc.tm_min, utc.tm_sec);
  return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
}

}  // namespace idem
