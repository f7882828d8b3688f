#pragma once
// Shared pieces of the end-to-end suites: a fresh tenant per test (the database is shared
// by every suite, so rows are always counted per tenant), request builders and the
// row/problem readers the assertions use.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>

#include <boost/json.hpp>

#include "common/text.hpp"
#include "support/harness.hpp"
#include "test_support/problem.hpp"

namespace idem::it::suite {

inline std::string unique(std::string_view prefix) {
  static std::mt19937_64 rng{std::random_device{}()};
  std::string out(prefix);
  out += '-';
  text::append_hex_digits(out, static_cast<unsigned>(rng()), 8);
  text::append_hex_digits(out, static_cast<unsigned>(rng()), 4);
  return out;
}

inline Headers order_headers(const std::string& tenant, const std::string& key,
                             Headers extra = {}) {
  Headers h{{"Content-Type", "application/json"}, {"X-Tenant-Id", tenant}};
  if (!key.empty()) h.emplace_back("Idempotency-Key", key);
  for (auto& e : extra) h.push_back(std::move(e));
  return h;
}

using test::problem_code;

struct RowState {
  std::string state;
  std::int64_t attempt = 0;
  std::int64_t fence = 0;  // fencing_token
  std::optional<int> status;
  std::string body;
  std::string fingerprint;
  std::string resource_id;
  bool lease_expired = false;
};

inline std::int64_t count_rows(Db& db, const std::string& tenant) {
  return db.scalar_int("SELECT count(*) FROM idempotency_requests WHERE tenant_id = $1",
                       {tenant});
}

inline std::optional<RowState> read_row(Db& db, const std::string& tenant, const std::string& key,
                                        const std::string& scope = "POST /orders") {
  auto rows = db.query(
      "SELECT state, attempt_token::text, response_status::text, "
      "coalesce(convert_from(response_body, 'UTF8'), ''), request_fingerprint, "
      "coalesce(resource_id, ''), (lease_expires_at <= now())::text, fencing_token::text "
      "FROM idempotency_requests WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3",
      {tenant, scope, key});
  if (rows.empty()) return std::nullopt;
  const auto& r = rows.front();
  RowState s;
  s.state = r[0].value_or("");
  s.attempt = std::stoll(r[1].value_or("0"));
  if (r[2]) s.status = std::stoi(*r[2]);
  s.body = r[3].value_or("");
  s.fingerprint = r[4].value_or("");
  s.resource_id = r[5].value_or("");
  s.lease_expired = r[6].value_or("") == "true";
  s.fence = std::stoll(r[7].value_or("0"));
  return s;
}

// Business calls the backend saw for one tenant (the backend is shared within a test).
inline std::vector<BackendCall> calls_for(TestBackend& backend, const std::string& tenant) {
  std::vector<BackendCall> out;
  for (auto& c : backend.calls()) {
    if (c.header("X-Tenant-Id").value_or("") == tenant) out.push_back(std::move(c));
  }
  return out;
}

inline SidecarOptions options_for(const TestBackend& backend) {
  SidecarOptions o;
  o.upstream_url = backend.url();
  o.log_level = "warn";
  return o;
}

// A database of a test's own, dropped at the end: ScratchDatabase
// (test_support/postgres.hpp); FreshDatabase is its earlier name here.
using FreshDatabase = ScratchDatabase;

}  // namespace idem::it::suite
