#pragma once
// The replay cache: completed records this process has recently replayed, kept in memory
// so that a burst of retries of the same key is answered without a database round trip.
//
// Why it cannot change an answer:
// - Only completed records are kept. Nothing changes a completed record until its
//   retention has passed, except deleting it (admin purge, an operator's DELETE).
// - Retention: an entry is fresh until the earlier of `ttl` and the record's own expiry,
//   both counted from the moment the read that found it was *sent* (the database's now()
//   of that read is later, so the entry always ends before the record expires, whatever
//   the two clocks say).
// - Deletion: every change to a completed, unexpired row announces the record's
//   operation id through PostgreSQL (LISTEN/NOTIFY, migration 0002), and the listener
//   evicts it here. While that channel is not known to be listening the cache is inactive:
//   empty, and nothing is added. A read that overlapped an eviction or a change of
//   listening state is not added either (see Ticket), so a record deleted while its read
//   was in flight never enters.
// - Who is first is never decided here: a miss goes to the store exactly as before, and
//   the claim-before-forward rule and the attempt token are untouched.
//
// Thread-safe: shared by all workers, sharded by operation id with one mutex per shard.
#include <array>
#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/types.hpp"
#include "store/store.hpp"

namespace idem::obs {
class Metrics;
}

namespace idem::gateway {

struct ReplayCacheOptions {
  bool enabled = true;
  std::size_t max_bytes = 32u << 20;  // the whole cache, across all shards
  Millis ttl{10000};
};

class ReplayCache {
 public:
  struct Entry {
    store::RecordId id;        // compared in full on every hit, never the digest alone
    std::string fingerprint;
    std::string principal;
    std::int64_t attempt = 0;
    std::int64_t fence = 0;
    store::StoredResponse response;
  };

  // Taken just before the store call whose row may be added: an insert is refused when the
  // cache was reconfigured, lost its listener, or evicted anything in the entry's shard
  // since, because that read may predate the change.
  struct Ticket {
    bool valid = false;
    std::uint64_t generation = 0;
    std::uint64_t shard_evictions = 0;
    SteadyClock::time_point sent_at{};
  };

  explicit ReplayCache(obs::Metrics* metrics = nullptr);
  ReplayCache(const ReplayCache&) = delete;
  ReplayCache& operator=(const ReplayCache&) = delete;

  // Start-up and reload: applies the options and empties the cache.
  void configure(const ReplayCacheOptions& options);
  // From the change listener: false empties the cache and keeps it inactive until true.
  void set_listening(bool listening);
  // Enabled and listening: lookups may hit and inserts may succeed.
  bool active() const noexcept { return active_.load(std::memory_order_acquire); }

  // A fresh entry for this record, or nullptr. op_id is the record's operation id.
  std::shared_ptr<const Entry> find(std::string_view op_id, const store::RecordId& id);

  Ticket ticket(std::string_view op_id) const;
  // Adds a completed record read under `ticket`; retention_left is the store's "time until
  // expires_at" from that read. Returns whether it was added.
  bool insert(const Ticket& ticket, std::string_view op_id, Millis retention_left,
              std::shared_ptr<const Entry> entry);

  // A record changed or was deleted somewhere ("*": all of them).
  void evict(std::string_view op_id);
  void clear();  // counts as an eviction in every shard

  std::size_t entries() const;
  std::size_t bytes() const;

  static constexpr std::size_t kShards = 16;

 private:
  struct Slot {
    std::shared_ptr<const Entry> entry;
    SteadyClock::time_point fresh_until;
    std::size_t bytes = 0;
    std::list<std::string>::iterator lru;  // position in Shard::order (front = newest)
  };
  struct Shard {
    mutable std::mutex mutex;
    std::unordered_map<std::string, Slot> slots;
    std::list<std::string> order;
    std::size_t bytes = 0;
    std::uint64_t evictions = 0;  // announced changes seen by this shard
  };

  Shard& shard_of(std::string_view op_id) const;
  void erase_locked(Shard& s, std::unordered_map<std::string, Slot>::iterator it);
  // After a change of options or listening state: invalidates every ticket, then empties.
  void restart_locked();
  void publish_gauges() const;

  obs::Metrics* metrics_;
  mutable std::array<Shard, kShards> shards_;
  std::mutex config_mutex_;
  bool enabled_ = true;     // guarded by config_mutex_
  bool listening_ = false;  // guarded by config_mutex_
  std::atomic<bool> active_{false};
  std::atomic<std::uint64_t> generation_{1};
  std::atomic<Millis::rep> ttl_ms_{10000};
  std::atomic<std::size_t> shard_budget_{0};
  std::atomic<std::size_t> total_entries_{0};
  std::atomic<std::size_t> total_bytes_{0};
};

// Memory an entry holds, for the byte budget (approximate, including per-entry overhead).
std::size_t entry_bytes(const ReplayCache::Entry& e);

}  // namespace idem::gateway
