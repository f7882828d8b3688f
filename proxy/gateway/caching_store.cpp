#include "gateway/caching_store.hpp"

#include "idempotency/fingerprint.hpp"

namespace idem::gateway {
namespace {

std::string operation_id_of(const store::RecordId& id) {
  return idempotency::operation_id(id.tenant, id.endpoint, id.key);
}

// The row a cached entry stands for, as read() would return it. Only what the protocol
// decides on is set: the entry holds no timestamps, and a cached row is never cached again.
store::Record row_of(const ReplayCache::Entry& e) {
  store::Record r;
  r.fingerprint = e.fingerprint;
  r.principal = e.principal;
  r.state = store::State::completed;
  r.attempt = e.attempt;
  r.fence = e.fence;
  r.response = e.response;
  return r;
}

}  // namespace

asio::awaitable<result<store::ClaimResult>> CachingStore::claim(const store::ClaimRequest& req) {
  if (!cache_.active()) co_return co_await inner_.claim(req);
  std::string computed;
  const std::string& op_id =
      req.operation_id.empty() ? (computed = operation_id_of(req.id)) : req.operation_id;
  if (auto hit = cache_.find(op_id, req.id)) {
    store::ClaimResult lost;
    lost.row_read = true;
    lost.row = row_of(*hit);
    lost.from_cache = true;
    co_return lost;
  }
  const auto ticket = cache_.ticket(op_id);
  auto claimed = co_await inner_.claim(req);
  if (claimed && !claimed->won && claimed->row) keep(ticket, op_id, req.id, *claimed->row);
  co_return claimed;
}

asio::awaitable<result<std::optional<store::Record>>> CachingStore::read(const store::RecordId& id) {
  if (!cache_.active()) co_return co_await inner_.read(id);
  const std::string op_id = operation_id_of(id);
  const auto ticket = cache_.ticket(op_id);
  auto row = co_await inner_.read(id);
  if (row && *row) keep(ticket, op_id, id, **row);
  co_return row;
}

// Forgotten before the DELETE, so that a caller that stops waiting for it (the admin API's
// deadline) leaves no entry behind, and again after it, because a read that ran in between
// may have kept the row that was about to go. Forgetting a record that still exists costs
// one read, so both happen whatever the outcome.
asio::awaitable<result<bool>> CachingStore::purge(const store::RecordId& id) {
  const std::string op_id = operation_id_of(id);
  cache_.evict(op_id);
  auto purged = co_await inner_.purge(id);
  cache_.evict(op_id);
  co_return purged;
}

void CachingStore::keep(const ReplayCache::Ticket& ticket, std::string_view op_id,
                        const store::RecordId& id, const store::Record& row) {
  if (!ticket.valid || row.state != store::State::completed || row.expired || !row.response) return;
  auto entry = std::make_shared<ReplayCache::Entry>();
  entry->id = id;
  entry->fingerprint = row.fingerprint;
  entry->principal = row.principal;
  entry->attempt = row.attempt;
  entry->fence = row.fence;
  entry->response = *row.response;
  cache_.insert(ticket, op_id, row.retention_remaining, std::move(entry));
}

}  // namespace idem::gateway
