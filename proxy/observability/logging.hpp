#pragma once
// Logging setup and the access line. Never logs bodies, raw keys or secrets: the access
// record carries only a short hash of tenant and key.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "settings/settings.hpp"

namespace spdlog::sinks {
class sink;
}

namespace idem::obs {

// Configures the default spdlog logger (stderr) with the level and format (json | text).
// Safe to call again on reload.
void setup_logging(const settings::LogSettings& s);
// Same, writing to `sink` instead of stderr (tests capture lines with an ostream sink).
// Replacing the sink replaces the loggers: do that before other threads log.
void setup_logging(const settings::LogSettings& s, std::shared_ptr<spdlog::sinks::sink> sink);

struct AccessRecord {
  std::string_view route;     // "" for unmatched
  std::string_view method;
  std::string_view path;      // path only, query stripped (it may carry secrets)
  std::string_view outcome;   // metrics outcome name
  int status = 0;
  double duration_ms = 0;
  double upstream_ms = -1;    // < 0: no upstream call
  double store_ms = -1;       // < 0: no store call
  std::int64_t attempt = 0;   // 0: none
  std::string_view key_hash;  // log_hash(tenant, key) or ""
  std::string_view code;      // problem code or ""
  bool from_cache = false;    // answered from the replay cache (no store call)
  std::string_view fenced;    // a fenced owner's answer from the record, or ""
  std::string_view trace_id;  // this request's W3C trace id (32 hex digits), or ""
  std::string_view record_trace_id;  // a replay: the trace id stored with the record
};

void log_access(const AccessRecord& r);

// For event-loop threads: like log_access, but when lines go to stderr the line is
// appended to this thread's buffer instead of written at once, and the result says
// whether the buffer was empty before, i.e. whether the caller must arrange for one
// flush_access_log() call on this same thread soon (the gateway posts it to its event
// loop, so the lines of one pass of the loop go out in one write(2)). The buffer is also
// written when it grows past 32 KiB and when the thread exits. Returns false when the
// line was written at once (other sinks, or filtered out).
bool log_access_batched(const AccessRecord& r);
// Writes this thread's buffered access lines, if any.
void flush_access_log() noexcept;

// JSON string escaping used by the json format (exposed for tests): the content between
// the quotes, without the quotes; invalid UTF-8 becomes U+FFFD.
std::string json_escape(std::string_view s);

}  // namespace idem::obs
