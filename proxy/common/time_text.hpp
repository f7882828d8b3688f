#pragma once
// Timestamps as text, one format everywhere they leave the process (admin API, headers to
// the backend): RFC 3339, UTC, microseconds — e.g. 2026-11-29T19:10:36.817608Z.
#include <cstdint>
#include <string>

namespace idem {

std::string rfc3339_from_us(std::int64_t epoch_us);

}  // namespace idem
