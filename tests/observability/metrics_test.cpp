// Metrics: the exposition text is parsed back with a small independent parser that checks
// the Prometheus 0.0.4 text syntax line by line (test_support/prometheus.hpp, shared with
// the end-to-end scrapes), and the values are compared with what was recorded, including
// from many threads at once.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "observability/metrics.hpp"
#include "test_support/prometheus.hpp"

using namespace idem::obs;

namespace {

// The strict, independent text-format parser and the histogram checks
// (test_support/prometheus.hpp).
using idem::test::check_histograms;
using idem::test::Exposition;

Exposition parse(const std::string& text) { return idem::test::parse_exposition(text); }

}  // namespace

TEST_CASE("a fresh registry exposes every declared metric") {
  Metrics m;
  const auto e = parse(m.render_prometheus());
  CHECK(e.types.at("idemproxy_requests_total") == "counter");
  CHECK(e.types.at("idemproxy_request_duration_seconds") == "histogram");
  CHECK(e.types.at("idemproxy_upstream_duration_seconds") == "histogram");
  CHECK(e.types.at("idemproxy_store_duration_seconds") == "histogram");
  CHECK(e.types.at("idemproxy_takeovers_total") == "counter");
  CHECK(e.types.at("idemproxy_fenced_writes_total") == "counter");
  CHECK(e.types.at("idemproxy_fenced_answers_total") == "counter");
  CHECK(e.types.at("idemproxy_lease_renewals_total") == "counter");
  CHECK(e.types.at("idemproxy_expired_deleted_total") == "counter");
  CHECK(e.types.at("idemproxy_store_errors_total") == "counter");
  CHECK(e.types.at("idemproxy_in_progress_oldest_seconds") == "gauge");
  CHECK(e.types.at("idemproxy_replay_cache_lookups_total") == "counter");
  CHECK(e.types.at("idemproxy_replay_cache_notifications_total") == "counter");
  CHECK(e.types.at("idemproxy_fingerprint_memo_lookups_total") == "counter");
  CHECK(e.get("idemproxy_fingerprint_memo_lookups_total", {{"result", "hit"}}) == 0);
  CHECK(e.types.at("idemproxy_replay_cache_active") == "gauge");
  CHECK(e.types.at("idemproxy_replay_cache_entries") == "gauge");
  CHECK(e.types.at("idemproxy_replay_cache_bytes") == "gauge");
  CHECK(e.types.at("idemproxy_refetches_total") == "counter");
  CHECK(e.types.at("idemproxy_reconciliations_total") == "counter");
  CHECK(e.types.at("idemproxy_trace_spans_total") == "counter");
  CHECK(e.types.at("idemproxy_store_batches_total") == "counter");
  CHECK(e.types.at("idemproxy_store_batched_calls_total") == "counter");
  CHECK(e.types.at("idemproxy_trace_export_retries_total") == "counter");
  CHECK(e.get("idemproxy_trace_export_retries_total") == 0);
  CHECK(e.types.at("idemproxy_store_batch_size") == "histogram");
  CHECK(e.types.at("idemproxy_schema_version") == "gauge");
  CHECK(e.types.at("idemproxy_schema_newer_compatible") == "gauge");
  CHECK(e.get("idemproxy_schema_newer_compatible") == 0);
  CHECK(e.types.size() == 30);
  for (const char* result : {"exported", "dropped", "failed"}) {
    CHECK(e.get("idemproxy_trace_spans_total", {{"result", result}}) == 0);
  }
  // Unlabelled and fixed-label series are there from the start, at zero.
  CHECK(e.get("idemproxy_takeovers_total") == 0);
  CHECK(e.get("idemproxy_in_progress_oldest_seconds") == 0);
  CHECK(e.get("idemproxy_upstream_duration_seconds_count") == 0);
  for (int i = 0; i < kStoreOpCount; ++i) {
    const std::string op(to_string(static_cast<StoreOp>(i)));
    CHECK(e.get("idemproxy_store_duration_seconds_count", {{"op", op}}) == 0);
  }
  CHECK(e.get("idemproxy_store_errors_total", {{"kind", "timeout"}}) == 0);
  for (const char* op : {"claim", "complete", "release", "renew"}) {
    CHECK(e.get("idemproxy_store_batches_total", {{"op", op}}) == 0);
    CHECK(e.get("idemproxy_store_batched_calls_total", {{"op", op}}) == 0);
    CHECK(e.get("idemproxy_store_batch_size_count", {{"op", op}}) == 0);
    CHECK(e.get("idemproxy_store_batch_size_bucket", {{"op", op}, {"le", "+Inf"}}) == 0);
  }
  CHECK(e.get("idemproxy_replay_cache_lookups_total", {{"result", "hit"}}) == 0);
  CHECK(e.get("idemproxy_replay_cache_active") == 0);
  for (const char* answer : {"replayed", "in_progress", "key_reused", "forbidden", "unavailable"}) {
    CHECK(e.get("idemproxy_fenced_answers_total", {{"answer", answer}}) == 0);
  }
  check_histograms(e);
}

