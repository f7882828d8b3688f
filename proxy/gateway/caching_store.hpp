#pragma once
// The replay cache as a Store decorator (the way Envoy layers its cache behind one
// interface): the gateway sees one store, and the cache's correctness rule lives here
// and nowhere else.
//
// - claim(): while the cache serves, a fresh entry for the record answers the claim as
//   lost, with the cached row read along (ClaimResult::from_cache). That is exactly what
//   the store would have said: a cached record is completed and unexpired, so its INSERT
//   would lose, and its read would return this row (replay_cache.hpp says why).
// - claim() and read(): the ticket is taken just before the inner call, and a completed
//   row it hands back is kept only under that ticket, so a record changed or deleted
//   while the call was in flight never enters.
// - purge(): the record is forgotten in this process before the call returns, whatever
//   its outcome, so the replica that purged never replays the key again.
// Every other call passes through. The owner's own completion is not cached: only
// records that a retry had to read are.
#include "gateway/replay_cache.hpp"
#include "store/store.hpp"

namespace idem::gateway {

class CachingStore final : public store::Store {
 public:
  // Both must outlive this. `cache` is shared by every worker; `inner` is this worker's.
  CachingStore(store::Store& inner, ReplayCache& cache) : inner_(inner), cache_(cache) {}

  asio::awaitable<result<store::ClaimResult>> claim(const store::ClaimRequest& req) override;
  asio::awaitable<result<std::optional<store::Record>>> read(const store::RecordId& id) override;
  asio::awaitable<result<bool>> purge(const store::RecordId& id) override;

  asio::awaitable<result<std::optional<store::Ownership>>> take_over(const store::RecordId& id,
                                                                     std::int64_t seen_fence,
                                                                     Millis lease) override {
    return inner_.take_over(id, seen_fence, lease);
  }
  asio::awaitable<result<std::optional<store::Ownership>>> replace_expired(
      const store::ClaimRequest& req, std::int64_t seen_fence) override {
    return inner_.replace_expired(req, seen_fence);
  }
  asio::awaitable<result<store::Completed>> complete(const store::RecordId& id,
                                                      std::int64_t fence,
                                                      const store::StoredResponse& response,
                                                      Millis retention) override {
    return inner_.complete(id, fence, response, retention);
  }
  asio::awaitable<result<bool>> release(const store::RecordId& id, std::int64_t fence) override {
    return inner_.release(id, fence);
  }
  asio::awaitable<result<bool>> renew(const store::RecordId& id, std::int64_t fence,
                                      Millis lease) override {
    return inner_.renew(id, fence, lease);
  }
  asio::awaitable<result<bool>> expire_lease(const store::RecordId& id,
                                             std::int64_t fence) override {
    return inner_.expire_lease(id, fence);
  }
  asio::awaitable<result<store::PayloadSeen>> note_payload(const store::PayloadNote& note) override {
    return inner_.note_payload(note);  // no record is read or changed
  }
  asio::awaitable<result<std::size_t>> delete_expired(std::size_t batch) override {
    return inner_.delete_expired(batch);
  }
  asio::awaitable<result<std::optional<Millis>>> oldest_in_progress_age() override {
    return inner_.oldest_in_progress_age();
  }
  // The status of a running operation changes under it: never from the cache, and nothing
  // read here is kept (so no ticket is needed).
  asio::awaitable<result<bool>> register_operation(const store::RecordId& id,
                                                   std::string_view operation_id) override {
    return inner_.register_operation(id, operation_id);
  }
  asio::awaitable<result<std::optional<store::OperationRecord>>> find_operation(
      std::string_view tenant, std::string_view operation_id) override {
    return inner_.find_operation(tenant, operation_id);
  }

 private:
  // Keeps `row` if it is a completed, unexpired record and `ticket` still holds.
  void keep(const ReplayCache::Ticket& ticket, std::string_view op_id, const store::RecordId& id,
            const store::Record& row);

  store::Store& inner_;
  ReplayCache& cache_;
};

}  // namespace idem::gateway
