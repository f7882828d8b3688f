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
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "common/errors.hpp"
#include "common/types.hpp"

namespace idem::store {

struct RecordId {
  std::string tenant;
  std::string endpoint;  // the route's scope
  std::string key;
};

struct StoredHeader {
  std::string name;
  std::string value;
  friend bool operator==(const StoredHeader&, const StoredHeader&) = default;
};

struct StoredResponse {
  int status = 0;
  std::vector<StoredHeader> headers;  // only the route's replay_headers, in arrival order
  std::string body;                   // empty when body_omitted
  bool body_omitted = false;          // body was larger than max_stored_body
  std::string resource_id;            // from Location; empty = none
  friend bool operator==(const StoredResponse&, const StoredResponse&) = default;
};

enum class State { in_progress, completed };

// What one claim of a record holds: every owner write names `fence`, and backends see both.
//   attempt — counts the attempts of one operation: 1 on a claim, +1 per takeover and
//             replacement (X-Idempotency-Attempt). It starts at 1 again after a release.
//   fence   — the fencing token: drawn anew by every claim, takeover and replacement, and
//             never the same for two claims of a key over its whole life (across release,
//             lease expiry, takeover, replacement after retention and purge), so an owner
//             of an earlier claim can never write to a later one (X-Idempotency-Fencing-Token).
struct Ownership {
  std::int64_t attempt = 0;
  std::int64_t fence = 0;
  friend bool operator==(const Ownership&, const Ownership&) = default;
};

struct Record {
  std::string fingerprint;
  std::string principal;  // hash of the principal that created it; empty = none
  State state = State::in_progress;
  std::int64_t attempt = 0;
  std::int64_t fence = 0;  // the fencing token of the claim that holds (or completed) it
  bool lease_expired = false;  // in_progress and lease_expires_at <= now
  bool expired = false;        // expires_at <= now (retention passed)
  Millis lease_remaining{0};   // > 0 only while a live lease runs
  Millis retention_remaining{0};  // time until expires_at, rounded down; 0 once expired
  std::optional<StoredResponse> response;  // set when completed
  // Timestamps for the admin view, as Unix epoch microseconds (0 = NULL).
  std::int64_t created_at_us = 0;
  std::int64_t completed_at_us = 0;
  std::int64_t expires_at_us = 0;
  std::int64_t lease_expires_at_us = 0;
};

// What a completion did. `already_recorded`: nothing was written because the record is
// already completed under this very fence with this very answer — a retry of a completion
// whose first try committed but whose answer was lost (a timeout). To the caller that is
// a success; only `fenced` means another claim owns the record (or it is gone).
enum class Completion { recorded, already_recorded, fenced };

struct ClaimRequest {
  RecordId id;
  std::string fingerprint;
  std::string principal;
  Millis lease{30000};
  Millis retention{24LL * 3600 * 1000};
};

struct ClaimResult {
  bool won = false;
  Ownership owner;  // set when won: attempt 1 and a fresh fencing token
  // A lost claim may come with the row already read, by a statement of its own that ran
  // after the claim, exactly as read() would have (PgStore sends both in one round trip).
  // row_read = false: the caller reads with read(). row_read and no row: it vanished.
  bool row_read = false;
  std::optional<Record> row;
};

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
  virtual asio::awaitable<result<Completion>> complete(const RecordId& id, std::int64_t fence,
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

  // Retention: deletes at most `batch` rows with expires_at <= now that no live lease holds,
  // skipping rows locked by a concurrent cleaner. Returns how many were deleted.
  virtual asio::awaitable<result<std::size_t>> delete_expired(std::size_t batch) = 0;

  // Age of the oldest in_progress row (now - created_at); nullopt when there is none.
  virtual asio::awaitable<result<std::optional<Millis>>> oldest_in_progress_age() = 0;
};

}  // namespace idem::store
