#pragma once
// The timed lines of `idemproxy migrate` (app/commands.cpp) read back: when each step of
// each migration ran, so the upgrade run can attribute claim waits to steps. Pure.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace idem::chaos {

// A migration step as the migrator reported it (wall clock, microseconds since the epoch;
// end_us -1 when the step never finished).
struct StepWindow {
  std::string name;  // "0003_fencing_tokens step 2/5"
  std::string what;  // "backfill idempotency_requests, 256 pages per batch"
  std::int64_t start_us = 0;
  std::int64_t end_us = -1;
};

std::vector<StepWindow> parse_migrate_output(const std::string& text);

// "2026-12-03T07:32:06.254188Z" -> microseconds since the epoch; -1 if it is not one.
std::int64_t parse_rfc3339_us(std::string_view s);

}  // namespace idem::chaos