TEST_CASE("every outcome of every declared route is exported at 0 before any request") {
  Metrics m;
  // "unmatched" (the listener's own refusals, pass-through) exists from construction.
  auto e = parse(m.render_prometheus());
  for (int i = 0; i < kOutcomeCount; ++i) {
    const std::string outcome(to_string(static_cast<Outcome>(i)));
    CHECK(e.get("idemproxy_requests_total", {{"route", "unmatched"}, {"outcome", outcome}}) == 0);
  }
  CHECK(e.get("idemproxy_request_duration_seconds_count", {{"route", "unmatched"}}) == 0);
  m.declare_routes({"create-order", "capture-payment"});
  e = parse(m.render_prometheus());
  for (const char* route : {"create-order", "capture-payment", "unmatched"}) {
    for (int i = 0; i < kOutcomeCount; ++i) {
      const std::string outcome(to_string(static_cast<Outcome>(i)));
      CHECK(e.get("idemproxy_requests_total", {{"route", route}, {"outcome", outcome}}) == 0);
    }
    CHECK(e.get("idemproxy_request_duration_seconds_count", {{"route", route}}) == 0);
  }
  // Declaring again (a reload) keeps the counts.
  m.request("create-order", Outcome::key_reused, 0.01);
  m.declare_routes({"create-order"});
  e = parse(m.render_prometheus());
  CHECK(e.get("idemproxy_requests_total", {{"route", "create-order"}, {"outcome", "key_reused"}}) == 1);
  CHECK(e.get("idemproxy_requests_total", {{"route", "capture-payment"}, {"outcome", "created"}}) == 0);
  for (const char* kind : {"unavailable", "timeout", "busy", "protocol"}) {
    CHECK(e.get("idemproxy_store_errors_total", {{"kind", kind}}) == 0);
  }
  check_histograms(e);
}

TEST_CASE("recorded values appear in the exposition") {
  Metrics m;
  m.request("create-order", Outcome::created, 0.012);
  m.request("create-order", Outcome::replayed, 0.002);
  m.request("create-order", Outcome::replayed, 0.003);
  m.request("unmatched", Outcome::passthrough, 0.5);
  m.upstream_duration(0.2);
  m.store_duration(StoreOp::claim, 0.001);
  m.store_batch("claim", 5);
  m.store_batch("claim", 3);
  m.takeover();
  m.fenced_write();
  m.fenced_write();
  m.fenced_answer("replayed");
  m.lease_renewal();
  m.expired_deleted(500);
  m.expired_deleted(20);
  m.store_error("timeout");
  m.store_error("connection_reset");
  m.set_in_progress_oldest(42.5);
  m.replay_cache_lookup(true);
  m.replay_cache_lookup(false);
  m.replay_cache_lookup(true);
  m.replay_cache_notification();
  m.set_replay_cache(true, 3, 4096);

  CHECK(m.requests("create-order", Outcome::replayed) == 2);
  CHECK(m.replay_cache_hits() == 2);
  CHECK(m.replay_cache_notifications() == 1);
  CHECK(m.requests("create-order", Outcome::key_reused) == 0);
  CHECK(m.requests("never-seen", Outcome::created) == 0);
  CHECK(m.takeovers() == 1);
  CHECK(m.fenced_writes() == 2);

  const auto e = parse(m.render_prometheus());
  // Every outcome of a route that was seen is exposed, zeros included.
  for (int i = 0; i < kOutcomeCount; ++i) {
    const std::string outcome(to_string(static_cast<Outcome>(i)));
    const double expected = outcome == "created" ? 1 : outcome == "replayed" ? 2 : 0;
    CHECK(e.get("idemproxy_requests_total", {{"route", "create-order"}, {"outcome", outcome}}) == expected);
  }
  CHECK(e.get("idemproxy_requests_total", {{"route", "unmatched"}, {"outcome", "passthrough"}}) == 1);
  CHECK(e.get("idemproxy_store_batches_total", {{"op", "claim"}}) == 2);
  CHECK(e.get("idemproxy_store_batched_calls_total", {{"op", "claim"}}) == 8);
  CHECK(e.get("idemproxy_store_batches_total", {{"op", "complete"}}) == 0);
  // The two claim batches, of 5 and 3 calls, in the batch-size buckets (cumulative).
  const auto batch_bucket = [&](const char* le) {
    return e.get("idemproxy_store_batch_size_bucket", {{"op", "claim"}, {"le", le}});
  };
  CHECK(batch_bucket("2") == 0);
  CHECK(batch_bucket("4") == 1);
  CHECK(batch_bucket("8") == 2);
  CHECK(batch_bucket("+Inf") == 2);
  CHECK(e.get("idemproxy_store_batch_size_sum", {{"op", "claim"}}) == 8);
  CHECK(e.get("idemproxy_store_batch_size_count", {{"op", "complete"}}) == 0);
  CHECK(e.get("idemproxy_request_duration_seconds_count", {{"route", "create-order"}}) == 3);
  CHECK(e.get("idemproxy_request_duration_seconds_sum", {{"route", "create-order"}}) == doctest::Approx(0.017));
  CHECK(e.get("idemproxy_upstream_duration_seconds_count") == 1);
  CHECK(e.get("idemproxy_store_duration_seconds_count", {{"op", "claim"}}) == 1);
  CHECK(e.get("idemproxy_store_duration_seconds_count", {{"op", "read"}}) == 0);
  CHECK(e.get("idemproxy_takeovers_total") == 1);
  CHECK(e.get("idemproxy_fenced_writes_total") == 2);
  CHECK(e.get("idemproxy_fenced_answers_total", {{"answer", "replayed"}}) == 1);
  CHECK(e.get("idemproxy_fenced_answers_total", {{"answer", "unavailable"}}) == 0);
  CHECK(m.fenced_answers("replayed") == 1);
  CHECK(e.get("idemproxy_lease_renewals_total") == 1);
  CHECK(e.get("idemproxy_expired_deleted_total") == 520);
  CHECK(e.get("idemproxy_store_errors_total", {{"kind", "timeout"}}) == 1);
  CHECK(e.get("idemproxy_store_errors_total", {{"kind", "connection_reset"}}) == 1);
  CHECK(e.get("idemproxy_in_progress_oldest_seconds") == 42.5);
  CHECK(e.get("idemproxy_replay_cache_lookups_total", {{"result", "hit"}}) == 2);
  CHECK(e.get("idemproxy_replay_cache_lookups_total", {{"result", "miss"}}) == 1);
  CHECK(e.get("idemproxy_replay_cache_notifications_total") == 1);
  CHECK(e.get("idemproxy_replay_cache_active") == 1);
  CHECK(e.get("idemproxy_replay_cache_entries") == 3);
  CHECK(e.get("idemproxy_replay_cache_bytes") == 4096);
  check_histograms(e);
}

