// Log lines: one JSON object per line (for collectors) or key=value text (for people).
//
// spdlog keeps one formatter per sink, and the access logger shares the stderr sink with the
// default logger, so a single formatter serves both. It tells an access line by its logger
// name and payload marker. The access payload is not JSON or text but a neutral encoding of
// typed fields that the formatter renders: the format is decided in one place, and a reload
// that switches formats can never wrap a JSON body in a text line.
#include "observability/logging.hpp"

#include <spdlog/formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <mutex>
#include <optional>
#include <vector>

namespace idem::obs {

namespace {

constexpr std::string_view kAccessLogger = "access";
constexpr std::string_view kMainLogger = "idemproxy";
// Starts every encoded access payload; a control character no caller puts first in a message.
constexpr char kAccessMarker = '\x1e';
constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD

// Length of the well-formed UTF-8 sequence at s[i] (Unicode Table 3-7), or, when it is
// ill-formed, the length of its maximal subpart to replace with one U+FFFD (at least 1).
// Overlongs, surrogates and code points above U+10FFFF are ill-formed.
std::pair<std::size_t, bool> utf8_sequence(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {1, true};
  std::size_t need = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xbf;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    need = 1;
  } else if (b0 == 0xe0) {
    need = 2, lo = 0xa0;
  } else if ((b0 >= 0xe1 && b0 <= 0xec) || b0 == 0xee || b0 == 0xef) {
    need = 2;
  } else if (b0 == 0xed) {
    need = 2, hi = 0x9f;
  } else if (b0 == 0xf0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xf1 && b0 <= 0xf3) {
    need = 3;
  } else if (b0 == 0xf4) {
    need = 3, hi = 0x8f;
  } else {
    return {1, false};
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return {k, false};
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return {k, false};
    lo = 0x80;
    hi = 0xbf;
  }
  return {need + 1, true};
}

void append_hex_escape(std::string& out, std::string_view prefix, unsigned value, int digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += prefix;
  for (int shift = (digits - 1) * 4; shift >= 0; shift -= 4) out += kHex[(value >> shift) & 0xf];
}

void append_json_escaped(std::string& out, std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      const auto [len, ok] = utf8_sequence(s, i);
      if (!ok) {
        out += kReplacement;
      } else if (len == 3 && u == 0xe2 && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
                 (static_cast<unsigned char>(s[i + 2]) & 0xfe) == 0xa8) {
        // U+2028/U+2029 are valid JSON but end a line in JavaScript and in some line-based
        // log shippers; escaping them keeps one record per line everywhere.
        append_hex_escape(out, "\\u", 0x2028u + (static_cast<unsigned char>(s[i + 2]) & 1u), 4);
      } else {
        out.append(s.substr(i, len));
      }
      i += len;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          append_hex_escape(out, "\\u", u, 4);
        } else {
          out += c;
        }
    }
    ++i;
  }
}

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
      append_hex_escape(out, "\\x", u, 2);
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
std::string encode_fields(const std::vector<Field>& fields) {
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

void append_fields_json(std::string& out, const std::vector<Field>& fields) {
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

void append_fields_text(std::string& out, const std::vector<Field>& fields) {
  bool first = true;
  for (const auto& f : fields) {
    if (!first) out += ' ';
    first = false;
    out += f.name;
    out += '=';
    append_logfmt_value(out, f.value);
  }
}

std::string format_ms(double v) { return fmt::format("{:.3f}", v); }

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

// RFC 3339, UTC, milliseconds: sorts as text and every collector parses it.
void append_timestamp(std::string& out, spdlog::log_clock::time_point tp) {
  const auto ms = std::chrono::floor<std::chrono::milliseconds>(tp.time_since_epoch()).count();
  auto secs = static_cast<std::time_t>(ms / 1000);
  auto frac = ms % 1000;
  if (frac < 0) {
    frac += 1000;
    --secs;
  }
  std::tm utc{};
  gmtime_r(&secs, &utc);
  fmt::format_to(std::back_inserter(out), "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                 utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min,
                 utc.tm_sec, frac);
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
    if (format_ == settings::LogFormat::json) {
      line += "{\"ts\":\"";
      append_timestamp(line, msg.time);
      line += "\",\"level\":\"";
      line += level_name(msg.level);
      line += '"';
      if (fields) {
        line += ",\"type\":\"access\"";
        append_fields_json(line, *fields);
      } else {
        if (named) {
          line += ",\"logger\":\"";
          append_json_escaped(line, logger);
          line += '"';
        }
        line += ",\"msg\":\"";
        append_json_escaped(line, payload);
        line += '"';
      }
      line += "}\n";
    } else {
      append_timestamp(line, msg.time);
      line += ' ';
      const auto level = level_name(msg.level);
      line += level;
      line.append(level.size() < 5 ? 5 - level.size() : 0, ' ');  // align the messages
      line += ' ';
      if (fields) {
        line += "access ";
        append_fields_text(line, *fields);
      } else {
        if (named) {
          append_text_sanitized(line, logger, false);
          line += ": ";
        }
        append_text_sanitized(line, payload, false);
      }
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

}  // namespace

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  append_json_escaped(out, s);
  return out;
}

void setup_logging(const settings::LogSettings& s) {
  static const auto stderr_sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  setup_logging(s, stderr_sink);
}

void setup_logging(const settings::LogSettings& s, std::shared_ptr<spdlog::sinks::sink> sink) {
  auto& state = logging_state();
  std::lock_guard lock(state.mutex);
  const auto level = to_spdlog(s.level);
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
}

void log_access(const AccessRecord& r) {
  auto logger = access_logger().load();
  if (logger && !logger->should_log(spdlog::level::info)) return;

  const std::string status = std::to_string(r.status);
  const std::string duration = format_ms(r.duration_ms);
  const std::string upstream = format_ms(r.upstream_ms);
  const std::string store = format_ms(r.store_ms);
  const std::string attempt = std::to_string(r.attempt);
  // Absent values are left out rather than written as sentinels, so a query on
  // upstream_ms never averages in a -1.
  std::vector<Field> fields{{"route", 's', r.route},
                            {"method", 's', r.method},
                            {"path", 's', r.path},
                            {"outcome", 's', r.outcome},
                            {"status", 'n', status}};
  if (std::isfinite(r.duration_ms)) fields.push_back({"duration_ms", 'n', duration});
  if (r.upstream_ms >= 0 && std::isfinite(r.upstream_ms)) fields.push_back({"upstream_ms", 'n', upstream});
  if (r.store_ms >= 0 && std::isfinite(r.store_ms)) fields.push_back({"store_ms", 'n', store});
  if (r.attempt != 0) fields.push_back({"attempt", 'n', attempt});
  if (!r.key_hash.empty()) fields.push_back({"key_hash", 's', r.key_hash});
  if (!r.code.empty()) fields.push_back({"code", 's', r.code});

  if (!logger) {
    // setup_logging was never called (a unit test of another component): still one
    // readable line through whatever default logger exists.
    std::string text = "access ";
    append_fields_text(text, fields);
    spdlog::default_logger_raw()->log(spdlog::level::info, spdlog::string_view_t(text));
    return;
  }
  const auto payload = encode_fields(fields);
  logger->log(spdlog::level::info, spdlog::string_view_t(payload.data(), payload.size()));
}

}  // namespace idem::obs
