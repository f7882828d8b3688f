// W3C Trace Context end to end: the client's traceparent continued towards the backend
// with a span of the sidecar's own as parent, tracestate passed on, the trace id in the
// access log, in the record (PostgreSQL) and on the answer, a replay naming the original's
// trace; and the OTLP/HTTP JSON export of the spans to a collector (a real HTTP server on
// a local port that records what it is sent: test_support/http_sink.hpp).
#include <future>
#include <set>
#include <thread>

#include <boost/json.hpp>

#include "ops_common.hpp"
#include "test_support/http_sink.hpp"

using namespace idem::it;
using namespace idem::it::suite;
using namespace idem::it::ops;

namespace {

// An OTLP/HTTP collector: records each export's target, content type and body, answers
// 200 with an empty ExportTraceServiceResponse.
class Collector {
 public:
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(sink_.port()) + "/v1/traces"; }
  std::vector<idem::test::HttpSink::Post> posts() { return sink_.posts(); }
  // Every span of every export, flattened.
  std::vector<boost::json::object> spans() {
    std::vector<boost::json::object> out;
    for (const auto& p : posts()) {
      const auto root = boost::json::parse(p.body);
      for (const auto& rs : root.at("resourceSpans").as_array()) {
        for (const auto& ss : rs.at("scopeSpans").as_array()) {
          for (const auto& s : ss.at("spans").as_array()) out.push_back(s.as_object());
        }
      }
    }
    return out;
  }

 private:
  idem::test::HttpSink sink_;
};

constexpr const char* kClientTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr const char* kClientSpan = "00f067aa0ba902b7";

std::string traceparent(const std::string& trace, const std::string& span, const char* flags = "01") {
  return "00-" + trace + "-" + span + "-" + flags;
}

// "00-<trace>-<parent>-<flags>" split, checking the shape.
struct Parent {
  std::string trace, span, flags;
};
Parent split_traceparent(const std::string& v) {
  REQUIRE(v.size() == 55);
  return {v.substr(3, 32), v.substr(36, 16), v.substr(53, 2)};
}

const boost::json::object* span_named(const std::vector<boost::json::object>& spans,
                                      const std::string& trace, const std::string& name) {
  for (const auto& s : spans) {
    if (str(s, "traceId") == trace && str(s, "name") == name) return &s;
  }
  return nullptr;
}

std::string attribute(const boost::json::object& span, const std::string& key) {
  for (const auto& a : span.at("attributes").as_array()) {
    if (str(a.as_object(), "key") == key) {
      const auto& v = a.at("value").as_object();
      return v.contains("stringValue") ? str(v, "stringValue") : str(v, "intValue");
    }
  }
  return "";
}

std::vector<boost::json::object> access_lines(const std::string& log) {
  std::vector<boost::json::object> out;
  for (auto& line : json_lines(log)) {
    if (str(line, "type") == "access") out.push_back(std::move(line));
  }
  return out;
}

}  // namespace

