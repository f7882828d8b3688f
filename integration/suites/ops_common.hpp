#pragma once
// Shared pieces of the operations suites (ops_*_test.cpp): a throwaway database per test
// where counts must be exact, a parser for the Prometheus text format, the admin API from
// the outside, and the JSON log lines the sidecar writes.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"

namespace idem::it::ops {

using suite::FreshDatabase;

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

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;  // family name -> counter | gauge | histogram

  // The sample with exactly these labels, or nullopt.
  std::optional<double> find(std::string_view name,
                             const std::map<std::string, std::string>& labels = {}) const {
    for (const auto& s : samples) {
      if (s.name == name && s.labels == labels) return s.value;
    }
    return std::nullopt;
  }
  // Like find(), failing the test when the sample is missing.
  double value(std::string_view name, const std::map<std::string, std::string>& labels = {}) const {
    const auto v = find(name, labels);
    if (!v) {
      std::string what = "no sample " + std::string(name) + "{";
      for (const auto& [k, val] : labels) what += k + "=\"" + val + "\",";
      fail(what + "} in the scrape");
    }
    return *v;
  }
  // Sum over every sample of `name` whose labels include `subset`.
  double sum(std::string_view name, const std::map<std::string, std::string>& subset = {}) const {
    double total = 0;
    for (const auto& s : samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : subset) {
        auto it = s.labels.find(k);
        match = match && it != s.labels.end() && it->second == v;
      }
      if (match) total += s.value;
    }
    return total;
  }
  bool has_family(std::string_view name) const { return types.count(std::string(name)) != 0; }
};

// Parses the text format 0.0.4 strictly: `name{label="value",...} value` lines, HELP and
// TYPE comments, escapes in label values. Fails the test on anything else, and on a sample
// whose family has no TYPE line before it.
inline Exposition parse_exposition(std::string_view text) {
  Exposition out;
  auto is_name_char = [](char c, bool first) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
           (!first && std::isdigit(static_cast<unsigned char>(c)));
  };
  std::size_t line_no = 0;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    if (nl == std::string_view::npos) fail("the exposition does not end with a newline");
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    ++line_no;
    const std::string where = "exposition line " + std::to_string(line_no) + " '" +
                              std::string(line) + "': ";
    if (line.empty()) continue;
    if (line.front() == '#') {
      if (line.starts_with("# TYPE ")) {
        const auto rest = line.substr(7);
        const auto sp = rest.find(' ');
        if (sp == std::string_view::npos) fail(where + "TYPE without a type");
        out.types[std::string(rest.substr(0, sp))] = std::string(rest.substr(sp + 1));
      } else if (!line.starts_with("# HELP ")) {
        fail(where + "unknown comment");
      }
      continue;
    }
    Sample s;
    std::size_t i = 0;
    while (i < line.size() && is_name_char(line[i], i == 0)) ++i;
    if (i == 0) fail(where + "no metric name");
    s.name = std::string(line.substr(0, i));
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const auto start = i;
        while (i < line.size() && is_name_char(line[i], i == start)) ++i;
        const std::string label(line.substr(start, i - start));
        if (label.empty() || i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') {
          fail(where + "malformed label");
        }
        i += 2;
        std::string value;
        for (;;) {
          if (i >= line.size()) fail(where + "unterminated label value");
          const char c = line[i++];
          if (c == '"') break;
          if (c == '\\') {
            if (i >= line.size()) fail(where + "dangling escape");
            const char e = line[i++];
            if (e == 'n') value += '\n';
            else if (e == '\\' || e == '"') value += e;
            else fail(where + "unknown escape");
          } else {
            value += c;
          }
        }
        if (!s.labels.emplace(label, value).second) fail(where + "duplicate label");
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) fail(where + "unterminated label set");
      ++i;  // '}'
    }
    if (i >= line.size() || line[i] != ' ') fail(where + "no space before the value");
    const std::string value(line.substr(i + 1));
    if (value == "+Inf") {
      s.value = INFINITY;
    } else if (value == "-Inf") {
      s.value = -INFINITY;
    } else if (value == "NaN") {
      s.value = NAN;
    } else {
      char* end = nullptr;
      s.value = std::strtod(value.c_str(), &end);
      if (value.empty() || end != value.c_str() + value.size()) fail(where + "bad value");
    }
    // A sample belongs to a family declared before it (histograms add suffixes).
    std::string family = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (!out.types.count(family) && family.ends_with(suffix)) {
        family.resize(family.size() - std::string_view(suffix).size());
      }
    }
    if (!out.types.count(family)) fail(where + "sample before its TYPE line");
    out.samples.push_back(std::move(s));
  }
  return out;
}

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
