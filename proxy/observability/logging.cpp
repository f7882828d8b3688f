// Log lines: one JSON object per line (for collectors) or key=value text (for people).
//
// spdlog keeps one formatter per sink, and the access logger shares the stderr sink with the
// default logger, so a single formatter serves both. It tells an access line by its logger
// name and payload marker. The access payload is not JSON or text but a neutral encoding of
// typed fields that the formatter renders: the format is decided in one place, and a reload
// that switches formats can never wrap a JSON body in a text line.
//
// On the process's stderr, access lines skip spdlog: log_access builds the finished line
// with the same code (append_access_line) and writes it with one write(2), without the
// console lock that would otherwise serialize every worker's requests (see log_access).
#include "observability/logging.hpp"

#include <spdlog/formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <chrono>
#include <cmath>
#include <ctime>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "common/json_text.hpp"
#include "common/text.hpp"

namespace idem::obs {

namespace {

constexpr std::string_view kAccessLogger = "access";
constexpr std::string_view kMainLogger = "idemproxy";
// Starts every encoded access payload; a control character no caller puts first in a message.
constexpr char kAccessMarker = '\x1e';
constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD

using text::utf8_sequence;

using text::append_json_escaped;

// Free text in the text format: readable as is, but a newline or an escape sequence from a
// request can never forge a second log line or drive the terminal.
void append_text_sanitized(std::string& out, std::string_view s, bool quoted) {
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      const auto [len, ok] = utf8_sequence(s, i);
      if (ok) {
        out.append(s.substr(i, len));
      } else {
        out += kReplacement;
      }
      i += len;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      text::append_hex_digits(out, u, 2);
    } else if (quoted && (c == '"' || c == '\\')) {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
    ++i;
  }
}

// logfmt value: bare when unambiguous, quoted otherwise.
void append_logfmt_value(std::string& out, std::string_view v) {
  const bool bare = !v.empty() && std::all_of(v.begin(), v.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7f && c != '"' && c != '=' && c != '\\';
  });
  if (bare) {
    out += v;
    return;
  }
  out += '"';
  append_text_sanitized(out, v, true);
  out += '"';
}

// --- access fields --------------------------------------------------------------------

struct Field {
  std::string_view name;
  char type;  // 's' string, 'n' number (already formatted as a JSON number)
  std::string_view value;
};

// type, name, '=', decimal length, ':', value; repeated. Length-prefixed so that values can
// hold any byte, including the separators.
std::string encode_fields(std::span<const Field> fields) {
  std::string out(1, kAccessMarker);
  for (const auto& f : fields) {
    out += f.type;
    out += f.name;
    out += '=';
    out += std::to_string(f.value.size());
    out += ':';
    out += f.value;
  }
  return out;
}

std::optional<std::vector<Field>> decode_fields(std::string_view p) {
  if (p.empty() || p.front() != kAccessMarker) return std::nullopt;
  std::vector<Field> fields;
  std::size_t i = 1;
  while (i < p.size()) {
    Field f{};
    f.type = p[i++];
    if (f.type != 's' && f.type != 'n') return std::nullopt;
    const auto eq = p.find('=', i);
    if (eq == std::string_view::npos) return std::nullopt;
    f.name = p.substr(i, eq - i);
    const auto colon = p.find(':', eq + 1);
    if (colon == std::string_view::npos || colon == eq + 1) return std::nullopt;
    std::size_t len = 0;
    for (auto k = eq + 1; k < colon; ++k) {
      if (p[k] < '0' || p[k] > '9') return std::nullopt;
      len = len * 10 + static_cast<std::size_t>(p[k] - '0');
      if (len > p.size()) return std::nullopt;
    }
    if (colon + 1 + len > p.size()) return std::nullopt;
    f.value = p.substr(colon + 1, len);
    fields.push_back(f);
    i = colon + 1 + len;
  }
  return fields;
}

void append_fields_json(std::string& out, std::span<const Field> fields) {
  for (const auto& f : fields) {
    out += ",\"";
    append_json_escaped(out, f.name);
    out += "\":";
    if (f.type == 'n') {
      out += f.value;
    } else {
      out += '"';
      append_json_escaped(out, f.value);
      out += '"';
    }
  }
}

void append_fields_text(std::string& out, std::span<const Field> fields) {
  bool first = true;
  for (const auto& f : fields) {
    if (!first) out += ' ';
    first = false;
    out += f.name;
    out += '=';
    append_logfmt_value(out, f.value);
  }
}

// --- the formatter ----------------------------------------------------------------------