TEST_CASE("histogram buckets are cumulative with le as upper bound") {
  Metrics m;
  for (double v : {0.0005, 0.0007, 0.001, 0.02, 1.0, 29.9, 30.0, 100.0, -1.0}) m.upstream_duration(v);
  m.upstream_duration(NAN);  // ignored: it would poison the sum
  const auto e = parse(m.render_prometheus());
  const auto bucket = [&](const char* le) { return e.get("idemproxy_upstream_duration_seconds_bucket", {{"le", le}}); };
  CHECK(bucket("0.0005") == 2);  // 0.0005 itself and the clamped -1
  CHECK(bucket("0.001") == 4);
  CHECK(bucket("0.0025") == 4);
  CHECK(bucket("0.025") == 5);
  CHECK(bucket("1") == 6);
  CHECK(bucket("2.5") == 6);
  CHECK(bucket("30") == 8);
  CHECK(bucket("+Inf") == 9);
  CHECK(e.get("idemproxy_upstream_duration_seconds_count") == 9);
  CHECK(e.get("idemproxy_upstream_duration_seconds_sum") == doctest::Approx(0.0005 + 0.0007 + 0.001 + 0.02 + 1 + 29.9 + 30 + 100));
  check_histograms(e);
}

TEST_CASE("label values are escaped") {
  Metrics m;
  const std::string route = "we\"ird\\route\nx";
  m.request(route, Outcome::rejected, 0.1);
  m.store_error("");
  const auto text = m.render_prometheus();
  CHECK(text.find("route=\"we\\\"ird\\\\route\\nx\",outcome=\"rejected\"} 1\n") != std::string::npos);
  const auto e = parse(text);
  CHECK(e.get("idemproxy_requests_total", {{"route", route}, {"outcome", "rejected"}}) == 1);
  CHECK(e.get("idemproxy_store_errors_total", {{"kind", ""}}) == 1);
}

TEST_CASE("label cardinality is capped") {
  Metrics m;
  for (int i = 0; i < 1100; ++i) m.store_error("kind-" + std::to_string(i));
  const auto e = parse(m.render_prometheus());
  std::size_t series = 0;
  for (const auto& s : e.samples) series += s.name == "idemproxy_store_errors_total";
  CHECK(series == 1001);  // 1000 distinct values, then one overflow series
  // The four known kinds were created first, so 1000 - 4 = 996 test kinds got their own series.
  CHECK(e.get("idemproxy_store_errors_total", {{"kind", "_overflow"}}) == 1100 - 996);
  CHECK(e.get("idemproxy_store_errors_total", {{"kind", "kind-0"}}) == 1);
}

