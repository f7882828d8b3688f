#pragma once
// Shared pieces of the security suites (security_*_test.cpp): what an adversarial client
// can do with raw bytes on one connection, against a real sidecar, backend and PostgreSQL.
// Every case asserts what the backend recorded and which rows exist, not only statuses.
#include <cstdio>
#include <functional>
#include <string>

#include "common.hpp"
#include "common/text.hpp"

namespace idem::it::security {

using namespace idem::it::suite;

inline const std::string kOrder = R"({"customer_id":"c-1","currency":"EUR","amount":1000})";

// The test backend's X-Test-*-Hex headers carry bytes as hex.
inline std::string hex(std::string_view bytes) { return text::to_hex(bytes); }

// A sidecar with the principal check on and short body and header timeouts, in front of a
// test backend; one tenant and one db connection per test.
struct World {
  explicit World(const std::function<void(SidecarOptions&)>& adjust = {}) : db(database_url()) {
    auto o = options_for(backend);
    o.principal_header = "X-User-Id";
    o.max_header_bytes = "4KiB";
    o.body_timeout = "3s";
    o.header_timeout = "3s";
    if (adjust) adjust(o);
    sidecar = std::make_unique<Sidecar>(o);
    client = std::make_unique<HttpClient>(sidecar->port());
  }

  // Raw bytes in, the parsed response out (the connection is closed afterwards).
  HttpResponse raw(std::string_view bytes) {
    return parse_response(raw_exchange(sidecar->port(), bytes));
  }

  std::vector<BackendCall> calls() { return backend.calls(); }
  std::int64_t rows() { return count_rows(db, tenant); }

  TestBackend backend;
  Db db;
  std::unique_ptr<Sidecar> sidecar;
  std::unique_ptr<HttpClient> client;
  std::string tenant = unique("tenant");
};

// "POST <target> HTTP/1.1" with Host, a JSON content type and `fields` (each "Name: value"
// line ending in CRLF), then `rest` (the end of the header and the body).
inline std::string raw_post(std::string_view target, std::string_view fields, std::string_view rest) {
  return "POST " + std::string(target) + " HTTP/1.1\r\nHost: sidecar\r\n"
         "Content-Type: application/json\r\n" + std::string(fields) + std::string(rest);
}

inline std::string with_length(std::string_view body) {
  return "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}

// A chunked body in one chunk, then a trailer section made of `trailer` lines.
inline std::string chunked(std::string_view body, std::string_view trailer) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx", body.size());
  return "Transfer-Encoding: chunked\r\n\r\n" + std::string(size) + "\r\n" + std::string(body) +
         "\r\n0\r\n" + std::string(trailer) + "\r\n";
}

inline bool has_underscore_name(const BackendCall& call) {
  for (const auto& [name, value] : call.headers) {
    if (name.find('_') != std::string::npos) return true;
  }
  return false;
}

}  // namespace idem::it::security
