#include "gateway/replay_cache.hpp"

#include <algorithm>

#include "common/text.hpp"
#include "observability/metrics.hpp"

namespace idem::gateway {
namespace {

// Map node, list node, shared_ptr control block and the strings' headers: what an entry
// costs beyond its payload, so that many tiny entries are bounded too.
constexpr std::size_t kEntryOverhead = 512;

// The shard of an operation id: its first hex digit's value (any other byte, from a
// hand-built id in a test, by its own value).
std::size_t shard_digit(char c) {
  const int v = text::hex_value(c);
  return static_cast<std::size_t>(v >= 0 ? v : static_cast<unsigned char>(c));
}

}  // namespace

std::size_t entry_bytes(const ReplayCache::Entry& e) {
  std::size_t n = kEntryOverhead + e.id.tenant.size() + e.id.endpoint.size() + e.id.key.size() +
                  e.fingerprint.size() + e.principal.size() + e.response.body.size() +
                  e.response.resource_id.size();
  for (const auto& h : e.response.headers) n += h.name.size() + h.value.size() + 64;
  return n;
}

ReplayCache::ReplayCache(obs::Metrics* metrics) : metrics_(metrics) {
  const ReplayCacheOptions defaults;
  enabled_ = defaults.enabled;
  shard_budget_.store(defaults.max_bytes / kShards, std::memory_order_relaxed);
  ttl_ms_.store(defaults.ttl.count(), std::memory_order_relaxed);
  publish_gauges();
}

ReplayCache::Shard& ReplayCache::shard_of(std::string_view op_id) const {
  // Operation ids are hex SHA-256: their first digit is already uniformly spread.
  const std::size_t i = op_id.empty() ? 0 : shard_digit(op_id.front()) % kShards;
  return shards_[i];
}

void ReplayCache::configure(const ReplayCacheOptions& options) {
  std::lock_guard config(config_mutex_);
  enabled_ = options.enabled;
  shard_budget_.store(options.max_bytes / kShards, std::memory_order_relaxed);
  ttl_ms_.store(options.ttl.count(), std::memory_order_relaxed);
  restart_locked();
}

void ReplayCache::set_listening(bool listening) {
  std::lock_guard config(config_mutex_);
  listening_ = listening;
  restart_locked();
}

void ReplayCache::restart_locked() {
  // Order matters: tickets taken before this point must fail, then the shards empty.
  generation_.fetch_add(1, std::memory_order_acq_rel);
  active_.store(enabled_ && listening_ && shard_budget_.load(std::memory_order_relaxed) > 0,
                std::memory_order_release);
  clear();
}

std::shared_ptr<const ReplayCache::Entry> ReplayCache::find(std::string_view op_id,
                                                            const store::RecordId& id) {
  if (!active()) return nullptr;
  const auto now = SteadyClock::now();
  Shard& s = shard_of(op_id);
  std::shared_ptr<const Entry> found;
  bool dropped = false;
  {
    std::lock_guard lock(s.mutex);
    auto it = s.slots.find(std::string(op_id));
    if (it != s.slots.end()) {
      if (now >= it->second.fresh_until) {
        erase_locked(s, it);
        dropped = true;
      } else if (it->second.entry->id.tenant == id.tenant &&
                 it->second.entry->id.endpoint == id.endpoint && it->second.entry->id.key == id.key) {
        s.order.splice(s.order.begin(), s.order, it->second.lru);
        found = it->second.entry;
      }
    }
  }
  if (metrics_) metrics_->replay_cache_lookup(found != nullptr);
  if (dropped) publish_gauges();
  return found;
}

ReplayCache::Ticket ReplayCache::ticket(std::string_view op_id) const {
  Ticket t;
  if (!active()) return t;
  t.generation = generation_.load(std::memory_order_acquire);
  Shard& s = shard_of(op_id);
  {
    std::lock_guard lock(s.mutex);
    t.shard_evictions = s.evictions;
  }
  t.sent_at = SteadyClock::now();
  t.valid = true;
  return t;
}

bool ReplayCache::insert(const Ticket& ticket, std::string_view op_id, Millis retention_left,
                         std::shared_ptr<const Entry> entry) {
  if (!ticket.valid || !entry || retention_left <= Millis{0}) return false;
  const Millis ttl{ttl_ms_.load(std::memory_order_relaxed)};
  const auto fresh_until = ticket.sent_at + std::min(ttl, retention_left);
  if (fresh_until <= SteadyClock::now()) return false;
  const std::size_t size = entry_bytes(*entry);
  const std::size_t budget = shard_budget_.load(std::memory_order_relaxed);
  if (size > budget) return false;

  Shard& s = shard_of(op_id);
  {
    std::lock_guard lock(s.mutex);
    // Checked under the shard lock: an eviction or a loss of the listener that happened
    // after the ticket means the read may have seen a record that no longer exists.
    if (!active() || generation_.load(std::memory_order_acquire) != ticket.generation ||
        s.evictions != ticket.shard_evictions) {
      return false;
    }
    std::string key(op_id);
    if (auto old = s.slots.find(key); old != s.slots.end()) erase_locked(s, old);
    while (s.bytes + size > budget && !s.order.empty()) {
      erase_locked(s, s.slots.find(s.order.back()));
    }
    s.order.push_front(key);
    Slot slot{std::move(entry), fresh_until, size, s.order.begin()};
    s.slots.emplace(std::move(key), std::move(slot));
    s.bytes += size;
    total_entries_.fetch_add(1, std::memory_order_relaxed);
    total_bytes_.fetch_add(size, std::memory_order_relaxed);
  }
  publish_gauges();
  return true;
}

void ReplayCache::evict(std::string_view op_id) {
  if (op_id == "*") {
    clear();
    return;
  }
  Shard& s = shard_of(op_id);
  {
    std::lock_guard lock(s.mutex);
    ++s.evictions;
    if (auto it = s.slots.find(std::string(op_id)); it != s.slots.end()) erase_locked(s, it);
  }
  publish_gauges();
}

void ReplayCache::clear() {
  for (auto& s : shards_) {
    std::lock_guard lock(s.mutex);
    ++s.evictions;
    total_entries_.fetch_sub(s.slots.size(), std::memory_order_relaxed);
    total_bytes_.fetch_sub(s.bytes, std::memory_order_relaxed);
    s.slots.clear();
    s.order.clear();
    s.bytes = 0;
  }
  publish_gauges();
}

void ReplayCache::erase_locked(Shard& s, std::unordered_map<std::string, Slot>::iterator it) {
  s.bytes -= it->second.bytes;
  total_entries_.fetch_sub(1, std::memory_order_relaxed);
  total_bytes_.fetch_sub(it->second.bytes, std::memory_order_relaxed);
  s.order.erase(it->second.lru);
  s.slots.erase(it);
}

std::size_t ReplayCache::entries() const { return total_entries_.load(std::memory_order_relaxed); }
std::size_t ReplayCache::bytes() const { return total_bytes_.load(std::memory_order_relaxed); }

void ReplayCache::publish_gauges() const {
  if (metrics_) metrics_->set_replay_cache(active(), entries(), bytes());
}

}  // namespace idem::gateway