TEST_CASE("concurrent recording loses nothing, new label values included") {
  Metrics m;
  constexpr int kThreads = 8;
  constexpr int kIterations = 20'000;
  std::vector<std::thread> threads;
  std::atomic<bool> stop_scraping{false};
  // A scraper renders while the writers run: each render must stay well-formed.
  std::atomic<int> scrapes{0};
  std::atomic<bool> scrape_failed{false};
  std::thread scraper([&] {
    // REQUIRE throws; outside the test's own thread that must not reach std::terminate.
    try {
      do {
        const auto e = parse(m.render_prometheus());
        CHECK(e.types.at("idemproxy_trace_spans_total") == "counter");
        CHECK(e.types.size() == 30);
        ++scrapes;
      } while (!stop_scraping.load());
    } catch (...) {
      scrape_failed = true;
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < kIterations; ++i) {
        // Routes appear for the first time in several threads at once.
        const std::string route = "route-" + std::to_string(i % 5);
        m.request(route, static_cast<Outcome>((i + t) % kOutcomeCount), 0.001 * (i % 7));
        m.store_duration(static_cast<StoreOp>(i % kStoreOpCount), 0.0001);
        m.store_error(i % 2 ? "timeout" : "kind-" + std::to_string(i % 3));
        m.takeover();
        if (i % 10 == 0) m.expired_deleted(3);
      }
    });
  }
  for (auto& th : threads) th.join();
  stop_scraping = true;
  scraper.join();
  CHECK_FALSE(scrape_failed.load());
  CHECK(scrapes.load() > 0);

  const auto e = parse(m.render_prometheus());
  double total = 0;
  for (int r = 0; r < 5; ++r) {
    const std::string route = "route-" + std::to_string(r);
    double route_total = 0;
    for (int o = 0; o < kOutcomeCount; ++o) {
      const double v = e.get("idemproxy_requests_total", {{"route", route}, {"outcome", std::string(to_string(static_cast<Outcome>(o)))}});
      CHECK(v == static_cast<double>(m.requests(route, static_cast<Outcome>(o))));
      route_total += v;
    }
    CHECK(route_total == kThreads * kIterations / 5);
    CHECK(e.get("idemproxy_request_duration_seconds_count", {{"route", route}}) == kThreads * kIterations / 5);
    total += route_total;
  }
  CHECK(total == kThreads * kIterations);
  // Per outcome: thread t, iteration i records outcome (i + t) % 9; count it independently.
  for (int o = 0; o < kOutcomeCount; ++o) {
    double expected = 0;
    for (int t = 0; t < kThreads; ++t) {
      for (int i = 0; i < kIterations; ++i) expected += ((i + t) % kOutcomeCount == o && i % 5 == 0);
    }
    CHECK(e.get("idemproxy_requests_total", {{"route", "route-0"}, {"outcome", std::string(to_string(static_cast<Outcome>(o)))}}) == expected);
  }
  double store_ops = 0;
  for (int op = 0; op < kStoreOpCount; ++op) {
    store_ops += e.get("idemproxy_store_duration_seconds_count", {{"op", std::string(to_string(static_cast<StoreOp>(op)))}});
  }
  CHECK(store_ops == kThreads * kIterations);
  CHECK(e.get("idemproxy_store_errors_total", {{"kind", "timeout"}}) == kThreads * kIterations / 2);
  double other_kinds = 0;
  for (const char* k : {"kind-0", "kind-1", "kind-2"}) other_kinds += e.get("idemproxy_store_errors_total", {{"kind", k}});
  CHECK(other_kinds == kThreads * kIterations / 2);
  CHECK(e.get("idemproxy_takeovers_total") == kThreads * kIterations);
  CHECK(e.get("idemproxy_expired_deleted_total") == kThreads * (kIterations / 10) * 3);
  check_histograms(e);
}

TEST_CASE("outcome and store op names") {
  CHECK(to_string(Outcome::created) == "created");
  CHECK(to_string(Outcome::key_reused) == "key_reused");
  CHECK(to_string(Outcome::unknown_outcome) == "unknown_outcome");
  CHECK(to_string(Outcome::store_unavailable) == "store_unavailable");
  CHECK(to_string(Outcome::passthrough) == "passthrough");
  CHECK(to_string(Outcome::accepted) == "accepted");
  CHECK(to_string(Outcome::replay_failed) == "replay_failed");
  CHECK(to_string(StoreOp::take_over) == "take_over");
  CHECK(to_string(StoreOp::expire_lease) == "expire_lease");
  CHECK(to_string(StoreOp::cleanup) == "cleanup");
}
