#pragma once
// Shared pieces of the end-to-end suites: a fresh tenant per test (the database is shared
// by every suite, so rows are always counted per tenant), request builders and the
// row/problem readers the assertions use.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>

#include <boost/json.hpp>

#include "support/harness.hpp"

namespace idem::it::suite {

inline std::string unique(std::string_view prefix) {
  static std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string out(prefix);
  out += '-';
  auto v = rng();
  for (int i = 0; i < 12; ++i, v >>= 4) out += hex[v & 15];
  return out;
}

inline Headers order_headers(const std::string& tenant, const std::string& key,
                             Headers extra = {}) {
  Headers h{{"Content-Type", "application/json"}, {"X-Tenant-Id", tenant}};
  if (!key.empty()) h.emplace_back("Idempotency-Key", key);
  for (auto& e : extra) h.push_back(std::move(e));
  return h;
}

inline std::string problem_code(const HttpResponse& res) {
  if (res.header("Content-Type").value_or("") != "application/problem+json") return {};
  auto v = boost::json::parse(res.body);
  const auto& o = v.as_object();
  CHECK(o.contains("type"));
  CHECK(o.contains("title"));
  CHECK(o.at("status").as_int64() == res.status);
  return std::string(o.at("code").as_string());
}

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

// A database of a test's own, dropped at the end. The shared test database collects rows
// from every suite; counters that sample the whole table, and schema states (unmigrated,
// behind), are only exact in a database nobody else touches.
class FreshDatabase {
 public:
  FreshDatabase() : name_(make_name()) {
    Db server(database_url());
    // Identifiers cannot be bound as parameters; the name is ours (a prefix and hex).
    server.exec("CREATE DATABASE \"" + name_ + "\"");
  }
  ~FreshDatabase() {
    try {
      Db server(database_url());
      server.exec("DROP DATABASE IF EXISTS \"" + name_ + "\" WITH (FORCE)");
    } catch (const std::exception&) {
      // The server is shared and throwaway: a leftover database costs nothing.
    }
  }
  FreshDatabase(const FreshDatabase&) = delete;
  FreshDatabase& operator=(const FreshDatabase&) = delete;

  const std::string& name() const { return name_; }

  // DATABASE_URL pointed at this database.
  std::string url() const {
    const std::string base = database_url();
    const auto scheme = base.find("://");
    if (scheme == std::string::npos) return base + " dbname=" + name_;  // conninfo
    const auto path = base.find('/', scheme + 3);
    const auto query = base.find('?', scheme + 3);
    const std::string authority = base.substr(0, std::min(path, query));
    const std::string rest = query == std::string::npos ? std::string() : base.substr(query);
    return authority + "/" + name_ + rest;
  }

 private:
  static std::string make_name() {
    std::string n = unique("idem_scratch");
    for (auto& c : n) {
      if (c == '-') c = '_';
    }
    return n;
  }
  std::string name_;
};

}  // namespace idem::it::suite
