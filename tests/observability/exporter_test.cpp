// The OTLP exporter against a local HTTP sink (a real socket): a failed export is tried
// again with the same batch after a bounded backoff, gives up after max_attempts, and the
// queue stays bounded meanwhile (drops counted).
#include <doctest/doctest.h>

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "observability/metrics.hpp"
#include "observability/tracing.hpp"
#include "test_support/http_sink.hpp"
#include "test_support/wait.hpp"

using namespace idem;
using namespace idem::obs;
using namespace std::chrono_literals;

namespace {


// The collector: answers each POST with the next status of a script (then always the
// last one), and records the bodies and when they came.
class Sink {
 public:
  explicit Sink(std::deque<int> statuses) : sink_(std::move(statuses)) {}
  std::uint16_t port() const { return sink_.port(); }
  std::vector<std::string> bodies() {
    std::vector<std::string> out;
    for (auto& p : sink_.posts()) out.push_back(std::move(p.body));
    return out;
  }
  std::vector<std::chrono::steady_clock::time_point> times() {
    std::vector<std::chrono::steady_clock::time_point> out;
    for (const auto& p : sink_.posts()) out.push_back(p.at);
    return out;
  }

 private:
  test::HttpSink sink_;
};

ExporterOptions options_for(const Sink& sink) {
  ExporterOptions o;
  o.host = "127.0.0.1";
  o.port = sink.port();
  o.batch = 4;
  o.flush_interval = Millis{20};
  o.timeout = Millis{2000};
  o.retry_backoff = Millis{30};
  o.max_backoff = Millis{60};
  o.max_attempts = 3;
  return o;
}

std::vector<Span> spans(std::size_t n) {
  std::vector<Span> out(n);
  for (auto& s : out) {
    s.trace_id = new_trace_id();
    s.span_id = new_span_id();
    s.name = "claim";
  }
  return out;
}

}  // namespace

TEST_CASE("exporter: a failed export is retried with the same batch, after a backoff") {
  Sink sink({503, 200});
  Metrics metrics;
  {
    SpanExporter exporter(options_for(sink), &metrics);
    exporter.submit(spans(3));
    test::wait_until([&] { return metrics.trace_spans("exported") == 3; }, 10s, "the batch exported on the retry");
  }
  const auto bodies = sink.bodies();
  REQUIRE(bodies.size() == 2);
  CHECK(bodies[0] == bodies[1]);  // the same batch, not a new one
  const auto times = sink.times();
  CHECK(times[1] - times[0] >= Millis{30});  // after the backoff
  CHECK(metrics.trace_spans("failed") == 0);
  CHECK(metrics.trace_spans("dropped") == 0);
  CHECK(metrics.trace_export_retries() == 1);
}

TEST_CASE("exporter: a collector that keeps failing costs max_attempts posts, then the batch is failed") {
  Sink sink({500});
  Metrics metrics;
  {
    SpanExporter exporter(options_for(sink), &metrics);
    exporter.submit(spans(2));
    test::wait_until([&] { return metrics.trace_spans("failed") == 2; }, 10s, "the batch given up");
    // The next batch gets its own attempts: the exporter goes on.
    exporter.submit(spans(1));
    test::wait_until([&] { return metrics.trace_spans("failed") == 3; }, 10s, "the second batch given up");
  }
  CHECK(sink.bodies().size() == 6);
  CHECK(metrics.trace_export_retries() == 4);
  CHECK(metrics.trace_spans("exported") == 0);
  // The backoff doubles, bounded: 30 ms, then 60 ms (never more than max_backoff apart
  // is not checked: a loaded machine may be slower, never faster).
  const auto t = sink.times();
  CHECK(t[1] - t[0] >= Millis{30});
  CHECK(t[2] - t[1] >= Millis{60});
}

TEST_CASE("exporter: while a batch waits for its retry, the queue stays bounded and counts what it drops") {
  Sink sink({503, 200});
  Metrics metrics;
  auto o = options_for(sink);
  o.queue_capacity = 4;
  o.retry_backoff = Millis{300};
  {
    SpanExporter exporter(o, &metrics);
    exporter.submit(spans(4));
    test::wait_until([&] { return sink.bodies().size() == 1; }, 10s, "the first attempt");
    // The batch in hand left the queue: 4 fit again, the rest is dropped at once.
    exporter.submit(spans(7));
    CHECK(metrics.trace_spans("dropped") == 3);
    // The first batch goes out on its retry, the queued one after it.
    test::wait_until([&] { return metrics.trace_spans("exported") == 8; }, 10s, "both batches exported");
  }
  CHECK(metrics.trace_spans("failed") == 0);
  CHECK(metrics.trace_export_retries() == 1);
  const auto bodies = sink.bodies();
  REQUIRE(bodies.size() == 3);
  CHECK(bodies[0] == bodies[1]);
  CHECK(bodies[2] != bodies[0]);
}

TEST_CASE("exporter: a stop cuts a backoff short; what is queued gets one attempt") {
  Sink sink({503});
  Metrics metrics;
  auto o = options_for(sink);
  o.retry_backoff = Millis{20000};  // a stop that waited for it would take 20 s
  o.max_backoff = Millis{20000};
  const auto t0 = std::chrono::steady_clock::now();
  {
    SpanExporter exporter(o, &metrics);
    exporter.submit(spans(4));
    test::wait_until([&] { return sink.bodies().size() == 1; }, 10s, "the first attempt");
    exporter.submit(spans(2));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  CHECK(metrics.trace_spans("failed") == 6);
  CHECK(metrics.trace_export_retries() == 0);
  CHECK(sink.bodies().size() == 2);
}