std::string_view level_name(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace: return "trace";
    case spdlog::level::debug: return "debug";
    case spdlog::level::info: return "info";
    case spdlog::level::warn: return "warn";
    case spdlog::level::err: return "error";
    case spdlog::level::critical: return "critical";
    default: return "off";
  }
}

// RFC 3339, UTC, milliseconds: sorts as text and every collector parses it. The
// date-and-seconds part only changes once a second, so each thread keeps its last one
// instead of running gmtime_r and a format for every line.
void append_timestamp(std::string& out, spdlog::log_clock::time_point tp) {
  const auto ms = std::chrono::floor<std::chrono::milliseconds>(tp.time_since_epoch()).count();
  auto secs = static_cast<std::time_t>(ms / 1000);
  auto frac = ms % 1000;
  if (frac < 0) {
    frac += 1000;
    --secs;
  }
  thread_local std::time_t cached_secs = -1;
  thread_local char cached[32];  // "YYYY-MM-DDTHH:MM:SS."
  thread_local std::size_t cached_len = 0;
  if (secs != cached_secs) {
    std::tm utc{};
    gmtime_r(&secs, &utc);
    const auto end = fmt::format_to_n(cached, sizeof cached, "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.",
                                      utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                                      utc.tm_hour, utc.tm_min, utc.tm_sec);
    cached_len = std::min(end.size, sizeof cached);
    cached_secs = secs;
  }
  out.append(cached, cached_len);
  const auto f = static_cast<int>(frac);
  out += static_cast<char>('0' + f / 100);
  out += static_cast<char>('0' + f / 10 % 10);
  out += static_cast<char>('0' + f % 10);
  out += 'Z';
}

// One access line in either format; the formatter (records that went through spdlog) and
// the direct writer (log_access on the stderr sink) both build it here, so the two can
// never disagree.
void append_access_line(std::string& line, settings::LogFormat format,
                        spdlog::log_clock::time_point ts, spdlog::level::level_enum level,
                        std::span<const Field> fields) {
  const auto name = level_name(level);
  if (format == settings::LogFormat::json) {
    line += "{\"ts\":\"";
    append_timestamp(line, ts);
    line += "\",\"level\":\"";
    line += name;
    line += "\",\"type\":\"access\"";
    append_fields_json(line, fields);
    line += "}\n";
  } else {
    append_timestamp(line, ts);
    line += ' ';
    line += name;
    line.append(name.size() < 5 ? 5 - name.size() : 0, ' ');  // align the messages
    line += " access ";
    append_fields_text(line, fields);
    line += '\n';
  }
}

class LineFormatter final : public spdlog::formatter {
 public:
  explicit LineFormatter(settings::LogFormat format) : format_(format) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::string_view logger(msg.logger_name.data(), msg.logger_name.size());
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    std::optional<std::vector<Field>> fields;
    if (logger == kAccessLogger) fields = decode_fields(payload);
    const bool named = !logger.empty() && logger != kMainLogger && !fields;

    std::string line;
    line.reserve(payload.size() + 96);
    if (fields) {
      append_access_line(line, format_, msg.time, msg.level, *fields);
    } else if (format_ == settings::LogFormat::json) {
      line += "{\"ts\":\"";
      append_timestamp(line, msg.time);
      line += "\",\"level\":\"";
      line += level_name(msg.level);
      line += '"';
      if (named) {
        line += ",\"logger\":\"";
        append_json_escaped(line, logger);
        line += '"';
      }
      line += ",\"msg\":\"";
      append_json_escaped(line, payload);
      line += "\"}\n";
    } else {
      append_timestamp(line, msg.time);
      line += ' ';
      const auto level = level_name(msg.level);
      line += level;
      line.append(level.size() < 5 ? 5 - level.size() : 0, ' ');  // align the messages
      line += ' ';
      if (named) {
        append_text_sanitized(line, logger, false);
        line += ": ";
      }
      append_text_sanitized(line, payload, false);
      line += '\n';
    }
    dest.append(line.data(), line.data() + line.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<LineFormatter>(format_);
  }

 private:
  settings::LogFormat format_;
};

