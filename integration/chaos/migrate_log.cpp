#include "migrate_log.hpp"

#include <time.h>

#include <cstdio>
#include <sstream>

namespace idem::chaos {

// "2026-12-03T07:32:06.254188Z" -> microseconds since the epoch; -1 if it is not one.
std::int64_t parse_rfc3339_us(std::string_view s) {
  if (s.size() < 20 || s[4] != '-' || s[10] != 'T' || s.back() != 'Z') return -1;
  struct tm tm{};
  int micros = 0;
  if (std::sscanf(std::string(s).c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%6dZ", &tm.tm_year, &tm.tm_mon,
                  &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &micros) != 7) {
    return -1;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<std::int64_t>(timegm(&tm)) * 1'000'000 + micros;
}

// The migrator's lines (`idemproxy migrate`, app/commands.cpp):
//   <time> 0003_fencing_tokens step 2/5 started: backfill idempotency_requests, ...
//   <time> 0003_fencing_tokens step 2/5 done in 12.345 s
std::vector<StepWindow> parse_migrate_output(const std::string& text) {
  std::vector<StepWindow> steps;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto sp = line.find(' ');
    if (sp == std::string::npos) continue;
    const auto at = parse_rfc3339_us(std::string_view(line).substr(0, sp));
    if (at < 0) continue;
    const std::string rest = line.substr(sp + 1);
    const auto started = rest.find(" started: ");
    if (started != std::string::npos && rest.find(" step ") != std::string::npos) {
      steps.push_back({rest.substr(0, started), rest.substr(started + 10), at, -1});
      continue;
    }
    const auto done = rest.find(" done in ");
    if (done != std::string::npos) {
      const std::string name = rest.substr(0, done);
      for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        if (it->name == name && it->end_us < 0) {
          it->end_us = at;
          break;
        }
      }
    }
  }
  return steps;
}

}  // namespace idem::chaos
