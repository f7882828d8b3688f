// The replay cache on its own: when it may serve, what it refuses to keep, its bounds.
// Its use by the gateway is in gateway_test.cpp; against PostgreSQL's change
// announcements and several replicas in integration/suites/replay_cache_test.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "gateway/replay_cache.hpp"
#include "idempotency/fingerprint.hpp"
#include "observability/metrics.hpp"

using namespace idem;
using gateway::ReplayCache;
using gateway::ReplayCacheOptions;

namespace {

store::RecordId rid(std::string key, std::string tenant = "t1") {
  return store::RecordId{std::move(tenant), "POST /orders", std::move(key)};
}

std::string op(const store::RecordId& id) {
  return idempotency::operation_id(id.tenant, id.endpoint, id.key);
}

std::shared_ptr<const ReplayCache::Entry> entry(const store::RecordId& id, std::string body = "{}") {
  auto e = std::make_shared<ReplayCache::Entry>();
  e->id = id;
  e->fingerprint = "fp";
  e->attempt = 1;
  e->response.status = 201;
  e->response.headers.push_back({"Content-Type", "application/json"});
  e->response.body = std::move(body);
  return e;
}

bool put(ReplayCache& c, const store::RecordId& id, Millis retention = Millis{3600000},
         std::string body = "{}") {
  const auto t = c.ticket(op(id));
  return c.insert(t, op(id), retention, entry(id, std::move(body)));
}

// Two ids whose operation ids fall in the same shard (same first hex digit).
std::pair<store::RecordId, store::RecordId> same_shard_pair() {
  const auto a = rid("a");
  for (int i = 0;; ++i) {
    auto b = rid("b" + std::to_string(i));
    if (op(b).front() == op(a).front()) return {a, b};
  }
}

std::pair<store::RecordId, store::RecordId> other_shard_pair() {
  const auto a = rid("a");
  for (int i = 0;; ++i) {
    auto b = rid("b" + std::to_string(i));
    if (op(b).front() != op(a).front()) return {a, b};
  }
}

}  // namespace

TEST_CASE("serves only while enabled and listening for changes") {
  obs::Metrics m;
  ReplayCache c(&m);
  const auto id = rid("k1");
  CHECK_FALSE(c.active());
  CHECK_FALSE(c.ticket(op(id)).valid);
  CHECK_FALSE(put(c, id));  // not listening: nothing is kept

  c.set_listening(true);
  CHECK(c.active());
  CHECK(put(c, id));
  REQUIRE(c.find(op(id), id));
  CHECK(c.find(op(id), id)->response.status == 201);
  CHECK(m.replay_cache_hits() == 2);

  // Losing the listener empties the cache at once.
  c.set_listening(false);
  CHECK(c.entries() == 0);
  CHECK(c.find(op(id), id) == nullptr);
  c.set_listening(true);
  CHECK(c.find(op(id), id) == nullptr);  // nothing came back with it

  // Disabled by configuration: inactive even while listening.
  c.configure(ReplayCacheOptions{false, 1u << 20, Millis{10000}});
  CHECK_FALSE(c.active());
  CHECK_FALSE(put(c, id));
  c.configure(ReplayCacheOptions{true, 1u << 20, Millis{10000}});
  CHECK(c.active());
  CHECK(put(c, id));
  CHECK(m.render_prometheus().find("idemproxy_replay_cache_entries 1") != std::string::npos);
}

TEST_CASE("a hit needs the whole record id, not only its operation id") {
  ReplayCache c;
  c.set_listening(true);
  const auto id = rid("k1");
  REQUIRE(put(c, id));
  CHECK(c.find(op(id), rid("k1", "t2")) == nullptr);
  CHECK(c.find(op(id), rid("k2")) == nullptr);
  CHECK(c.find(op(id), id) != nullptr);
}

TEST_CASE("a read that overlapped a change is not kept") {
  ReplayCache c;
  c.set_listening(true);

  SUBCASE("an eviction in the same shard after the ticket") {
    const auto [a, b] = same_shard_pair();
    const auto t = c.ticket(op(a));
    c.evict(op(b));  // even another record: the shard cannot tell which read it overlapped
    CHECK_FALSE(c.insert(t, op(a), Millis{60000}, entry(a)));
    CHECK(c.find(op(a), a) == nullptr);
    CHECK(put(c, a));  // a read that starts afterwards is kept
  }
  SUBCASE("an eviction in another shard does not matter") {
    const auto [a, b] = other_shard_pair();
    const auto t = c.ticket(op(a));
    c.evict(op(b));
    CHECK(c.insert(t, op(a), Millis{60000}, entry(a)));
  }
  SUBCASE("the listener reconnecting in between") {
    const auto a = rid("a");
    const auto t = c.ticket(op(a));
    c.set_listening(false);
    c.set_listening(true);
    CHECK_FALSE(c.insert(t, op(a), Millis{60000}, entry(a)));
  }
  SUBCASE("a reload in between") {
    const auto a = rid("a");
    const auto t = c.ticket(op(a));
    c.configure(ReplayCacheOptions{});
    CHECK_FALSE(c.insert(t, op(a), Millis{60000}, entry(a)));
  }
  SUBCASE("an announced change removes a kept record; '*' removes all") {
    const auto a = rid("a");
    const auto b = rid("b");
    REQUIRE(put(c, a));
    REQUIRE(put(c, b));
    c.evict(op(a));
    CHECK(c.find(op(a), a) == nullptr);
    CHECK(c.find(op(b), b) != nullptr);
    c.evict("*");
    CHECK(c.find(op(b), b) == nullptr);
    CHECK(c.entries() == 0);
    CHECK(c.bytes() == 0);
  }
}