spdlog::level::level_enum to_spdlog(settings::LogLevel l) {
  switch (l) {
    case settings::LogLevel::trace: return spdlog::level::trace;
    case settings::LogLevel::debug: return spdlog::level::debug;
    case settings::LogLevel::info: return spdlog::level::info;
    case settings::LogLevel::warn: return spdlog::level::warn;
    case settings::LogLevel::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

struct LoggingState {
  std::mutex mutex;  // serializes setup_logging calls
  std::shared_ptr<spdlog::sinks::sink> sink;
};

LoggingState& logging_state() {
  static LoggingState state;
  return state;
}

// Read on every request by log_access, replaced only when the sink changes.
std::atomic<std::shared_ptr<spdlog::logger>>& access_logger() {
  static std::atomic<std::shared_ptr<spdlog::logger>> logger;
  return logger;
}

const std::shared_ptr<spdlog::sinks::sink>& stderr_sink() {
  static const std::shared_ptr<spdlog::sinks::sink> sink =
      std::make_shared<spdlog::sinks::stderr_sink_mt>();
  return sink;
}

// The access line's fast path. Every request logs one line, and through spdlog that line
// is encoded, decoded, formatted and written under the console mutex and stdio's own lock,
// with the write(2) inside both: the workers queue behind each other (profiling showed
// futex waits on this path). When the sink is the process's stderr, log_access instead
// builds the finished line in a per-thread buffer and hands it to the kernel in one
// write(2), with no lock. What setup_logging decided is published here as plain atomics.
std::atomic<bool> g_direct_stderr{false};
std::atomic<int> g_access_format{static_cast<int>(settings::LogFormat::json)};
std::atomic<int> g_access_level{static_cast<int>(spdlog::level::info)};
// Only lines longer than PIPE_BUF take it: the kernel writes shorter ones to a pipe
// atomically, and a regular file's offset is taken under the file's own lock.
std::mutex g_long_line_mutex;

void write_stderr(std::string_view line) noexcept {
  std::unique_lock<std::mutex> lock(g_long_line_mutex, std::defer_lock);
  if (line.size() > PIPE_BUF) lock.lock();
  int stalls = 0;
  while (!line.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
    if (n > 0) {
      line.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && ++stalls <= 10) {
      // A non-blocking stderr whose reader fell behind: wait a little, as the blocking
      // stdio write would have, but never forever.
      pollfd pfd{STDERR_FILENO, POLLOUT, 0};
      ::poll(&pfd, 1, 100);
      continue;
    }
    return;  // closed or broken: a log line is not worth failing a request for
  }
}

// Numbers are formatted into fixed buffers: no allocation per request.
struct NumberText {
  char buf[48];
  std::size_t len = 0;
  std::string_view view() const noexcept { return {buf, len}; }
};

NumberText integer_text(long long v) noexcept {
  NumberText t;
  const auto [end, ec] = std::to_chars(t.buf, t.buf + sizeof t.buf, v);
  t.len = ec == std::errc{} ? static_cast<std::size_t>(end - t.buf) : 0;
  return t;
}

// Milliseconds with three decimals, as fmt's "{:.3f}" writes them.
NumberText ms_text(double v) noexcept {
  NumberText t;
  const auto [end, ec] =
      std::to_chars(t.buf, t.buf + sizeof t.buf, v, std::chars_format::fixed, 3);
  t.len = ec == std::errc{} ? static_cast<std::size_t>(end - t.buf) : 0;
  return t;
}

// The record's fields in their fixed order, absent values left out: a query on
// upstream_ms must never average in a -1. Views into the record and into this object
// (numbers are formatted into fixed buffers: no allocation per request).
class AccessFields {
 public:
  explicit AccessFields(const AccessRecord& r)
      : status_(integer_text(r.status)),
        duration_(ms_text(r.duration_ms)),
        upstream_(ms_text(r.upstream_ms)),
        store_(ms_text(r.store_ms)),
        attempt_(integer_text(r.attempt)) {
    add("route", 's', r.route);
    add("method", 's', r.method);
    add("path", 's', r.path);
    add("outcome", 's', r.outcome);
    add("status", 'n', status_.view());
    if (std::isfinite(r.duration_ms)) add("duration_ms", 'n', duration_.view());
    if (r.upstream_ms >= 0 && std::isfinite(r.upstream_ms)) add("upstream_ms", 'n', upstream_.view());
    if (r.store_ms >= 0 && std::isfinite(r.store_ms)) add("store_ms", 'n', store_.view());
    if (r.attempt != 0) add("attempt", 'n', attempt_.view());
    if (!r.key_hash.empty()) add("key_hash", 's', r.key_hash);
    if (!r.code.empty()) add("code", 's', r.code);
    if (r.from_cache) add("replay_cache", 's', "hit");
    if (!r.fenced.empty()) add("fenced", 's', r.fenced);
    if (!r.trace_id.empty()) add("trace_id", 's', r.trace_id);
    if (!r.record_trace_id.empty()) add("record_trace_id", 's', r.record_trace_id);
  }
  AccessFields(const AccessFields&) = delete;
  AccessFields& operator=(const AccessFields&) = delete;

  std::span<const Field> fields() const noexcept { return {storage_.data(), n_}; }

 private:
  void add(std::string_view name, char type, std::string_view value) {
    storage_[n_++] = Field{name, type, value};
  }

  NumberText status_, duration_, upstream_, store_, attempt_;
  std::array<Field, 15> storage_{};
  std::size_t n_ = 0;
};

// The finished line for the direct writer, in the current format.
void build_direct_line(std::string& line, const AccessRecord& r) {
  const AccessFields f(r);
  line.clear();
  append_access_line(line,
                     static_cast<settings::LogFormat>(g_access_format.load(std::memory_order_relaxed)),
                     spdlog::log_clock::now(), spdlog::level::info, f.fields());
}

// Lines of one event-loop pass, written together (see log_access_batched). Kept at most
// PIPE_BUF long, so that every write to a pipe stays atomic.
struct AccessBatch {
  std::string lines;
  ~AccessBatch() { flush(); }
  void flush() noexcept {
    if (lines.empty()) return;
    write_stderr(lines);
    lines.clear();
  }
};

AccessBatch& access_batch() {
  thread_local AccessBatch batch;
  return batch;
}

bool direct_access_lines() {
  return g_direct_stderr.load(std::memory_order_acquire) &&
         g_access_level.load(std::memory_order_relaxed) <= spdlog::level::info;
}

}  // namespace

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  append_json_escaped(out, s);
  return out;
}

