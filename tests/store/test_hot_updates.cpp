// The lean record (migration 0008, docs/architecture.md "The record"): a completion changes
// no indexed column, so PostgreSQL writes it as a HOT update, in the row's own page and
// without new index entries. Checked on the store's own statements (pg_store_statements(),
// the texts the sidecar prepares), each key claimed and completed in statements of their
// own as a request does, and counted by PostgreSQL itself: pg_stat_user_tables'
// n_tup_hot_upd against n_tup_upd, summed over the partitions where the table is
// partitioned (ctest unit.store.partitioned). A completion that moved expires_at, or an
// index whose key or predicate names state, lease_expires_at or any other column the
// completion writes, makes every completion non-HOT and fails this test.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "store/harness.hpp"
#include "store/pg_store.hpp"

using namespace idem;
using idem::test::store_database;

namespace {

const std::string& statement_text(const std::string& name) {
  for (const auto& s : store::pg_store_statements()) {
    if (s.name == name) return s.sql;
  }
  FAIL("no statement " << name);
  static const std::string none;
  return none;
}

struct Updates {
  std::int64_t all = 0;
  std::int64_t hot = 0;
};

// The table's update counters as PostgreSQL recorded them. This session's own counters
// are flushed first: PostgreSQL 15 flushes them as the session goes idle once asked to,
// before the next statement is read, and the next statement is a new transaction that
// reads them afresh.
Updates updates(test::Db& sql) {
  sql.exec("SELECT pg_stat_force_next_flush()");
  const auto row = sql.query(
      "SELECT coalesce(sum(n_tup_upd), 0)::text, coalesce(sum(n_tup_hot_upd), 0)::text"
      " FROM pg_stat_user_tables WHERE relid IN"
      " (SELECT relid FROM pg_partition_tree('idempotency_requests')"
      "  UNION SELECT 'idempotency_requests'::regclass)");
  REQUIRE(row.size() == 1);
  return {std::stoll(*row[0][0]), std::stoll(*row[0][1])};
}

// An answer of the size an order API gives: a JSON body of a few hundred bytes and the
// replayed headers.
const std::string kBody(320, 'o');
const std::string kHeaders = R"([["content-type","application/json"],["location","/orders/1"]])";

constexpr int kKeys = 600;
constexpr int kBatch = 8;

// Every completion since `before` counted, and at least 90 % of them HOT.
void check_hot_share(test::Db& sql, const Updates& before) {
  const auto after = updates(sql);
  const auto all = after.all - before.all;
  const auto hot = after.hot - before.hot;
  CHECK(all == kKeys);
  INFO(hot << " of " << all << " completions HOT");
  CHECK(hot * 100 >= all * 90);
  sql.exec("TRUNCATE idempotency_requests CASCADE");
}

}  // namespace

TEST_CASE("lean record: completions are HOT updates (single statements)") {
  test::Db sql(store_database().url());
  sql.exec("TRUNCATE idempotency_requests CASCADE");
  const auto before = updates(sql);
  for (int i = 0; i < kKeys; ++i) {
    const std::string key = "hot-" + std::to_string(i);
    // claim: tenant, endpoint, key, fingerprint, principal, lease ms, retention ms
    const auto won = sql.query(statement_text("idem_claim"),
                               {"tenant-hot", "POST /orders", key, "fp", "", "30000", "86400000"});
    REQUIRE(won.size() == 1);
    const std::string fence = *won[0][1];
    // complete: key, fence, status, headers, body, omitted, resource, retention, trace id
    CHECK(sql.exec(statement_text("idem_complete"),
                   {"tenant-hot", "POST /orders", key, fence, "201", kHeaders, kBody, "false",
                    "ord-" + std::to_string(i), "86400000", ""}) == 1);
  }
  check_hot_share(sql, before);
}

TEST_CASE("lean record: completions are HOT updates (batched statements)") {
  test::Db sql(store_database().url());
  sql.exec("TRUNCATE idempotency_requests CASCADE");
  const auto before = updates(sql);
  auto array = [](const std::vector<std::string>& v) {
    std::string out = "{";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ",\"" : "\"") + v[i] + "\"";
    return out + "}";
  };
  for (int b = 0; b < kKeys / kBatch; ++b) {
    std::vector<std::string> keys;
    for (int i = 0; i < kBatch; ++i) keys.push_back("hotb-" + std::to_string(b * kBatch + i));
    const std::vector<std::string> tenants(kBatch, "tenant-hot");
    const std::vector<std::string> endpoints(kBatch, "POST /orders");
    const auto won = sql.query(statement_text("idem_claim_batch"),
                               {array(tenants), array(endpoints), array(keys),
                                array(std::vector<std::string>(kBatch, "fp")),
                                array(std::vector<std::string>(kBatch, "")),
                                array(std::vector<std::string>(kBatch, "30000")),
                                array(std::vector<std::string>(kBatch, "86400000"))});
    REQUIRE(won.size() == kBatch);
    std::vector<std::string> won_keys, fences;
    for (const auto& row : won) {
      won_keys.push_back(*row[2]);
      fences.push_back(*row[4]);
    }
    // The body as a bytea array element: text input, hex form.
    std::string hex_body = "\\\\x";
    for (char c : kBody) {
      static const char* digits = "0123456789abcdef";
      hex_body += digits[(static_cast<unsigned char>(c) >> 4) & 0xf];
      hex_body += digits[static_cast<unsigned char>(c) & 0xf];
    }
    std::string headers_element;
    for (char c : kHeaders) headers_element += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    CHECK(sql.query(statement_text("idem_complete_batch"),
                    {array(tenants), array(endpoints), array(won_keys), array(fences),
                     array(std::vector<std::string>(kBatch, "201")),
                     array(std::vector<std::string>(kBatch, headers_element)),
                     array(std::vector<std::string>(kBatch, hex_body)),
                     array(std::vector<std::string>(kBatch, "false")),
                     array(std::vector<std::string>(kBatch, "")),
                     array(std::vector<std::string>(kBatch, "86400000")),
                     array(std::vector<std::string>(kBatch, ""))})
              .size() == kBatch);
  }
  check_hot_share(sql, before);
}
