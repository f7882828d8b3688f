#pragma once
// The record as the protocol and the store speak of it: plain values, no I/O, no Asio, so
// that the pure protocol (idempotency/protocol.hpp) and the store share them.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
  // The W3C trace id (32 hex digits) of the request that produced this answer; empty for
  // records written before migration 0006 or by a backend (completion: backend).
  std::string trace_id;
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
// The record's lifetime comes along, from the database clock, for the backend
// (X-Idempotency-Record-Created / -Expires): a takeover keeps created_at, a replacement
// after retention starts a new one.
struct Ownership {
  std::int64_t attempt = 0;
  std::int64_t fence = 0;
  std::int64_t created_at_us = 0;  // Unix epoch microseconds
  std::int64_t expires_at_us = 0;  // as of this claim; a completion sets it anew
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

// What complete() returns: the outcome and, unless fenced, the record's expiry (the one
// clients are told: Idempotency-Key-Expires).
struct Completed {
  Completion outcome = Completion::fenced;
  std::int64_t expires_at_us = 0;  // Unix epoch microseconds; 0 when fenced
  friend bool operator==(const Completed& c, Completion o) { return c.outcome == o; }
};

// A record found by its operation id (Store::find_operation).
struct OperationRecord {
  RecordId id;
  Record record;
};

// Routes with same_payload_new_key (Store::note_payload): this new claim's payload, noted
// under (tenant, endpoint, principal, fingerprint).
struct PayloadNote {
  std::string tenant;
  std::string endpoint;
  std::string principal;     // the claim's principal hash ("" when principals are not checked)
  std::string fingerprint;
  std::string operation_id;  // this request's (idempotency::operation_id): never the key
  std::string key_hash;      // this request's log hash, for the logs of a later detection
  Millis window{0};          // how long the note counts
  // action: reject — a detected note keeps the earlier key, so that every new key for the
  // payload is refused for the window (the client is pointed at the one key to retry with).
  bool keep_earlier = false;
};

// What the note found: a note of the same payload within its window, under another key.
struct PayloadSeen {
  bool detected = false;
  std::string earlier_operation_id;
  std::string earlier_key_hash;
  Millis age{0};  // since the earlier key was noted
};

struct ClaimRequest {
  RecordId id;
  std::string fingerprint;
  std::string principal;
  Millis lease{30000};
  Millis retention{24LL * 3600 * 1000};
  // idempotency::operation_id of `id` when the caller already has it (the replay cache's
  // key; one SHA-256 less per claim); empty: whoever needs it computes it.
  std::string operation_id;
};

struct ClaimResult {
  bool won = false;
  Ownership owner;  // set when won: attempt 1 and a fresh fencing token
  // A lost claim may come with the row already read, by a statement of its own that ran
  // after the claim, exactly as read() would have (PgStore sends both in one round trip).
  // row_read = false: the caller reads with read(). row_read and no row: it vanished.
  bool row_read = false;
  std::optional<Record> row;
  // The row came from the replay cache (gateway/caching_store.hpp), without a store call.
  bool from_cache = false;
};

}  // namespace idem::store
