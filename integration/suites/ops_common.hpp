#pragma once
// Shared pieces of the operations suites (ops_*_test.cpp): a throwaway database per test
// where counts must be exact, a parser for the Prometheus text format, the admin API from
// the outside, and the JSON log lines the sidecar writes.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"
#include "test_support/prometheus.hpp"

namespace idem::it::ops {

// `url` with `password` added: in the user-info of a URI (the usual spelling), else as a
// conninfo keyword. A trust-auth server never asks for it, so it changes nothing but what
// the sidecar could leak.
inline std::string with_password(const std::string& url, const std::string& password) {
  const auto scheme = url.find("://");
  if (scheme == std::string::npos) return url + " password=" + password;
  const auto at = url.find('@', scheme + 3);
  const auto slash = url.find('/', scheme + 3);
  if (at != std::string::npos && at < slash &&
      url.substr(scheme + 3, at - scheme - 3).find(':') == std::string::npos) {
    return url.substr(0, at) + ":" + password + url.substr(at);
  }
  return url + (url.find('?') == std::string::npos ? "?" : "&") + "password=" + password;
}

// ------------------------------------------------------------------ Prometheus exposition

// The strict text-format parser (test_support/prometheus.hpp).
using test::Exposition;
using test::parse_exposition;
using test::Sample;

// ------------------------------------------------------------------ the admin API

// RFC 3986: everything but unreserved characters percent-encoded.
inline std::string url_encode(std::string_view s) {
  std::string out;
  text::append_uri_component(out, s);
  return out;
}

inline std::string record_path(std::string_view tenant, std::string_view scope,
                               std::string_view key) {
  return "/admin/records/" + url_encode(tenant) + "/" + url_encode(scope) + "/" + url_encode(key);
}

inline Headers bearer(const std::string& token) { return {{"Authorization", "Bearer " + token}}; }

// Admin address for SidecarOptions::admin_listen, and its port.
struct AdminPort {
  std::uint16_t port = free_port();
  std::string listen() const { return "127.0.0.1:" + std::to_string(port); }
};

inline Exposition scrape(std::uint16_t admin_port) {
  HttpClient client(admin_port);
  auto res = client.get("/metrics");
  if (res.status != 200) fail("GET /metrics answered " + std::to_string(res.status));
  if (res.header("Content-Type") != "text/plain; version=0.0.4; charset=utf-8") {
    fail("GET /metrics has Content-Type " + res.header("Content-Type").value_or("(none)"));
  }
  return parse_exposition(res.body);
}

// ------------------------------------------------------------------ JSON log lines

// Every line of a sidecar log that is a JSON object (log.format: json); fails the test on a
// line that is not (the sidecar writes nothing else to its output).
inline std::vector<boost::json::object> json_lines(const std::string& log) {
  std::vector<boost::json::object> out;
  std::size_t start = 0;
  while (start < log.size()) {
    auto end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    const std::string line = log.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    boost::system::error_code ec;
    auto v = boost::json::parse(line, ec);
    if (ec || !v.is_object()) fail("a log line is not a JSON object: " + line);
    out.push_back(std::move(v.as_object()));
  }
  return out;
}

inline std::string str(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

}  // namespace idem::it::ops
