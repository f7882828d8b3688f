#pragma once
// Timestamps as text, one format everywhere they leave the process for a program (admin
// API, headers to the backend): RFC 3339, UTC, microseconds — e.g. 2026-11-29T19:10:36.817608Z.
#include <cstdint>
#include <string>

namespace idem {

std::string rfc3339_from_us(std::int64_t epoch_us);

// An HTTP date (RFC 9110 §5.6.7, IMF-fixdate), e.g. "Sun, 06 Nov 1994 08:49:37 GMT", for
// the headers clients read. Whole seconds, rounded down: a client told a key expires at
// this second is never told a moment the key is already gone.
std::string imf_fixdate_from_us(std::int64_t epoch_us);

}  // namespace idem