TEST_CASE("trace context: continued upstream, recorded, named by the replay, exported over OTLP") {
  TestBackend backend;
  Collector collector;
  AdminPort admin;
  auto o = options_for(backend);
  o.log_level = "info";
  o.log_format = "json";
  o.admin_listen = admin.listen();
  o.extra_yaml = "tracing:\n  otlp_endpoint: \"" + collector.endpoint() + "\"\n  sample: 1\n";
  o.routes[0].wait = "300ms";
  Sidecar sidecar(o);
  HttpClient client(sidecar.port());
  Db db(database_url());
  const auto tenant = unique("tenant");
  const std::string key = unique("key");
  const std::string body = R"({"customer_id":"c-1","amount":1000})";

  // The first request, in the client's trace, with a tracestate.
  auto first = client.post("/orders", body,
                           order_headers(tenant, key, {{"traceparent", traceparent(kClientTrace, kClientSpan)},
                                                       {"tracestate", "rojo=00f067aa0ba902b7"},
                                                       {"tracestate", "congo=t61rcWkgMzE"}}));
  REQUIRE(first.status == 201);
  CHECK(first.header("X-Idempotency-Trace-Id") == kClientTrace);
  auto calls = calls_for(backend, tenant);
  REQUIRE(calls.size() == 1);
  // The backend is in the client's trace, its parent a span of the sidecar's own.
  REQUIRE(calls[0].headers_named("traceparent").size() == 1);
  const auto up = split_traceparent(*calls[0].header("traceparent"));
  CHECK(up.trace == kClientTrace);
  CHECK(up.span != kClientSpan);
  CHECK(up.flags == "01");
  CHECK(calls[0].header("tracestate") == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
  // The record holds the trace of the answer it recorded.
  CHECK(db.scalar("SELECT trace_id FROM idempotency_requests WHERE tenant_id = $1 AND idempotency_key = $2",
                  {tenant, key}) == kClientTrace);

  // The retry comes in a trace of its own; its answer names the original's.
  const std::string retry_trace = "0af7651916cd43dd8448eb211c80319c";
  auto replay = client.post("/orders", body,
                            order_headers(tenant, key, {{"traceparent", traceparent(retry_trace, "b7ad6b7169203331")}}));
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(replay.header("X-Idempotency-Trace-Id") == kClientTrace);
  CHECK(calls_for(backend, tenant).size() == 1);
  // And so does the admin API's view of the record.
  {
    HttpClient a(admin.port);
    auto rec = a.get(record_path(tenant, "POST /orders", key));
    REQUIRE(rec.status == 200);
    CHECK(str(boost::json::parse(rec.body).as_object(), "trace_id") == kClientTrace);
  }

  // The access log: the first answer's line and the replay's both lead to the original.
  std::string log;
  wait_until([&] {
    log = sidecar.log();
    return access_lines(log).size() >= 2;
  }, 10s, "two access lines");
  std::vector<boost::json::object> ours;
  for (auto& l : access_lines(log)) {
    if (str(l, "path") == "/orders") ours.push_back(l);
  }
  REQUIRE(ours.size() == 2);
  CHECK(str(ours[0], "trace_id") == kClientTrace);
  CHECK(str(ours[0], "outcome") == "created");
  CHECK_FALSE(ours[0].contains("record_trace_id"));
  CHECK(str(ours[1], "trace_id") == retry_trace);
  CHECK(str(ours[1], "record_trace_id") == kClientTrace);
  CHECK(str(ours[1], "outcome") == "replayed");

  // The spans reach the collector, off the request path, linked as one tree.
  std::vector<boost::json::object> spans;
  wait_until([&] {
    spans = collector.spans();
    return span_named(spans, kClientTrace, "complete") && span_named(spans, retry_trace, "POST /orders");
  }, 15s, "the spans of both requests at the collector");
  for (const auto& p : collector.posts()) {
    CHECK(p.target == "/v1/traces");
    CHECK(p.content_type == "application/json");
  }
  const auto* server = span_named(spans, kClientTrace, "POST /orders");
  const auto* claim = span_named(spans, kClientTrace, "claim");
  const auto* forward = span_named(spans, kClientTrace, "forward");
  const auto* complete = span_named(spans, kClientTrace, "complete");
  REQUIRE(server);
  REQUIRE(claim);
  REQUIRE(forward);
  REQUIRE(complete);
  CHECK(str(*server, "parentSpanId") == kClientSpan);
  CHECK(server->at("kind") == 2);
  CHECK(attribute(*server, "idemproxy.outcome") == "created");
  CHECK(attribute(*server, "http.response.status_code") == "201");
  const auto server_id = str(*server, "spanId");
  CHECK(str(*claim, "parentSpanId") == server_id);
  CHECK(attribute(*claim, "idemproxy.step") == "insert");
  CHECK(str(*complete, "parentSpanId") == server_id);
  // The backend's parent is the forward span, exported.
  CHECK(str(*forward, "spanId") == up.span);
  CHECK(str(*forward, "parentSpanId") == server_id);
  CHECK(forward->at("kind") == 3);
  CHECK(attribute(*forward, "http.response.status_code") == "201");
  // Times nest: the server span holds its children.
  const auto t = [](const boost::json::object& s, const char* k) { return std::stoll(str(s, k)); };
  CHECK(t(*server, "startTimeUnixNano") <= t(*claim, "startTimeUnixNano"));
  CHECK(t(*forward, "endTimeUnixNano") <= t(*complete, "endTimeUnixNano"));
  CHECK(t(*complete, "endTimeUnixNano") <= t(*server, "endTimeUnixNano"));
  // The replay forwarded nothing and says whose answer it gave.
  const auto* replay_server = span_named(spans, retry_trace, "POST /orders");
  CHECK(attribute(*replay_server, "idemproxy.record_trace_id") == kClientTrace);
  CHECK(attribute(*replay_server, "idemproxy.outcome") == "replayed");
  CHECK_FALSE(span_named(spans, retry_trace, "forward"));
  // Every span is of resource idemproxy and counted as exported.
  for (const auto& p : collector.posts()) {
    const auto root = boost::json::parse(p.body);
    CHECK(root.at("resourceSpans").at(0).at("resource").at("attributes").at(0).at("value").at("stringValue") == "idemproxy");
  }
  // A duplicate that waits for a held owner (and gives up after the route's wait) has a
  // wait span in its own trace.
  const auto hold = unique("hold");
  const auto held_key = unique("key");
  auto owner = std::async(std::launch::async, [&] {
    HttpClient c(sidecar.port());
    return c.post("/orders", body, order_headers(tenant, held_key, {{"X-Test-Hold", hold}}));
  });
  backend.wait_for_call([&](const BackendCall& c) { return c.header("X-Test-Hold") == hold; },
                        "the held owner to reach the backend");
  const std::string waiting_trace = "11f7651916cd43dd8448eb211c80319c";
  auto dup = client.post("/orders", body,
                         order_headers(tenant, held_key, {{"traceparent", traceparent(waiting_trace, "c7ad6b7169203331")}}));
  CHECK(problem_code(dup) == "idempotency_in_progress");
  CHECK(dup.header("X-Idempotency-Trace-Id") == waiting_trace);
  backend.release(hold);
  CHECK(owner.get().status == 201);
  wait_until([&] {
    spans = collector.spans();
    return span_named(spans, waiting_trace, "wait") != nullptr;
  }, 15s, "the duplicate's wait span");
  CHECK(str(*span_named(spans, waiting_trace, "wait"), "parentSpanId") ==
        str(*span_named(spans, waiting_trace, "POST /orders"), "spanId"));

  wait_until([&] { return scrape(admin.port).value("idemproxy_trace_spans_total", {{"result", "exported"}}) ==
                          static_cast<double>(collector.spans().size()); },
             10s, "the exported span count to match what the collector received");
  CHECK(scrape(admin.port).value("idemproxy_trace_spans_total", {{"result", "dropped"}}) == 0);
}

TEST_CASE("trace context: an invalid traceparent starts a new trace and drops tracestate") {
  TestBackend backend;
  auto o = options_for(backend);
  Sidecar sidecar(o);  // no tracing section: context is still continued, nothing exported
  HttpClient client(sidecar.port());
  const auto tenant = unique("tenant");
  const std::vector<std::string> invalid = {
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // uppercase
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // zero trace id
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // version ff
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"};
  std::set<std::string> seen;
  for (const auto& tp : invalid) {
    INFO(tp);
    const auto key = unique("key");
    auto res = client.post("/orders", R"({"customer_id":"c-1","amount":1})",
                           order_headers(tenant, key, {{"traceparent", tp}, {"tracestate", "rojo=1"}}));
    REQUIRE(res.status == 201);
    auto calls = calls_for(backend, tenant);
    REQUIRE(!calls.empty());
    const auto& call = calls.back();
    const auto up = split_traceparent(*call.header("traceparent"));
    CHECK(up.trace != kClientTrace);
    CHECK(up.trace != std::string(32, '0'));
    CHECK(up.flags == "00");  // nothing samples a trace idemproxy starts without an exporter
    CHECK_FALSE(call.header("tracestate"));
    CHECK(res.header("X-Idempotency-Trace-Id") == up.trace);
    CHECK(seen.insert(up.trace).second);
  }
  // Two traceparent fields are ambiguous: a new trace as well.
  auto res = client.get("/health", {{"X-Tenant-Id", tenant},
                                    {"traceparent", traceparent(kClientTrace, kClientSpan)},
                                    {"traceparent", traceparent(kClientTrace, kClientSpan)}});
  CHECK(res.status == 200);
  const auto last = backend.calls().back();
  CHECK(last.target == "/health");
  // A pass-through request is traced too; a backend's own trace marker never reaches the client.
  CHECK(split_traceparent(*last.header("traceparent")).trace != kClientTrace);
  CHECK_FALSE(res.header("X-Idempotency-Trace-Id"));
}

// idemproxy's own lookups of the backend (a re-fetched replay, a reconciliation) are spans
// of their own, like forward: children of the server span, and the backend's parent.
TEST_CASE("trace context: refetch and reconcile lookups are exported as spans of their own") {
  TestBackend backend;
  Collector collector;
  auto o = options_for(backend);
  o.upstream_response_timeout = "500ms";  // the held first attempt's outcome becomes unknown
  o.extra_yaml = "tracing:\n  otlp_endpoint: \"" + collector.endpoint() + "\"\n  sample: 1\n";
  o.routes[0].extra_yaml = "replay:\n  mode: refetch\n";
  RouteOptions reconciled;
  reconciled.name = "create-payment";
  reconciled.path = "/payments";
  reconciled.extra_yaml =
      "on_unknown_outcome: reconcile\nreconcile:\n  method: GET\n  path: /payments/by-operation/{operation_id}\n";
  o.routes.push_back(reconciled);
  Sidecar sidecar(o);
  HttpClient client(sidecar.port());
  const auto tenant = unique("tenant");
  const std::string body = R"({"customer_id":"c-1","amount":1000})";
  // The backend's parent span for the call to `target`.
  auto backend_parent = [&](const std::string& method, const std::string& prefix) {
    const auto call = backend.wait_for_call(
        [&](const BackendCall& c) {
          return c.method == method && c.target.starts_with(prefix) && c.header("X-Tenant-Id") == tenant;
        },
        "the backend call " + method + " " + prefix);
    return split_traceparent(call.header("traceparent").value_or(""));
  };

  // A re-fetched replay: its GET of the recorded Location is the refetch span.
  const auto key = unique("key");
  REQUIRE(client.post("/orders", body,
                      order_headers(tenant, key, {{"X-Test-Header-Hex", idem::text::to_hex("Location: /orders/o-1")}}))
              .status == 201);
  const std::string refetch_trace = "21f7651916cd43dd8448eb211c80319c";
  const auto replay = client.post("/orders", body,
                                  order_headers(tenant, key, {{"traceparent", traceparent(refetch_trace, "d7ad6b7169203331")}}));
  CHECK(replay.header("Idempotent-Replay-Body") == "current");
  const auto fetch = backend_parent("GET", "/orders/o-1");
  CHECK(fetch.trace == refetch_trace);

  // A takeover after an unknown outcome asks the backend first: the reconcile span.
  const auto hold = unique("hold");
  const auto pay_key = unique("key");
  const auto lost = client.post("/payments", body, order_headers(tenant, pay_key, {{"X-Test-Hold", hold}}));
  CHECK(lost.status == 504);
  const std::string reconcile_trace = "31f7651916cd43dd8448eb211c80319c";
  const auto retry = client.post(
      "/payments", body, order_headers(tenant, pay_key, {{"traceparent", traceparent(reconcile_trace, "e7ad6b7169203331")}}));
  CHECK(retry.status == 200);  // the lookup's 2xx is the operation's answer
  backend.release(hold);
  const auto lookup = backend_parent("GET", "/payments/by-operation/");
  CHECK(lookup.trace == reconcile_trace);

  std::vector<boost::json::object> spans;
  wait_until([&] {
    spans = collector.spans();
    return span_named(spans, refetch_trace, "POST /orders") && span_named(spans, reconcile_trace, "POST /payments");
  }, 15s, "the spans of the replay and of the takeover at the collector");
  const auto check_lookup = [&](const std::string& trace, const char* name, const Parent& seen,
                                const char* result, const char* server_name) {
    CAPTURE(name);
    const auto* span = span_named(spans, trace, name);
    const auto* server = span_named(spans, trace, server_name);
    REQUIRE(span);
    REQUIRE(server);
    CHECK(str(*span, "spanId") == seen.span);  // the backend's parent
    CHECK(str(*span, "parentSpanId") == str(*server, "spanId"));
    CHECK(span->at("kind") == 3);
    CHECK(span->at("status").at("code") == 0);
    CHECK(attribute(*span, std::string("idemproxy.") + name) == result);
    CHECK(attribute(*span, "http.response.status_code") == "200");
    const auto t = [](const boost::json::object& s, const char* k) { return std::stoll(str(s, k)); };
    CHECK(t(*server, "startTimeUnixNano") <= t(*span, "startTimeUnixNano"));
    CHECK(t(*span, "endTimeUnixNano") <= t(*server, "endTimeUnixNano"));
  };
  check_lookup(refetch_trace, "refetch", fetch, "fetched", "POST /orders");
  CHECK_FALSE(span_named(spans, refetch_trace, "forward"));
  check_lookup(reconcile_trace, "reconcile", lookup, "found", "POST /payments");
  CHECK(attribute(*span_named(spans, reconcile_trace, "reconcile"), "idemproxy.attempt") == "2");
  // The claim that found the lapsed owner, then the takeover the lookup was made for.
  CHECK(std::any_of(spans.begin(), spans.end(), [&](const boost::json::object& s) {
    return str(s, "traceId") == reconcile_trace && str(s, "name") == "claim" &&
           attribute(s, "idemproxy.step") == "take_over";
  }));
}
