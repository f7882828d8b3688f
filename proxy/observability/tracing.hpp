#pragma once
// Span export over OTLP/HTTP with JSON bodies (the OpenTelemetry protocol's
// `POST /v1/traces`, `Content-Type: application/json`). There is no OpenTelemetry C++ SDK
// in Debian 12, so this is a small exporter of its own:
//   - submit() is what the request path calls: it moves a finished request's spans into a
//     bounded queue under a mutex and returns at once; a full queue drops the spans and
//     counts them (never blocks, never allocates beyond the bound);
//   - one exporter thread takes up to `batch` spans at a time and POSTs them, each export
//     bounded by `timeout`. A failed export (no connection, a timeout, an answer but 2xx)
//     is tried again with the same batch, at most `max_attempts` times in all, after
//     waits of `retry_backoff` doubling up to `max_backoff`; then its spans are dropped
//     and counted as failed. Only the one batch in hand is retried: spans submitted
//     meanwhile wait in the same bounded queue (and are dropped, counted, when it is
//     full), so a collector that is down costs at most queue_capacity + batch spans of
//     memory. A stop cuts the waits short: the flush at exit tries each batch once.
// span_json() is pure, for tests.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/types.hpp"
#include "observability/trace_context.hpp"

namespace idem::obs {

class Metrics;

enum class SpanKind { internal = 1, server = 2, client = 3 };

struct Span {
  TraceId trace_id{};
  SpanId span_id{};
  std::optional<SpanId> parent;
  std::string name;
  SpanKind kind = SpanKind::internal;
  std::int64_t start_unix_ns = 0;
  std::int64_t end_unix_ns = 0;
  bool error = false;
  std::vector<std::pair<std::string, std::string>> attributes;  // string values
  std::vector<std::pair<std::string, std::int64_t>> int_attributes;
};

// Wall-clock now, for span times (the steady clock measures durations elsewhere).
std::int64_t unix_now_ns();

// One ExportTraceServiceRequest holding `spans` under resource service.name=idemproxy.
std::string spans_json(const std::vector<Span>& spans);

struct ExporterOptions {
  std::string host;
  std::uint16_t port = 4318;
  std::string path = "/v1/traces";
  std::size_t queue_capacity = 4096;  // spans
  std::size_t batch = 512;            // spans per export
  Millis flush_interval{1000};        // a partial batch waits at most this long
  Millis timeout{2000};               // connect + write + read of one export
  std::size_t max_attempts = 4;       // per batch, the first one included (>= 1)
  Millis retry_backoff{500};          // the wait before the second attempt, then doubled
  Millis max_backoff{4000};           // the longest wait between two attempts
};

class SpanExporter {
 public:
  SpanExporter(ExporterOptions options, Metrics* metrics);
  ~SpanExporter();  // flushes what is queued (bounded by one timeout per batch), then stops
  SpanExporter(const SpanExporter&) = delete;
  SpanExporter& operator=(const SpanExporter&) = delete;

  // Thread-safe and non-blocking (beyond a short mutex).
  void submit(std::vector<Span>&& spans) noexcept;

 private:
  void run();
  // Exports one batch, with the retries; false when every attempt failed. Called without
  // the lock; takes it only to wait.
  bool export_batch(const std::string& body);
  bool post(const std::string& body);

  ExporterOptions options_;
  Metrics* metrics_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Span> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace idem::obs