TEST_CASE("an entry never outlives the record's retention nor the ttl") {
  ReplayCache c;
  c.configure(ReplayCacheOptions{true, 1u << 20, Millis{3600000}});
  c.set_listening(true);
  const auto id = rid("short");
  const auto t = c.ticket(op(id));
  REQUIRE(c.insert(t, op(id), Millis{2}, entry(id)));
  // The deadline counts from the ticket (before the read was sent), so it has passed once
  // the clock is 2 ms beyond it: no sleep, the condition is the clock itself.
  while (SteadyClock::now() < t.sent_at + Millis{2}) {
  }
  CHECK(c.find(op(id), id) == nullptr);
  CHECK(c.entries() == 0);

  // Nothing is kept for a record with no retention left.
  CHECK_FALSE(put(c, rid("gone"), Millis{0}));

  // The ttl bounds a record with a long retention the same way.
  c.configure(ReplayCacheOptions{true, 1u << 20, Millis{2}});
  const auto t2 = c.ticket(op(id));
  REQUIRE(c.insert(t2, op(id), Millis{3600000}, entry(id)));
  while (SteadyClock::now() < t2.sent_at + Millis{2}) {
  }
  CHECK(c.find(op(id), id) == nullptr);
}

TEST_CASE("memory is bounded: least recently used entries go first, oversized ones never enter") {
  const std::size_t max_bytes = ReplayCache::kShards * 8192;  // 8 KiB per shard
  ReplayCache c;
  c.configure(ReplayCacheOptions{true, max_bytes, Millis{60000}});
  c.set_listening(true);
  const std::string body(1000, 'x');
  for (int i = 0; i < 2000; ++i) put(c, rid("k" + std::to_string(i)), Millis{60000}, body);
  CHECK(c.bytes() <= max_bytes);
  CHECK(c.entries() > 0);
  CHECK(c.entries() < 2000);

  // The most recently inserted ones are there, the first ones were evicted.
  CHECK(c.find(op(rid("k1999")), rid("k1999")) != nullptr);
  CHECK(c.find(op(rid("k0")), rid("k0")) == nullptr);

  // A body larger than a shard's budget is never kept.
  CHECK_FALSE(put(c, rid("big"), Millis{60000}, std::string(9000, 'y')));

  // A hit refreshes recency: of two entries in a full shard, the one just read stays.
  const auto [a, b] = same_shard_pair();
  c.clear();
  REQUIRE(put(c, a, Millis{60000}, std::string(3000, 'a')));
  REQUIRE(put(c, b, Millis{60000}, std::string(3000, 'b')));
  REQUIRE(c.find(op(a), a));
  auto filler = rid("filler");
  for (int i = 0; op(filler).front() != op(a).front(); ++i) filler = rid("filler" + std::to_string(i));
  REQUIRE(put(c, filler, Millis{60000}, std::string(3000, 'f')));
  CHECK(c.find(op(a), a) != nullptr);
  CHECK(c.find(op(b), b) == nullptr);
}

TEST_CASE("shared by threads: lookups, inserts and evictions at once keep the accounting exact") {
  ReplayCache c;
  c.configure(ReplayCacheOptions{true, ReplayCache::kShards * 16384, Millis{60000}});
  c.set_listening(true);
  std::vector<store::RecordId> ids;
  for (int i = 0; i < 64; ++i) ids.push_back(rid("k" + std::to_string(i)));
  std::atomic<int> hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int n = 0; n < 5000; ++n) {
        const auto& id = ids[static_cast<std::size_t>((n * 7 + t) % 64)];
        if (n % 3 == 0) put(c, id, Millis{60000}, std::string(200, 'x'));
        if (n % 17 == t) c.evict(op(id));
        if (auto e = c.find(op(id), id)) {
          if (e->id.key == id.key) hits.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(hits.load() > 0);
  std::size_t expected_bytes = 0;
  std::size_t expected_entries = 0;
  for (const auto& id : ids) {
    if (auto e = c.find(op(id), id)) {
      ++expected_entries;
      expected_bytes += gateway::entry_bytes(*e);
    }
  }
  CHECK(c.entries() == expected_entries);
  CHECK(c.bytes() == expected_bytes);
  c.clear();
  CHECK(c.entries() == 0);
  CHECK(c.bytes() == 0);
}
