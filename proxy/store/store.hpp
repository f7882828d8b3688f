#pragma once
// The record store: the only place the idempotency protocol touches persistent state.
// Two implementations honour this interface and are proven by one conformance suite
// (tests/store/): PgStore (PostgreSQL, the real one) and MemoryStore (a fake for fast
// unit tests of the gateway).
//
// Every operation is one atomic step keyed by the full scope (tenant, endpoint, key);
// nothing is ever looked up by the key alone. "now" is the store's clock (the database's
// now() for PgStore), never the caller's. Expected outcomes (lost claim, lost CAS, fenced
// write) are values; errors (errc::store_*) mean the store could not answer.
#include <cstdint>
#include <optional>
#include <string_view>

#include <boost/asio/awaitable.hpp>

#include "common/errors.hpp"
#include "common/types.hpp"
#include "store/record.hpp"

namespace idem::store {

class Store {
 public:
  virtual ~Store() = default;

  // INSERT ... ON CONFLICT DO NOTHING: wins with attempt 1, a fresh fence and a lease, or
  // loses.
  virtual asio::awaitable<result<ClaimResult>> claim(const ClaimRequest& req) = 0;

  // Reads the row in a new statement (sees the winner's committed row). nullopt = no row.
  virtual asio::awaitable<result<std::optional<Record>>> read(const RecordId& id) = 0;

  // Compare-and-swap takeover: only if in_progress, fence == seen_fence and the lease
  // expired. Returns the new ownership (attempt + 1, a fresh fence), or nullopt if the
  // swap lost. The CAS is on the fence, not the attempt: a row released and claimed again
  // since it was read has the same attempt but another fence (and maybe another
  // fingerprint), and must not be taken over on the strength of the old read.
  virtual asio::awaitable<result<std::optional<Ownership>>> take_over(
      const RecordId& id, std::int64_t seen_fence, Millis lease) = 0;

  // Atomic replacement of a record whose retention passed (expires_at <= now) and which is
  // not held by a live lease: becomes a fresh in_progress claim with the request's
  // fingerprint/principal, attempt + 1, a fresh fence, new created_at, lease and
  // expires_at. nullopt if the row changed (another fence) since it was read.
  virtual asio::awaitable<result<std::optional<Ownership>>> replace_expired(
      const ClaimRequest& req, std::int64_t seen_fence) = 0;

  // Guarded by fence: in_progress -> completed with the response, completed_at = now,
  // expires_at = now + retention. See Completion for what else it may answer.
  virtual asio::awaitable<result<Completed>> complete(const RecordId& id, std::int64_t fence,
                                                       const StoredResponse& response,
                                                       Millis retention) = 0;

  // Guarded by fence: deletes the in_progress row. false = fenced.
  virtual asio::awaitable<result<bool>> release(const RecordId& id, std::int64_t fence) = 0;

  // Guarded by fence: lease_expires_at = now + lease (and expires_at is kept at least
  // that far). false = fenced.
  virtual asio::awaitable<result<bool>> renew(const RecordId& id, std::int64_t fence,
                                              Millis lease) = 0;

  // Guarded by fence: lease_expires_at = now, so the next retry takes over at once.
  virtual asio::awaitable<result<bool>> expire_lease(const RecordId& id,
                                                     std::int64_t fence) = 0;

  // Admin: deletes the record whatever its state. false = there was none.
  virtual asio::awaitable<result<bool>> purge(const RecordId& id) = 0;

  // Routes with same_payload_new_key, after a won claim: notes this key for the payload and
  // answers whether a note of it within its window had another operation id, atomically
  // (two concurrent new keys of one payload cannot both find none). The same operation id
  // (the same key claimed again) is no detection. Expired notes go with delete_expired.
  virtual asio::awaitable<result<PayloadSeen>> note_payload(const PayloadNote& note) = 0;

  // Retention: deletes at most `batch` rows with expires_at <= now that no live lease holds,
  // skipping rows locked by a concurrent cleaner, and as many expired payload notes.
  // Returns how many records were deleted.
  virtual asio::awaitable<result<std::size_t>> delete_expired(std::size_t batch) = 0;

  // Age of the oldest in_progress row (now - created_at); nullopt when there is none.
  virtual asio::awaitable<result<std::optional<Millis>>> oldest_in_progress_age() = 0;

  // Long operations (routes with `async`): the way back from an operation id (the SHA-256
  // of tenant, endpoint and key, idempotency::operation_id) to its record, for the status
  // resource. Registered only when a 202 is about to go out; an entry goes with its record
  // (release, purge, cleanup). false = there is no record to register.
  virtual asio::awaitable<result<bool>> register_operation(const RecordId& id,
                                                           std::string_view operation_id) = 0;
  // Scoped by tenant: another tenant's operation id finds nothing, like an unknown one.
  virtual asio::awaitable<result<std::optional<OperationRecord>>> find_operation(
      std::string_view tenant, std::string_view operation_id) = 0;
};

}  // namespace idem::store
