// OTLP/HTTP JSON span exporter (tracing.hpp).
#include "observability/tracing.hpp"

#include <algorithm>
#include <chrono>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/json.hpp>
#include <spdlog/spdlog.h>

#include "observability/metrics.hpp"

namespace idem::obs {
namespace {

namespace json = boost::json;
namespace beast = boost::beast;

json::object string_attribute(std::string_view key, std::string_view value) {
  return json::object{{"key", key}, {"value", json::object{{"stringValue", value}}}};
}

json::object span_object(const Span& s) {
  json::array attributes;
  for (const auto& [k, v] : s.attributes) attributes.push_back(string_attribute(k, v));
  // OTLP/JSON writes 64-bit integers as strings (proto3 JSON mapping).
  for (const auto& [k, v] : s.int_attributes) {
    attributes.push_back(json::object{{"key", k}, {"value", json::object{{"intValue", std::to_string(v)}}}});
  }
  json::object o{{"traceId", to_hex(s.trace_id)},
                 {"spanId", to_hex(s.span_id)},
                 {"name", s.name},
                 {"kind", static_cast<int>(s.kind)},
                 {"startTimeUnixNano", std::to_string(s.start_unix_ns)},
                 {"endTimeUnixNano", std::to_string(s.end_unix_ns)},
                 {"attributes", std::move(attributes)},
                 // STATUS_CODE_ERROR = 2; unset (0) otherwise.
                 {"status", json::object{{"code", s.error ? 2 : 0}}}};
  if (s.parent) o["parentSpanId"] = to_hex(*s.parent);
  return o;
}

}  // namespace

std::int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string spans_json(const std::vector<Span>& spans) {
  json::array list;
  for (const auto& s : spans) list.push_back(span_object(s));
  json::object resource{{"attributes", json::array{string_attribute("service.name", "idemproxy")}}};
  json::object scope{{"scope", json::object{{"name", "idemproxy"}}}, {"spans", std::move(list)}};
  json::object rs{{"resource", std::move(resource)}, {"scopeSpans", json::array{std::move(scope)}}};
  return json::serialize(json::object{{"resourceSpans", json::array{std::move(rs)}}});
}

SpanExporter::SpanExporter(ExporterOptions options, Metrics* metrics)
    : options_(std::move(options)), metrics_(metrics), thread_([this] { run(); }) {}

SpanExporter::~SpanExporter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void SpanExporter::submit(std::vector<Span>&& spans) noexcept {
  std::size_t dropped = 0;
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    for (auto& s : spans) {
      if (queue_.size() >= options_.queue_capacity) {
        ++dropped;
        continue;
      }
      queue_.push_back(std::move(s));
    }
    wake = queue_.size() >= options_.batch;
  }
  if (wake) wake_.notify_one();
  if (dropped > 0 && metrics_ != nullptr) metrics_->trace_spans("dropped", dropped);
}

// Waits for a full batch or the flush interval, exports, repeats; on stop, exports what
// is left and returns.
void SpanExporter::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait_for(lock, options_.flush_interval,
                   [&] { return stopping_ || queue_.size() >= options_.batch; });
    if (queue_.empty()) {
      if (stopping_) return;
      continue;
    }
    const auto n = std::min(queue_.size(), options_.batch);
    std::vector<Span> batch(std::make_move_iterator(queue_.begin()),
                            std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(n)));
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
    lock.unlock();
    const bool ok = export_batch(spans_json(batch));
    if (metrics_ != nullptr) metrics_->trace_spans(ok ? "exported" : "failed", batch.size());
    lock.lock();
  }
}

bool SpanExporter::export_batch(const std::string& body) {
  if (post(body)) return true;
  Millis backoff = options_.retry_backoff;
  for (std::size_t attempt = 1; attempt < options_.max_attempts; ++attempt) {
    {
      // Only a stop ends the wait early; a submit's wake-up is for the main loop, which
      // checks the queue itself before it waits again.
      std::unique_lock lock(mutex_);
      if (wake_.wait_for(lock, backoff, [&] { return stopping_; })) return false;
    }
    if (metrics_ != nullptr) metrics_->trace_export_retry();
    if (post(body)) return true;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  spdlog::debug("trace export to {}:{} failed {} times; its spans are dropped", options_.host, options_.port,
                options_.max_attempts);
  return false;
}

// One POST on a fresh connection, every step bounded by the one deadline. Any answer but
// 2xx is a failure (OTLP's partial success is still a 200 and counts as exported).
bool SpanExporter::post(const std::string& body) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  http::request<http::string_body> req{http::verb::post, options_.path, 11};
  req.set(http::field::host, options_.host + ":" + std::to_string(options_.port));
  req.set(http::field::content_type, "application/json");
  req.set(http::field::connection, "close");
  req.body() = body;
  req.prepare_payload();
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 * 1024);
  error_code result = asio::error::timed_out;
  asio::ip::tcp::resolver resolver(ioc);
  stream.expires_after(options_.timeout);
  resolver.async_resolve(options_.host, std::to_string(options_.port), [&](error_code ec, auto endpoints) {
    if (ec) return void(result = ec);
    stream.async_connect(endpoints, [&](error_code ec, const auto&) {
      if (ec) return void(result = ec);
      http::async_write(stream, req, [&](error_code ec, std::size_t) {
        if (ec) return void(result = ec);
        http::async_read(stream, buffer, parser, [&](error_code ec, std::size_t) { result = ec; });
      });
    });
  });
  // The resolver has no deadline of its own: the run is bounded as well.
  ioc.run_for(options_.timeout + Millis{100});
  if (result) {
    spdlog::debug("trace export to {}:{} failed: {}", options_.host, options_.port, result.message());
    return false;
  }
  const auto status = parser.get().result_int();
  if (status / 100 != 2) {
    spdlog::debug("trace export to {}:{} answered {}", options_.host, options_.port, status);
    return false;
  }
  return true;
}

}  // namespace idem::obs