void setup_logging(const settings::LogSettings& s) { setup_logging(s, stderr_sink()); }

void setup_logging(const settings::LogSettings& s, std::shared_ptr<spdlog::sinks::sink> sink) {
  auto& state = logging_state();
  std::lock_guard lock(state.mutex);
  const auto level = to_spdlog(s.level);
  const bool direct = sink == stderr_sink();
  if (state.sink != sink) {
    // spdlog::info() uses the default logger through a raw pointer, so replacing it races
    // with logging threads; on reload (same sink) the loggers are kept and only their
    // formatter and level change, which spdlog makes thread-safe.
    auto main = std::make_shared<spdlog::logger>(std::string(kMainLogger), sink);
    spdlog::set_default_logger(main);
    access_logger().store(std::make_shared<spdlog::logger>(std::string(kAccessLogger), sink));
    state.sink = std::move(sink);
  }
  // Registry-wide: the default logger, any logger another component registered, and any
  // created later all write the same line format at the same level.
  spdlog::set_formatter(std::make_unique<LineFormatter>(s.format));
  spdlog::set_level(level);
  access_logger().load()->set_level(level);
  g_access_format.store(static_cast<int>(s.format), std::memory_order_relaxed);
  g_access_level.store(static_cast<int>(level), std::memory_order_relaxed);
  g_direct_stderr.store(direct, std::memory_order_release);
}

void log_access(const AccessRecord& r) {
  if (g_direct_stderr.load(std::memory_order_acquire)) {
    if (g_access_level.load(std::memory_order_relaxed) > spdlog::level::info) return;
    thread_local std::string line;
    build_direct_line(line, r);
    write_stderr(line);
    // A one-off giant path must not pin its buffer in every worker for good.
    if (line.capacity() > 64 * 1024) std::string().swap(line);
    return;
  }
  auto logger = access_logger().load();
  if (logger && !logger->should_log(spdlog::level::info)) return;
  const AccessFields f(r);
  if (!logger) {
    // setup_logging was never called (a unit test of another component): still one
    // readable line through whatever default logger exists.
    std::string text = "access ";
    append_fields_text(text, f.fields());
    spdlog::default_logger_raw()->log(spdlog::level::info, spdlog::string_view_t(text));
    return;
  }
  const auto payload = encode_fields(f.fields());
  logger->log(spdlog::level::info, spdlog::string_view_t(payload.data(), payload.size()));
}

bool log_access_batched(const AccessRecord& r) {
  if (!direct_access_lines()) {
    log_access(r);
    return false;
  }
  thread_local std::string line;
  build_direct_line(line, r);
  auto& batch = access_batch();
  if (!batch.lines.empty() && batch.lines.size() + line.size() > PIPE_BUF) batch.flush();
  const bool was_empty = batch.lines.empty();
  if (line.size() >= PIPE_BUF) {
    write_stderr(line);  // too long to batch (a huge path)
    if (line.capacity() > 64 * 1024) std::string().swap(line);
    return false;
  }
  batch.lines += line;
  return was_empty;
}

void flush_access_log() noexcept { access_batch().flush(); }

}  // namespace idem::obs
