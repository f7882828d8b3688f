// W3C Trace Context: the strict traceparent and tracestate parsers, formatting, and how a
// request's trace is continued or started; the OTLP JSON of spans.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include <array>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "observability/trace_context.hpp"
#include "observability/tracing.hpp"

using namespace idem::obs;

namespace {

constexpr const char* kValid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

std::optional<std::vector<std::string>> state(std::vector<std::string_view> fields) {
  return parse_tracestate(fields);
}

}  // namespace

TEST_CASE("traceparent: the Recommendation's example parses") {
  const auto tp = parse_traceparent(kValid);
  REQUIRE(tp);
  CHECK(tp->version == 0);
  CHECK(to_hex(tp->trace_id) == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(to_hex(tp->parent_id) == "00f067aa0ba902b7");
  CHECK(tp->flags == 1);
  CHECK(tp->sampled());
  CHECK(format_traceparent(tp->trace_id, tp->parent_id, tp->flags) == kValid);
  const auto unsampled = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  REQUIRE(unsampled);
  CHECK_FALSE(unsampled->sampled());
}

TEST_CASE("traceparent: everything else is refused") {
  const std::string v = kValid;
  const std::vector<std::string> bad = {
      "",
      v.substr(0, 54),                                           // too short
      v + "-",                                                   // version 00 has no more fields
      v + "x",
      "ff" + v.substr(2),                                        // version ff is invalid
      "0g" + v.substr(2),                                        // not hex
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // uppercase
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // zero trace id
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // zero parent id
      "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // wrong separator
      "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",  // dash misplaced
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
      " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  // later version, no dash
  };
  for (const auto& b : bad) {
    INFO(b);
    CHECK_FALSE(parse_traceparent(b));
  }
}

TEST_CASE("traceparent: a later version is read by its first four fields") {
  const auto tp = parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds");
  REQUIRE(tp);
  CHECK(tp->version == 0xcc);
  CHECK(parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
}

TEST_CASE("tracestate: members over every field, spaces and empty members allowed") {
  auto s = state({"rojo=00f067aa0ba902b7, congo=t61rcWkgMzE", " ,,", "tenant@vendor=x y"});
  REQUIRE(s);
  CHECK(*s == std::vector<std::string>{"rojo=00f067aa0ba902b7", "congo=t61rcWkgMzE", "tenant@vendor=x y"});
  CHECK(format_tracestate(*s) == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE,tenant@vendor=x y");
  auto empty = state({});
  REQUIRE(empty);
  CHECK(empty->empty());
  CHECK(state({"a=1\t,\tb=2"}));
  CHECK(state({"0tenant@sys=v"}));  // a tenant id may start with a digit
}

TEST_CASE("tracestate: a malformed member, a repeated key or too many members drop it all") {
  const std::vector<std::string> bad = {
      "novalue", "=v", "Upper=v", "1abc=v", "a=", "a=b\tc", "a=b=c", "a=\x01", "a@=v", "@b=v",
      "a@B=v", "a@bcdefghijklmnop=v", "a=1,a=2", std::string(257, 'a') + "=v",
      "a=" + std::string(257, 'v'), "a\x7f=v"};
  for (const auto& b : bad) {
    INFO(b);
    CHECK_FALSE(state({b}));
  }
  std::string many;
  for (int i = 0; i < 33; ++i) many += "k" + std::to_string(i) + "=v,";
  CHECK_FALSE(state({many}));
  many.clear();
  for (int i = 0; i < 32; ++i) many += "k" + std::to_string(i) + "=v,";
  CHECK(state({many}));
  // A repeat across two fields counts too.
  CHECK_FALSE(state({"a=1", "a=2"}));
}

TEST_CASE("continue_trace: the client's trace is continued, with a span of the sidecar's own") {
  const auto t = continue_trace({kValid}, {"rojo=1"}, false);
  CHECK(to_hex(t.trace_id) == "4bf92f3577b34da6a3ce929d0e0e4736");
  REQUIRE(t.client_parent);
  CHECK(to_hex(*t.client_parent) == "00f067aa0ba902b7");
  CHECK(to_hex(t.server_span) != "00f067aa0ba902b7");
  CHECK(to_hex(t.server_span) != "0000000000000000");
  CHECK(t.sampled());  // the client's decision, whatever sample_new says
  CHECK(t.tracestate == std::vector<std::string>{"rojo=1"});
  // Undefined flag bits are not passed on.
  const auto f = continue_trace({"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff"}, {}, false);
  CHECK(f.flags == 1);
  // An invalid tracestate is dropped, the traceparent still continued.
  const auto d = continue_trace({kValid}, {"a=1,a=2"}, false);
  CHECK(to_hex(d.trace_id) == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(d.tracestate.empty());
}

TEST_CASE("continue_trace: no, an invalid or two traceparents start a new trace") {
  for (const auto& fields : std::vector<std::vector<std::string_view>>{
           {}, {"00-zz"}, {kValid, kValid}}) {
    const auto t = continue_trace(fields, {"rojo=1"}, true);
    CHECK(to_hex(t.trace_id) != "4bf92f3577b34da6a3ce929d0e0e4736");
    CHECK(to_hex(t.trace_id) != std::string(32, '0'));
    CHECK_FALSE(t.client_parent);
    CHECK(t.tracestate.empty());  // another trace's state means nothing here
    CHECK(t.sampled());
  }
  CHECK_FALSE(continue_trace({}, {}, false).sampled());
  CHECK(to_hex(new_trace_id()) != to_hex(new_trace_id()));
}

// Ids come from a generator per thread, seeded from the system's randomness: never zero,
// no repeats within a thread or across threads, and every byte position takes many values
// (a generator stuck on a constant byte, or two threads seeded alike, would fail this).
TEST_CASE("new trace and span ids: non-zero, distinct within and across threads") {
  constexpr int kPerThread = 20000;
  std::vector<std::vector<std::string>> ids(4);
  std::vector<std::thread> threads;
  for (auto& out : ids) {
    threads.emplace_back([&out] {
      for (int i = 0; i < kPerThread; ++i) {
        out.push_back(to_hex(new_trace_id()));
        out.push_back(to_hex(new_span_id()));
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::string> all;
  std::array<std::set<char>, 32> seen_at{};
  std::size_t zeros = 0;
  for (const auto& out : ids) {
    for (const auto& id : out) {
      if (id == std::string(id.size(), '0')) ++zeros;
      all.insert(id);
      for (std::size_t i = 0; i < id.size(); ++i) seen_at[i].insert(id[i]);
    }
  }
  CHECK(zeros == 0);
  CHECK(all.size() == 4u * 2 * kPerThread);  // no id repeated
  for (const auto& digits : seen_at) CHECK(digits.size() == 16);
}

TEST_CASE("spans_json is an OTLP ExportTraceServiceRequest with hex ids") {
  Span s;
  s.trace_id = parse_traceparent(kValid)->trace_id;
  s.span_id = parse_traceparent(kValid)->parent_id;
  s.parent = new_span_id();
  s.name = "claim";
  s.kind = SpanKind::server;
  s.start_unix_ns = 1700000000000000000;
  s.end_unix_ns = 1700000000000000123;
  s.error = true;
  s.attributes = {{"idemproxy.step", "insert"}};
  s.int_attributes = {{"http.response.status_code", 201}};
  const auto root = boost::json::parse(spans_json({s})).as_object();
  const auto& rs = root.at("resourceSpans").as_array().at(0).as_object();
  CHECK(rs.at("resource").at("attributes").at(0).at("value").at("stringValue") == "idemproxy");
  const auto& span = rs.at("scopeSpans").at(0).at("spans").at(0).as_object();
  CHECK(span.at("traceId") == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(span.at("spanId") == "00f067aa0ba902b7");
  CHECK(std::string(span.at("parentSpanId").as_string()) == to_hex(*s.parent));
  CHECK(span.at("kind") == 2);
  CHECK(span.at("startTimeUnixNano") == "1700000000000000000");
  CHECK(span.at("endTimeUnixNano") == "1700000000000000123");
  CHECK(span.at("status").at("code") == 2);
  CHECK(span.at("attributes").at(0).at("key") == "idemproxy.step");
  CHECK(span.at("attributes").at(1).at("value").at("intValue") == "201");
  // A root span has no parentSpanId at all.
  s.parent.reset();
  const auto again = boost::json::parse(spans_json({s}));
  CHECK_FALSE(again.at("resourceSpans").at(0).at("scopeSpans").at(0).at("spans").at(0).as_object().contains("parentSpanId"));
}
