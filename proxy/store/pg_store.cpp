#include "store/pg_store.hpp"

#include <algorithm>
#include <charconv>
#include <deque>
#include <mutex>
#include <optional>
#include <initializer_list>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <string>
#include <utility>

#include "common/text.hpp"
#include "store/batcher.hpp"
#include "store/header_codec.hpp"
#include "store/migrations.hpp"
#include "store/pg_array.hpp"

namespace idem::store {
namespace {

// Every statement takes the full primary key as $1..$3 (tenant, endpoint, key): nothing is
// ever addressed by the key alone. Every time decision uses now(), the database clock,
// so replicas with skewed clocks agree. Durations arrive as milliseconds (bigint) and are
// scaled by an interval, which keeps the parameter an integer rather than a string the
// server would have to parse as an interval.
//
// Invariant kept by claim, take_over, renew and replace_expired: while a lease is live the
// row is not past expires_at, so retention never deletes work that still runs (the
// cleanup predicate also checks the lease, as a second line).

constexpr const char* kClaim = "idem_claim";
constexpr const char* kRead = "idem_read";
constexpr const char* kTakeOver = "idem_take_over";
constexpr const char* kReplaceExpired = "idem_replace_expired";
constexpr const char* kComplete = "idem_complete";
constexpr const char* kCompletedAlready = "idem_completed_already";
constexpr const char* kRelease = "idem_release";
constexpr const char* kRenew = "idem_renew";
constexpr const char* kExpireLease = "idem_expire_lease";
constexpr const char* kPurge = "idem_purge";
constexpr const char* kDeleteExpired = "idem_delete_expired";
constexpr const char* kRegisterOperation = "idem_register_operation";
constexpr const char* kFindOperation = "idem_find_operation";
constexpr const char* kNotePayload = "idem_note_payload";
constexpr const char* kClaimBatch = "idem_claim_batch";
constexpr const char* kReadBatch = "idem_read_batch";
constexpr const char* kCompleteBatch = "idem_complete_batch";
constexpr const char* kCompleteByRowBatch = "idem_complete_by_row_batch";
constexpr const char* kCompleteByRow = "idem_complete_by_row";
constexpr const char* kReleaseBatch = "idem_release_batch";
constexpr const char* kRenewBatch = "idem_renew_batch";

// The lean record (migration 0008, docs/architecture.md "The record"): a claim fixes
// expires_at at retention plus one lease from now, and a completion keeps it whenever that
// is still at least retention from the completion (every completion within the first
// lease, which is nearly all of them); only a later one moves it. A completion therefore
// changes no indexed column and PostgreSQL writes it as a HOT update, in the same page,
// without new index entries. A record is kept at least `retention` after its completion
// and at most one lease longer.
//
// The claim is the whole race: the primary key decides, the loser gets no row back and
// reads the winner's committed row in a new statement (a new READ COMMITTED snapshot).
// Every claim draws a fencing token, the loser's is simply never used: a sequence value is
// never handed out twice, which is the whole point (migration 0003). RETURNING ends with
// the row's address, which the completion uses (kCompleteByRowSql).
constexpr const char* kClaimSql = R"sql(
INSERT INTO idempotency_requests
  (tenant_id, endpoint, idempotency_key, request_fingerprint, principal, state,
   attempt_token, lease_expires_at, created_at, expires_at, fencing_token)
VALUES ($1, $2, $3, $4, $5, 'in_progress', 1,
        now() + $6::bigint * interval '1 millisecond', now(),
        now() + ($7::bigint + $6::bigint) * interval '1 millisecond',
        nextval('idempotency_fencing_tokens'))
ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
RETURNING attempt_token, fencing_token,
          (extract(epoch FROM created_at) * 1000000)::bigint,
          (extract(epoch FROM expires_at) * 1000000)::bigint,
          ctid)sql";

// Column order is part of the contract with decode_record() below. A macro, so that the
// lookup by operation id reads exactly the same columns.
#define IDEM_RECORD_COLUMNS \
  "request_fingerprint,\n" \
  "       principal,\n" \
  "       state,\n" \
  "       attempt_token,\n" \
  "       fencing_token,\n" \
  "       (state = 'in_progress' AND lease_expires_at <= now()) AS lease_expired,\n" \
  "       (expires_at <= now()) AS expired,\n" \
  "       CASE WHEN state = 'in_progress' AND lease_expires_at > now()\n" \
  "       THEN ceil(extract(epoch FROM lease_expires_at - now()) * 1000)::bigint\n" \
  "       ELSE 0 END AS lease_remaining_ms,\n" \
  "       response_status,\n" \
  "       response_headers::text,\n" \
  "       response_body,\n" \
  "       response_body_omitted,\n" \
  "       resource_id,\n" \
  "       (extract(epoch FROM created_at) * 1000000)::bigint,\n" \
  "       (extract(epoch FROM completed_at) * 1000000)::bigint,\n" \
  "       (extract(epoch FROM expires_at) * 1000000)::bigint,\n" \
  "       (extract(epoch FROM lease_expires_at) * 1000000)::bigint,\n" \
  "       GREATEST(0, floor(extract(epoch FROM expires_at - now()) * 1000))::bigint,\n" \
  "       trace_id\n"

constexpr const char* kReadSql = "SELECT " IDEM_RECORD_COLUMNS R"sql(
FROM idempotency_requests
WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3)sql";

// Long operations: an operation id registered for a record that exists (a record released
// since has nothing to register; its cascade would remove the entry anyway). ON CONFLICT:
// a duplicate's 202 registers the id the owner's registered already.
constexpr const char* kRegisterOperationSql = R"sql(
WITH registered AS (
  INSERT INTO idempotency_operations (tenant_id, operation_id, endpoint, idempotency_key)
  SELECT $1, $4, $2, $3
  WHERE EXISTS (SELECT 1 FROM idempotency_requests
                WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3)
  ON CONFLICT (tenant_id, operation_id) DO NOTHING
  RETURNING 1)
SELECT EXISTS (SELECT 1 FROM idempotency_requests
               WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3))sql";

// The record of an operation id, within one tenant; its endpoint and key come last, after
// the columns decode_record() reads.
constexpr const char* kFindOperationSql = "SELECT " IDEM_RECORD_COLUMNS R"sql(,
       endpoint, idempotency_key
FROM idempotency_operations
JOIN idempotency_requests USING (tenant_id, endpoint, idempotency_key)
WHERE tenant_id = $1 AND operation_id = $2)sql";
#undef IDEM_RECORD_COLUMNS

// Compare-and-swap on the fencing token the caller saw: of several duplicates that all saw
// the same expired lease, the row lock lets exactly one UPDATE match; the others re-check
// the WHERE clause against the new row version (a new token) and match nothing. The new
// token is drawn under the row lock, after the old owner's: it is also the larger.
constexpr const char* kTakeOverSql = R"sql(
UPDATE idempotency_requests
SET attempt_token = attempt_token + 1,
    fencing_token = nextval('idempotency_fencing_tokens'),
    lease_expires_at = now() + $5::bigint * interval '1 millisecond',
    expires_at = GREATEST(expires_at, now() + $5::bigint * interval '1 millisecond')
WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
  AND state = 'in_progress'
  AND fencing_token = $4::bigint
  AND lease_expires_at <= now()
RETURNING attempt_token, fencing_token,
          (extract(epoch FROM created_at) * 1000000)::bigint,
          (extract(epoch FROM expires_at) * 1000000)::bigint)sql";

// Every column is reset: nothing of the expired operation may leak into the new one. The
// attempt keeps counting up (backends that compare attempts of one operation id see it
// grow), and the fencing token is drawn anew, so a straggler of the old operation stays
// fenced.
constexpr const char* kReplaceExpiredSql = R"sql(
UPDATE idempotency_requests
SET request_fingerprint = $4,
    principal = $5,
    state = 'in_progress',
    attempt_token = attempt_token + 1,
    fencing_token = nextval('idempotency_fencing_tokens'),
    lease_expires_at = now() + $6::bigint * interval '1 millisecond',
    response_status = NULL,
    response_headers = NULL,
    response_body = NULL,
    response_body_omitted = false,
    resource_id = NULL,
    created_at = now(),
    completed_at = NULL,
    expires_at = now() + ($7::bigint + $6::bigint) * interval '1 millisecond'
WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
  AND fencing_token = $8::bigint
  AND expires_at <= now()
  AND (state = 'completed' OR lease_expires_at <= now())
RETURNING attempt_token, fencing_token,
          (extract(epoch FROM created_at) * 1000000)::bigint,
          (extract(epoch FROM expires_at) * 1000000)::bigint)sql";

// The owner writes (complete, release, renew, expire lease) are conditioned on the fencing
// token of the caller's claim, which no other claim of this key ever carried: a stale owner
// of an earlier claim, released, taken over, replaced or purged since, matches nothing.
// The state check keeps a completed record final even for its own claim.
//
// The body is a binary parameter: no escaping, NUL bytes and all.
constexpr const char* kCompleteSql = R"sql(
UPDATE idempotency_requests
SET state = 'completed',
    response_status = $5::integer,
    response_headers = $6::jsonb,
    response_body = $7::bytea,
    response_body_omitted = $8::boolean,
    resource_id = NULLIF($9, ''),
    completed_at = now(),
    expires_at = GREATEST(expires_at, now() + $10::bigint * interval '1 millisecond'),
    lease_expires_at = NULL,
    trace_id = NULLIF($11, '')
WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
  AND fencing_token = $4::bigint
  AND state = 'in_progress'
RETURNING (extract(epoch FROM expires_at) * 1000000)::bigint)sql";

// kCompleteSql for a claim this process made and whose row has not moved since: the
// claim's RETURNING told where its row was written (HeldClaims), and a TID scan reaches
// it there instead of a descent of the primary key (as kCompleteByRowBatchSql does for a
// batch). Every condition of kCompleteSql still applies, so the address is only a hint:
// when this matches nothing, kCompleteSql runs by the key and decides.
constexpr const char* kCompleteByRowSql = R"sql(
UPDATE idempotency_requests
SET state = 'completed',
    response_status = $5::integer,
    response_headers = $6::jsonb,
    response_body = $7::bytea,
    response_body_omitted = $8::boolean,
    resource_id = NULLIF($9, ''),
    completed_at = now(),
    expires_at = GREATEST(expires_at, now() + $10::bigint * interval '1 millisecond'),
    lease_expires_at = NULL,
    trace_id = NULLIF($11, '')
WHERE ctid = $12::tid
  AND tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
  AND fencing_token = $4::bigint
  AND state = 'in_progress'
RETURNING (extract(epoch FROM expires_at) * 1000000)::bigint)sql";

// Run only when a completion wrote nothing: was it because this very fence already
// recorded this very answer (a retried completion whose first try committed), or because
// another claim owns the row? A statement of its own, so it sees every commit so far. The
// parameters are the completion's, but for the retention.
constexpr const char* kCompletedAlreadySql = R"sql(
SELECT (extract(epoch FROM expires_at) * 1000000)::bigint FROM idempotency_requests
WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
  AND fencing_token = $4::bigint
  AND state = 'completed'
  AND response_status = $5::integer
  AND response_headers = $6::jsonb
  AND response_body IS NOT DISTINCT FROM $7::bytea
  AND response_body_omitted = $8::boolean
  AND resource_id IS NOT DISTINCT FROM NULLIF($9, ''))sql";

constexpr const char* kReleaseSql = R"sql(
DELETE FROM idempotency_requests
WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
  AND fencing_token = $4::bigint
  AND state = 'in_progress')sql";

constexpr const char* kRenewSql = R"sql(
UPDATE idempotency_requests
SET lease_expires_at = now() + $5::bigint * interval '1 millisecond',
    expires_at = GREATEST(expires_at, now() + $5::bigint * interval '1 millisecond')
WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
  AND fencing_token = $4::bigint
  AND state = 'in_progress')sql";

constexpr const char* kExpireLeaseSql = R"sql(
UPDATE idempotency_requests
SET lease_expires_at = now()
WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
  AND fencing_token = $4::bigint
  AND state = 'in_progress')sql";

constexpr const char* kPurgeSql = R"sql(
DELETE FROM idempotency_requests
WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3)sql";

// Batched, lock-skipping retention that every replica may run at once. The CTE walks the
// expires_at index and locks what it takes; the DELETE then joins on (tableoid, ctid) and
// finds each locked row by a TID scan parameterized by the join (a nested loop: the
// store's sessions take no hash or merge join, pg_store_session_settings()). A ctid names
// a row only within one table: on a table partitioned by tenant
// (migrations/optional/partition_by_tenant.sql) the same ctid is a row in each partition,
// so the join is on the pair; without tableoid a batch deletes up to one row per partition
// for each row it locked. Nothing but the join restricts the DELETE's side: the rows are
// locked (FOR UPDATE), so what the CTE chose still holds, and a condition on the table
// alone (say, expires_at re-checked) would offer the planner an index scan of every
// expired row to compare with every locked one instead of the TID probes. (An earlier
// form, `ctid = ANY(ARRAY(…)) AND (tableoid, ctid) IN (…)`, relied on a hash join for the
// pair: without one it compared every deleted row with every locked one, 159 ms for a
// batch of 1 000 instead of 10.)
// Expired payload notes (migration 0007) go in the same round, as many as records at most;
// the statement's row count is the records'.
constexpr const char* kDeleteExpiredSql = R"sql(
WITH notes AS (
  DELETE FROM idempotency_same_payload
  WHERE ctid IN (SELECT ctid FROM idempotency_same_payload WHERE expires_at <= now()
                 LIMIT $1::bigint FOR UPDATE SKIP LOCKED)),
doomed AS MATERIALIZED (
  SELECT tableoid AS rel, ctid AS tid FROM idempotency_requests
  WHERE expires_at <= now()
    AND (state = 'completed' OR lease_expires_at <= now())
  LIMIT $1::bigint
  FOR UPDATE SKIP LOCKED)
DELETE FROM idempotency_requests AS r
USING doomed AS d
WHERE r.ctid = d.tid AND r.tableoid = d.rel)sql";

// same_payload_new_key (migration 0007): note this new claim's key for its payload, and
// learn in the same statement what the note held before. ON CONFLICT DO UPDATE runs under
// the row's lock and its SET reads the row as it is then (s.*: the committed note of a
// concurrent new key included), so of two concurrent new keys the second always sees the
// first. A note within its window (expires_at > now()) under another operation id is a
// detection; under reject ($8) that earlier note is kept, so every further new key is
// measured against it too. The same key claimed again (its operation id) only refreshes
// the note. Parameters: tenant, endpoint, principal, fingerprint, operation id, key hash,
// window (ms), keep-earlier.
constexpr const char* kNotePayloadSql = R"sql(
INSERT INTO idempotency_same_payload AS s
  (tenant_id, endpoint, principal, fingerprint, operation_id, key_hash, seen_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, now(), now() + $7::bigint * interval '1 millisecond')
ON CONFLICT (tenant_id, endpoint, principal, fingerprint) DO UPDATE SET
  previous_operation_id = CASE WHEN s.expires_at > now() THEN s.operation_id END,
  previous_key_hash = CASE WHEN s.expires_at > now() THEN s.key_hash END,
  previous_seen_at = CASE WHEN s.expires_at > now() THEN s.seen_at END,
  operation_id = CASE WHEN $8::boolean AND s.expires_at > now() AND s.operation_id <> EXCLUDED.operation_id
                      THEN s.operation_id ELSE EXCLUDED.operation_id END,
  key_hash = CASE WHEN $8::boolean AND s.expires_at > now() AND s.operation_id <> EXCLUDED.operation_id
                  THEN s.key_hash ELSE EXCLUDED.key_hash END,
  seen_at = CASE WHEN $8::boolean AND s.expires_at > now() AND s.operation_id <> EXCLUDED.operation_id
                 THEN s.seen_at ELSE EXCLUDED.seen_at END,
  expires_at = CASE WHEN $8::boolean AND s.expires_at > now() AND s.operation_id <> EXCLUDED.operation_id
                    THEN s.expires_at ELSE EXCLUDED.expires_at END
RETURNING previous_operation_id IS NOT NULL AND previous_operation_id <> $5 AS detected,
          previous_operation_id, previous_key_hash,
          floor(extract(epoch FROM now() - previous_seen_at) * 1000)::bigint)sql";

// ---- Batched statements (database.batching): the claims, reads and completions of
// concurrent requests on one worker, one statement and one commit for all of them. Each
// takes parallel arrays (one element per request, binary format: store/pg_array.hpp) and
// unnests them; every row is still addressed by its full primary key, and every member
// gets exactly the answer its own single statement would have given. The plans these get
// (generic plans, stale statistics) are recorded in docs/performance.md.
// The arrays are unnested in the select list of a subquery, `(SELECT unnest($1), unnest($2),
// …) AS u` (a ProjectSet node: the arrays walked in step, one row per element, in array
// order), not as `unnest($1, $2, …)` in FROM (ROWS FROM: a function scan that sets up and
// fills a tuplestore per array before its first row): the same rows, and 4–5 % fewer
// of PostgreSQL's instructions per write cycle (docs/performance.md, "The batches'
// arrays in step").

// kClaimSql for many keys. The primary key still picks each key's owner: a conflicting
// row, committed or being inserted by another transaction, makes that member lose (after
// waiting for the other transaction, as the single claim does). The members arrive
// sorted by key (the caller sorts them) and the unnested arrays feed the insert in array
// order, so every batch takes its keys' index locks in one order and two batches, from
// this replica or another, cannot deadlock on them. Each row draws its own fencing
// token: nextval() is evaluated per row, so tokens stay unique per key and per claim.
// RETURNING names the key, which is how each winner finds its row (no key repeats within
// a batch: the caller sees to it), and the row's address, which the batched completion
// uses (kCompleteByRowBatchSql).
constexpr const char* kClaimBatchSql = R"sql(
INSERT INTO idempotency_requests
  (tenant_id, endpoint, idempotency_key, request_fingerprint, principal, state,
   attempt_token, lease_expires_at, created_at, expires_at, fencing_token)
SELECT u.tenant_id, u.endpoint, u.idempotency_key, u.fingerprint, u.principal,
       'in_progress', 1,
       now() + u.lease_ms * interval '1 millisecond', now(),
       now() + (u.retention_ms + u.lease_ms) * interval '1 millisecond',
       nextval('idempotency_fencing_tokens')
FROM (SELECT unnest($1::text[]) AS tenant_id, unnest($2::text[]) AS endpoint,
             unnest($3::text[]) AS idempotency_key, unnest($4::text[]) AS fingerprint,
             unnest($5::text[]) AS principal, unnest($6::bigint[]) AS lease_ms,
             unnest($7::bigint[]) AS retention_ms) AS u
ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
RETURNING tenant_id, endpoint, idempotency_key, attempt_token, fencing_token,
          (extract(epoch FROM created_at) * 1000000)::bigint,
          (extract(epoch FROM expires_at) * 1000000)::bigint,
          ctid)sql";

// kReadSql for many keys, sent after kClaimBatchSql in the same pipeline: a statement of
// its own, so it sees every row committed before it started, as the single read does.
// The columns are IDEM_RECORD_COLUMNS (kReadSql's), in that order (decode_record()),
// spelled out so that tools can take this statement from the source as it stands
// (integration/bench/explain-batches); the batched conformance suite proves them equal.
// Then the key. A LATERAL subquery per key rather than a join, and OFFSET 0 so that the
// planner cannot flatten it into one (which it could then hash): it runs as a nested loop
// over the keys, each probing the table by its full key, whatever the planner believes
// about the table's size or the number of keys (a hash join over a scanned prefix of the
// key is the plan to avoid: docs/performance.md); on a table partitioned by tenant each
// probe is pruned at run time to its key's partition.
constexpr const char* kReadBatchSql = R"sql(
SELECT r.*
FROM (SELECT unnest($1::text[]) AS tenant_id, unnest($2::text[]) AS endpoint,
             unnest($3::text[]) AS idempotency_key) AS u
CROSS JOIN LATERAL (
  SELECT request_fingerprint,
         principal,
         state,
         attempt_token,
         fencing_token,
         (state = 'in_progress' AND lease_expires_at <= now()) AS lease_expired,
         (expires_at <= now()) AS expired,
         CASE WHEN state = 'in_progress' AND lease_expires_at > now()
              THEN ceil(extract(epoch FROM lease_expires_at - now()) * 1000)::bigint
              ELSE 0 END AS lease_remaining_ms,
         response_status,
         response_headers::text,
         response_body,
         response_body_omitted,
         resource_id,
         (extract(epoch FROM created_at) * 1000000)::bigint,
         (extract(epoch FROM completed_at) * 1000000)::bigint,
         (extract(epoch FROM expires_at) * 1000000)::bigint,
         (extract(epoch FROM lease_expires_at) * 1000000)::bigint,
         GREATEST(0, floor(extract(epoch FROM expires_at - now()) * 1000))::bigint,
         trace_id,
         tenant_id, endpoint, idempotency_key
  FROM idempotency_requests
  WHERE tenant_id = u.tenant_id AND endpoint = u.endpoint
    AND idempotency_key = u.idempotency_key
  OFFSET 0) AS r)sql";

// kCompleteSql for many records, each guarded by its own member's fencing token and the
// in-progress state: a member whose guard fails matches nothing and is simply absent
// from RETURNING (it then asks kCompletedAlreadySql on its own, as the single completion
// does). The key names each member's row. Members arrive sorted by key; with the nested
// loop this gets (docs/performance.md) rows are locked in that order, and a deadlock
// that some other plan might still produce fails the batch, whose members then complete
// one by one.
// The join is the only way this statement can reach a row: no condition here names a
// column of the table alone. The state guard compares with a column of the unnested
// members (`expected_state`, always 'in_progress') instead of the literal, because
// `state = 'in_progress'` alone matches the partial in-progress index, and on a table
// without statistics (young, restored, upgraded) or between two vacuums the planner then
// scanned that index, every completed row's dead entry included, and hashed the members:
// about 6 ms per batch on a 27 000-row table instead of 0.1 ms, PostgreSQL's CPU per new
// key tripled (docs/performance.md, "A plan trap of the batched writes"). With no
// condition on the table alone, each member probes the primary key (a nested loop), and
// a table partitioned by tenant is pruned to each member's partition at run time.
constexpr const char* kCompleteBatchSql = R"sql(
UPDATE idempotency_requests AS r
SET state = 'completed',
    response_status = u.status,
    response_headers = u.headers::jsonb,
    response_body = u.body,
    response_body_omitted = u.body_omitted,
    resource_id = NULLIF(u.resource_id, ''),
    completed_at = now(),
    expires_at = GREATEST(r.expires_at, now() + u.retention_ms * interval '1 millisecond'),
    lease_expires_at = NULL,
    trace_id = NULLIF(u.trace_id, '')
FROM (SELECT unnest($1::text[]) AS tenant_id, unnest($2::text[]) AS endpoint,
             unnest($3::text[]) AS idempotency_key, unnest($4::bigint[]) AS fencing_token,
             unnest($5::integer[]) AS status, unnest($6::text[]) AS headers,
             unnest($7::bytea[]) AS body, unnest($8::boolean[]) AS body_omitted,
             unnest($9::text[]) AS resource_id, unnest($10::bigint[]) AS retention_ms,
             unnest($11::text[]) AS trace_id, 'in_progress'::text AS expected_state) AS u
WHERE r.tenant_id = u.tenant_id AND r.endpoint = u.endpoint
  AND r.idempotency_key = u.idempotency_key
  AND r.fencing_token = u.fencing_token
  AND r.state = u.expected_state
RETURNING r.tenant_id, r.endpoint, r.idempotency_key,
          (extract(epoch FROM r.expires_at) * 1000000)::bigint)sql";

// kCompleteBatchSql for members whose claim this process made in a batch and whose row
// has not moved since: the claim's RETURNING told where the row was written (its ctid,
// HeldClaims), and the join reaches it there, a TID scan per member, instead of a descent
// of the primary key, whose pages on a large table are mostly not in shared buffers. The
// address is a hint and nothing more: every condition of kCompleteBatchSql still applies
// (the full key, the fence, the state), so an address that now holds another row, or a
// version of this one that is no longer current, matches nothing. A member absent from
// RETURNING is therefore not known to be fenced: it is completed again by its key
// (kCompleteSql), which decides. Members sorted by key, as for kCompleteBatchSql, and
// the nested loop over the members locks rows in that order.
constexpr const char* kCompleteByRowBatchSql = R"sql(
UPDATE idempotency_requests AS r
SET state = 'completed',
    response_status = u.status,
    response_headers = u.headers::jsonb,
    response_body = u.body,
    response_body_omitted = u.body_omitted,
    resource_id = NULLIF(u.resource_id, ''),
    completed_at = now(),
    expires_at = GREATEST(r.expires_at, now() + u.retention_ms * interval '1 millisecond'),
    lease_expires_at = NULL,
    trace_id = NULLIF(u.trace_id, '')
FROM (SELECT unnest($1::text[]) AS tenant_id, unnest($2::text[]) AS endpoint,
             unnest($3::text[]) AS idempotency_key, unnest($4::bigint[]) AS fencing_token,
             unnest($5::integer[]) AS status, unnest($6::text[]) AS headers,
             unnest($7::bytea[]) AS body, unnest($8::boolean[]) AS body_omitted,
             unnest($9::text[]) AS resource_id, unnest($10::bigint[]) AS retention_ms,
             unnest($11::text[]) AS trace_id, unnest($12::tid[]) AS row_address,
             'in_progress'::text AS expected_state) AS u
WHERE r.ctid = u.row_address
  AND r.tenant_id = u.tenant_id AND r.endpoint = u.endpoint
  AND r.idempotency_key = u.idempotency_key
  AND r.fencing_token = u.fencing_token
  AND r.state = u.expected_state
RETURNING r.tenant_id, r.endpoint, r.idempotency_key,
          (extract(epoch FROM r.expires_at) * 1000000)::bigint)sql";

// kReleaseSql and kRenewSql for many records, each guarded by its own member's fencing
// token and the in-progress state, like kCompleteBatchSql (the same join on the full key,
// members sorted by key, the state guard through the members for the same reason). A
// member whose guard fails is absent from RETURNING: its write matched nothing, which is
// exactly what its single statement would have answered (false). A released row takes
// its registered operation ids with it (ON DELETE CASCADE), as the single DELETE does.
constexpr const char* kReleaseBatchSql = R"sql(
DELETE FROM idempotency_requests AS r
USING (SELECT unnest($1::text[]) AS tenant_id, unnest($2::text[]) AS endpoint,
              unnest($3::text[]) AS idempotency_key, unnest($4::bigint[]) AS fencing_token,
              'in_progress'::text AS expected_state) AS u
WHERE r.tenant_id = u.tenant_id AND r.endpoint = u.endpoint
  AND r.idempotency_key = u.idempotency_key
  AND r.fencing_token = u.fencing_token
  AND r.state = u.expected_state
RETURNING r.tenant_id, r.endpoint, r.idempotency_key)sql";

constexpr const char* kRenewBatchSql = R"sql(
UPDATE idempotency_requests AS r
SET lease_expires_at = now() + u.lease_ms * interval '1 millisecond',
    expires_at = GREATEST(r.expires_at, now() + u.lease_ms * interval '1 millisecond')
FROM (SELECT unnest($1::text[]) AS tenant_id, unnest($2::text[]) AS endpoint,
             unnest($3::text[]) AS idempotency_key, unnest($4::bigint[]) AS fencing_token,
             unnest($5::bigint[]) AS lease_ms, 'in_progress'::text AS expected_state) AS u
WHERE r.tenant_id = u.tenant_id AND r.endpoint = u.endpoint
  AND r.idempotency_key = u.idempotency_key
  AND r.fencing_token = u.fencing_token
  AND r.state = u.expected_state
RETURNING r.tenant_id, r.endpoint, r.idempotency_key)sql";

// The store-level error for a failed pg call. Built in place: result<bool> refuses an
// implicit error_code, which is itself convertible to bool.
template <class T>
result<T> failed(const error_code& pg_error) {
  return result<T>(boost::system::in_place_error, make_error_code(pg::to_store_errc(pg_error)));
}

error_code bad_row() { return make_error_code(errc::store_protocol); }

std::string millis(Millis d) { return std::to_string(d.count()); }

// Column indexes of kReadSql.
enum ReadColumn {
  kColFingerprint,
  kColPrincipal,
  kColState,
  kColAttempt,
  kColFence,
  kColLeaseExpired,
  kColExpired,
  kColLeaseRemaining,
  kColStatus,
  kColHeaders,
  kColBody,
  kColBodyOmitted,
  kColResourceId,
  kColCreatedAt,
  kColCompletedAt,
  kColExpiresAt,
  kColLeaseExpiresAt,
  kColRetentionRemaining,
  kColTraceId,
  kReadColumns
};

// What the record table's CHECK constraint refused until migration 0012 dropped it (its
// per-statement cost, docs/performance.md "No CHECK on the record"): the store's own
// writers only write whole records, so a broken one was written by hand or by a damaged
// writer, and nothing in it can be trusted to replay, to take over or to send as a header.
// Answered as a store error instead.
bool whole_record(const pg::Result& r, int row, State state, std::int64_t attempt) {
  if (attempt < 1) return false;
  if (state == State::in_progress && r.is_null(row, kColLeaseExpiresAt)) return false;
  if (state == State::completed && (r.is_null(row, kColStatus) || r.is_null(row, kColCompletedAt))) {
    return false;
  }
  // X-Idempotency-Trace-Id and the replay's span link carry it as read.
  const std::string_view trace = r.value(row, kColTraceId);
  return r.is_null(row, kColTraceId) || (trace.size() == 32 && text::is_lower_hex(trace));
}

// Reads the columns of IDEM_RECORD_COLUMNS in row `row`, which come first (a lookup may
// add its own after: kFindOperationSql, kReadBatchSql).
result<Record> decode_record(const pg::Result& r, int row = 0) {
  if (r.columns() < kReadColumns) return bad_row();
  Record rec;
  rec.fingerprint = std::string(r.value(row, kColFingerprint));
  rec.principal = std::string(r.value(row, kColPrincipal));
  const std::string_view state = r.value(row, kColState);
  if (state == "in_progress") {
    rec.state = State::in_progress;
  } else if (state == "completed") {
    rec.state = State::completed;
  } else {
    return bad_row();
  }
  const auto attempt = r.int64(row, kColAttempt);
  const auto fence = r.int64(row, kColFence);
  const auto lease_expired = r.boolean(row, kColLeaseExpired);
  const auto expired = r.boolean(row, kColExpired);
  const auto lease_remaining = r.int64(row, kColLeaseRemaining);
  const auto created = r.int64(row, kColCreatedAt);
  const auto expires = r.int64(row, kColExpiresAt);
  const auto retention_remaining = r.int64(row, kColRetentionRemaining);
  if (!attempt || !fence || !expired || !lease_remaining || !created || !expires ||
      !retention_remaining || !whole_record(r, row, rec.state, *attempt)) {
    return bad_row();
  }
  rec.attempt = *attempt;
  rec.fence = *fence;
  rec.lease_expired = lease_expired.value_or(false);  // NULL for completed rows
  rec.expired = *expired;
  rec.lease_remaining = Millis{*lease_remaining};
  rec.retention_remaining = Millis{*retention_remaining};
  rec.created_at_us = *created;
  rec.expires_at_us = *expires;
  rec.completed_at_us = r.int64(row, kColCompletedAt).value_or(0);
  rec.lease_expires_at_us = r.int64(row, kColLeaseExpiresAt).value_or(0);

  if (rec.state == State::completed) {
    StoredResponse resp;
    const auto status = r.int64(row, kColStatus);
    const auto omitted = r.boolean(row, kColBodyOmitted);
    if (!status || !omitted) return bad_row();
    resp.status = static_cast<int>(*status);
    resp.body_omitted = *omitted;
    if (!r.is_null(row, kColHeaders)) {
      auto headers = detail::decode_headers_json(r.value(row, kColHeaders));
      if (!headers) return bad_row();
      resp.headers = std::move(*headers);
    }
    if (!r.is_null(row, kColBody)) {
      auto body = r.bytea(row, kColBody);
      if (!body) return bad_row();
      resp.body = std::move(*body);
    }
    resp.resource_id = std::string(r.value(row, kColResourceId));
    resp.trace_id = std::string(r.value(row, kColTraceId));
    rec.response = std::move(resp);
  }
  return rec;
}

// RETURNING attempt_token, fencing_token, created_at, expires_at: one row = the write
// happened.
// `columns`: the statement's RETURNING, whose first four are the ownership (the claim's
// adds its row address).
result<std::optional<Ownership>> returned_ownership(const pg::Result& r, int columns = 4) {
  if (r.rows() == 0) return std::optional<Ownership>{};
  const auto attempt = r.int64(0, 0);
  const auto fence = r.int64(0, 1);
  const auto created = r.int64(0, 2);
  const auto expires = r.int64(0, 3);
  if (r.columns() != columns || !attempt || !fence || !created || !expires) return bad_row();
  return std::optional<Ownership>{Ownership{*attempt, *fence, *created, *expires}};
}

}  // namespace

const std::vector<pg::PreparedStatement>& pg_store_statements() {
  static const std::vector<pg::PreparedStatement> statements = {
      {kClaim, kClaimSql},
      {kRead, kReadSql},
      {kTakeOver, kTakeOverSql},
      {kReplaceExpired, kReplaceExpiredSql},
      {kComplete, kCompleteSql},
      {kCompletedAlready, kCompletedAlreadySql},
      {kRelease, kReleaseSql},
      {kRenew, kRenewSql},
      {kExpireLease, kExpireLeaseSql},
      {kPurge, kPurgeSql},
      {kDeleteExpired, kDeleteExpiredSql},
      {kRegisterOperation, kRegisterOperationSql},
      {kFindOperation, kFindOperationSql},
      {kNotePayload, kNotePayloadSql},
      {kClaimBatch, kClaimBatchSql},
      {kReadBatch, kReadBatchSql},
      {kCompleteBatch, kCompleteBatchSql},
      {kCompleteByRowBatch, kCompleteByRowBatchSql},
      {kCompleteByRow, kCompleteByRowSql},
      {kReleaseBatch, kReleaseBatchSql},
      {kRenewBatch, kRenewBatchSql},
  };
  return statements;
}

// Every statement above reaches its rows through an index by key (or by expiry, for the
// cleanup): none is meant to scan the table or hash it. Yet a prepared statement keeps the
// generic plan it made when it was first run often enough, and on a young table (the
// first seconds after the migrations, or after a restore) that plan scanned and hashed:
// the batched completion, planned while the table held a few dozen rows, kept a
// sequential scan as the table grew, and new keys fell from 2 700/s to 780/s within 15
// seconds (each batch reading the whole table) until the connection was replaced. Sessions
// of the store therefore never choose a sequential scan, a hash join or a merge join while
// an index path exists ("enable_*" only make a path costly, never impossible, so a
// statement with no other path still runs), whatever the statistics say at the moment a
// plan is cached. tests/store/test_batching.cpp ("…whatever the statistics") runs the
// statements prepared on a table that grows under them.
//
// And they always run the generic plan. Left to choose (plan_cache_mode auto), a session
// compares the generic plan's estimate (ten members per array) with the average cost of
// the custom plans it made so far, and the choice sticks either way: once generic, it
// makes no more custom plans to compare with; once custom, each new custom plan keeps the
// average where it is. A session that first ran small batches (a quiet start, then load)
// planned the batched completion anew in every write cycle for its whole life: 14 % of
// PostgreSQL's CPU in the planner, 1.3 x its CPU per new key against a session that
// happened to go generic (docs/performance.md, "Generic plans, for good"). The generic
// plans are the plans wanted: every statement probes by key, row address or expiry
// whatever the parameters (the settings above, and test_batching.cpp and
// test_routing.cpp check each statement in this mode, on a young table too).
const std::vector<pg::SessionSetting>& pg_store_session_settings() {
  static const std::vector<pg::SessionSetting> settings = {
      {"enable_seqscan", "off"},
      {"enable_hashjoin", "off"},
      {"enable_mergejoin", "off"},
      {"plan_cache_mode", "force_generic_plan"},
  };
  return settings;
}

// The schema in the name lets `migrate --contract` see which releases still connect
// (older_replica_sessions()); releases before it named none.
std::string replica_application_name(std::string_view role) {
  const auto& list = embedded_migrations();
  const int schema = list.empty() ? 0 : list.back().version;
  return std::string(role) + " schema=" + std::to_string(schema);
}

pg::PoolOptions pg_store_pool_options(std::string conninfo, std::size_t size,
                                      Millis connect_timeout, Millis statement_timeout) {
  pg::PoolOptions po;
  po.conninfo = std::move(conninfo);
  po.size = size;
  po.connect_timeout = connect_timeout;
  po.statement_timeout = statement_timeout;
  po.acquire_timeout = statement_timeout;
  po.statements = pg_store_statements();
  po.settings = pg_store_session_settings();
  po.application_name = replica_application_name("idemproxy");
  return po;
}

// ---------------------------------------------------------------------------- shared state

// The claims this process holds: won (claim, take-over, replacement) and not yet
// completed, released, expired or fenced, by fencing token (unique per claim). The
// stuck-work gauge reads it instead of the table: any index that could find in-progress
// rows names a column the completion changes, and would make every completion a non-HOT
// update (docs/performance.md, "The lean record"). A claim whose lease ran out without a
// renewal is no longer held by anyone (a retry takes it over): it is dropped when read.
//
// It also keeps where each batched claim's row was written (its ctid), so that the batched
// completion reaches the row directly instead of descending the primary key again, whose
// pages are mostly cold on a table larger than shared buffers (docs/performance.md,
// "Completions by row address"). The address is only a hint: the
// completion still names the full key and the fence, and a row that moved (a renewal,
// a takeover, a table rewrite) is simply not found there and is completed by its key.
struct PgStore::HeldClaims {
  struct RowAddress {
    std::uint32_t block = 0;
    std::uint16_t offset = 0;
  };
  struct Held {
    SteadyClock::time_point since;
    SteadyClock::time_point lease_until;
    std::optional<RowAddress> row;
  };
  std::mutex mutex;
  std::unordered_map<std::int64_t, Held> by_fence;

  // Keeps a row address located() earlier for this claim.
  void hold(std::int64_t fence, Millis lease) {
    const auto now = SteadyClock::now();
    std::lock_guard lock(mutex);
    Held& h = by_fence[fence];
    h.since = now;
    h.lease_until = now + lease;
  }
  // Where a claim's row was written, told by its batch before the caller holds it. A
  // caller that never does (its wait was cancelled) leaves an entry whose lease is already
  // over: oldest() drops it.
  void located(std::int64_t fence, RowAddress row) {
    std::lock_guard lock(mutex);
    by_fence[fence].row = row;
  }
  // A renewal writes a new version of the row, elsewhere.
  void renewed(std::int64_t fence, Millis lease) {
    std::lock_guard lock(mutex);
    if (auto it = by_fence.find(fence); it != by_fence.end()) {
      it->second.lease_until = SteadyClock::now() + lease;
      it->second.row.reset();
    }
  }
  // Its row is no longer where the claim wrote it.
  void forget_row(std::int64_t fence) {
    std::lock_guard lock(mutex);
    if (auto it = by_fence.find(fence); it != by_fence.end()) it->second.row.reset();
  }
  std::optional<RowAddress> row_of(std::int64_t fence) {
    std::lock_guard lock(mutex);
    auto it = by_fence.find(fence);
    return it != by_fence.end() ? it->second.row : std::nullopt;
  }
  // The row address of each fence, where known (one lock for a batch).
  std::vector<std::optional<RowAddress>> rows_of(const std::vector<std::int64_t>& fences) {
    std::vector<std::optional<RowAddress>> out;
    out.reserve(fences.size());
    std::lock_guard lock(mutex);
    for (const std::int64_t fence : fences) {
      auto it = by_fence.find(fence);
      out.push_back(it != by_fence.end() ? it->second.row : std::nullopt);
    }
    return out;
  }
  void drop(std::int64_t fence) {
    std::lock_guard lock(mutex);
    by_fence.erase(fence);
  }
  std::optional<Millis> oldest() {
    const auto now = SteadyClock::now();
    std::lock_guard lock(mutex);
    std::optional<SteadyClock::time_point> first;
    for (auto it = by_fence.begin(); it != by_fence.end();) {
      if (it->second.lease_until <= now) {
        it = by_fence.erase(it);
        continue;
      }
      if (!first || it->second.since < *first) first = it->second.since;
      ++it;
    }
    if (!first) return std::nullopt;
    return std::chrono::duration_cast<Millis>(now - *first);
  }
};

struct PgStore::Core {
  std::shared_ptr<pg::Pool> pool;
  std::shared_ptr<HeldClaims> held;  // the process's (PgStore::held_)
  ClaimRead claim_read = ClaimRead::adaptive;
  bool lone_calls_batched = false;
  std::function<void(std::string_view, std::size_t)> on_batch;
  // Exponentially weighted share of recent claims that were lost (0..1).
  double lost_share = 0.0;
  BatchStats stats;

  // Reading along costs every winner a statement it discards (measured at roughly a
  // tenth more database CPU per new key) and saves every loser a round trip (roughly a
  // third of a duplicate's cost), so it pays once about one claim in eight is lost.
  bool read_with_claim() const noexcept {
    switch (claim_read) {
      case ClaimRead::always: return true;
      case ClaimRead::never: return false;
      case ClaimRead::adaptive: break;
    }
    return lost_share >= 1.0 / 8;
  }
  // Weighted over roughly the last 32 claims.
  void count_claim(bool lost) noexcept { lost_share += ((lost ? 1.0 : 0.0) - lost_share) / 32; }
};

namespace {

using detail::ArrayParam;

// A ctid as the server prints it, "(block,offset)"; nullopt for anything else (the
// address is only a hint: HeldClaims).
std::optional<PgStore::HeldClaims::RowAddress> row_address(std::string_view text) {
  if (text.size() < 5 || text.front() != '(' || text.back() != ')') return std::nullopt;
  const char* p = text.data() + 1;
  const char* end = text.data() + text.size() - 1;
  PgStore::HeldClaims::RowAddress at;
  auto [after_block, ec1] = std::from_chars(p, end, at.block);
  if (ec1 != std::errc{} || after_block == end || *after_block != ',') return std::nullopt;
  auto [after_offset, ec2] = std::from_chars(after_block + 1, end, at.offset);
  if (ec2 != std::errc{} || after_offset != end) return std::nullopt;
  return at;
}

// The statements take the key as $1..$3; `extra` follows from $4. Parameters view their
// strings, which live in the calling coroutine's frame until the call completes.
std::vector<pg::Param> key_params(const RecordId& id, std::initializer_list<pg::Param> extra) {
  std::vector<pg::Param> params{pg::Param::text(id.tenant), pg::Param::text(id.endpoint),
                                pg::Param::text(id.key)};
  params.insert(params.end(), extra.begin(), extra.end());
  return params;
}

// Note: parameter vectors are built in named variables before co_await; GCC 12 rejects
// an initializer_list temporary inside a co_await expression.

// ------------------------------------------------------------------ one call, one statement

// kClaimSql's answer: the ownership of a won claim, whose row address the process keeps
// for the completion (HeldClaims; the caller holds the claim once it is answered).
result<std::optional<Ownership>> claimed(PgStore::Core& core, const pg::Result& r) {
  auto owner = returned_ownership(r, 5);
  if (owner && *owner && core.held) {
    if (const auto at = row_address(r.value(0, 4))) core.held->located((*owner)->fence, *at);
  }
  return owner;
}

asio::awaitable<result<ClaimResult>> claim_one(std::shared_ptr<PgStore::Core> core,
                                               const ClaimRequest& req) {
  const std::string lease = millis(req.lease);
  const std::string retention = millis(req.retention);
  auto params = key_params(req.id, {pg::Param::text(req.fingerprint),
                                    pg::Param::text(req.principal), pg::Param::text(lease),
                                    pg::Param::text(retention)});
  if (!core->read_with_claim()) {
    auto r = co_await core->pool->execute(kClaim, std::move(params));
    if (!r) co_return failed<ClaimResult>(r.error());
    auto owner = claimed(*core, *r);
    if (!owner) co_return owner.error();
    core->count_claim(!*owner);
    if (!*owner) co_return ClaimResult{};
    co_return ClaimResult{true, **owner};
  }

  // The claim and the read a loser needs go out together (pipeline mode, one sync point):
  // one round trip instead of two for a duplicate. The read is a statement of its own
  // after the claim, so under READ COMMITTED it takes a new snapshot and sees the
  // winner's committed row, exactly as a separate read() would. The two form one
  // implicit transaction that commits at the sync, before this returns: a won claim is
  // still committed before anything is forwarded. A winner discards the read (it would
  // only see its own row).
  std::vector<pg::Pool::Batched> statements;
  statements.push_back({kClaim, std::move(params)});
  statements.push_back({kRead, key_params(req.id, {})});
  auto r = co_await core->pool->execute_pipeline(std::move(statements));
  if (!r) co_return failed<ClaimResult>(r.error());
  auto owner = claimed(*core, (*r)[0]);
  if (!owner) co_return owner.error();
  core->count_claim(!*owner);
  if (*owner) co_return ClaimResult{true, **owner};
  ClaimResult lost;
  lost.row_read = true;
  if ((*r)[1].rows() > 0) {
    auto rec = decode_record((*r)[1]);
    if (!rec) co_return rec.error();
    lost.row = std::move(*rec);
  }
  co_return lost;
}

result<Completed> completed_at(const pg::Result& rows, int row, int col, Completion outcome) {
  const auto us = rows.int64(row, col);
  if (!us) return bad_row();
  return Completed{outcome, *us};
}

// The completion's answer as parameters $4..$9 (fence, status, headers, body, omitted,
// resource id), viewing `token`, `status` and `headers`.
std::vector<pg::Param> answer_params(const RecordId& id, const std::string& token,
                                     const std::string& status, const std::string& headers,
                                     const StoredResponse& response) {
  // An omitted body is stored as NULL: "no body kept" rather than "an empty body".
  const pg::Param body =
      response.body_omitted ? pg::Param::null_value() : pg::Param::bytes(response.body);
  return key_params(id, {pg::Param::text(token), pg::Param::text(status),
                         pg::Param::text(headers), body,
                         pg::Param::text(response.body_omitted ? "true" : "false"),
                         pg::Param::text(response.resource_id)});
}

// Asked only when a completion wrote nothing: was this very answer already recorded
// under this very fence (a retried completion whose first try committed)? Else fenced.
asio::awaitable<result<Completed>> completed_already(std::shared_ptr<pg::Pool> pool,
                                                     const RecordId& id, std::int64_t fence,
                                                     const StoredResponse& response) {
  const std::string token = std::to_string(fence);
  const std::string status = std::to_string(response.status);
  const std::string headers = detail::encode_headers_json(response.headers);
  auto params = answer_params(id, token, status, headers, response);
  auto already = co_await pool->execute(kCompletedAlready, std::move(params));
  if (!already) co_return failed<Completed>(already.error());
  if (already->rows() != 1) co_return Completed{Completion::fenced, 0};
  co_return completed_at(*already, 0, 0, Completion::already_recorded);
}

// A completion on its own: at the row address its claim returned when the process still
// knows it (kCompleteByRowSql, a TID scan), else by its key (kCompleteSql). A row not
// found at its address may only have moved (a rewrite of the row by another session, a
// table rewrite): the keyed statement then decides, and the address is forgotten.
asio::awaitable<result<Completed>> complete_one(std::shared_ptr<PgStore::Core> core,
                                                const RecordId& id, std::int64_t fence,
                                                const StoredResponse& response,
                                                Millis retention) {
  const std::string token = std::to_string(fence);
  const std::string status = std::to_string(response.status);
  const std::string headers = detail::encode_headers_json(response.headers);
  const std::string retention_ms = millis(retention);
  auto params = answer_params(id, token, status, headers, response);
  params.push_back(pg::Param::text(retention_ms));
  params.push_back(pg::Param::text(response.trace_id));
  const auto at = core->held ? core->held->row_of(fence) : std::nullopt;
  if (at) {
    const std::string address = "(" + std::to_string(at->block) + "," + std::to_string(at->offset) + ")";
    auto by_row = params;
    by_row.push_back(pg::Param::text(address));
    auto r = co_await core->pool->execute(kCompleteByRow, std::move(by_row));
    if (!r) co_return failed<Completed>(r.error());
    ++core->stats.completions_alone_by_row;
    if (r->rows() == 1) co_return completed_at(*r, 0, 0, Completion::recorded);
    ++core->stats.completions_alone_moved;
    core->held->forget_row(fence);
  }
  auto r = co_await core->pool->execute(kComplete, std::move(params));
  if (!r) co_return failed<Completed>(r.error());
  if (r->rows() == 1) co_return completed_at(*r, 0, 0, Completion::recorded);
  co_return co_await completed_already(core->pool, id, fence, response);
}

// ------------------------------------------------------------------------------- batches

// A batch the server refused outright (an SQL error: the transaction rolled back, nothing
// of it was committed) is retried call by call: one member that cannot succeed (a
// deadlock victim, a value the server rejects) must not fail the others. A batch that
// timed out or lost its connection may or may not have committed, exactly like a single
// call in that situation, and retrying would double the wait of every member of a batch
// against a database that is not answering: each member fails as its own call would.
bool retry_alone(const error_code& ec) {
  return !pg::sqlstate(ec).empty() && pg::to_store_errc(ec) == errc::store_protocol;
}

bool has_nul(std::string_view s) { return s.find('\0') != std::string_view::npos; }

// A map key for the full primary key; lengths first, so no two keys collide.
std::string full_key(std::string_view tenant, std::string_view endpoint, std::string_view key) {
  std::string k;
  k.reserve(tenant.size() + endpoint.size() + key.size() + 12);
  k.append(std::to_string(tenant.size())).push_back(':');
  k.append(tenant);
  k.append(std::to_string(endpoint.size())).push_back(':');
  k.append(endpoint);
  k.append(key);
  return k;
}
std::string full_key(const RecordId& id) { return full_key(id.tenant, id.endpoint, id.key); }
// The key in columns first..first+2 of a row.
std::string full_key(const pg::Result& r, int row, int first) {
  return full_key(r.value(row, first), r.value(row, first + 1), r.value(row, first + 2));
}

bool key_less(const RecordId& a, const RecordId& b) {
  return std::tie(a.tenant, a.endpoint, a.key) < std::tie(b.tenant, b.endpoint, b.key);
}

// Parallel arrays of the batch's keys (the first three parameters of every batch).
struct KeyArrays {
  ArrayParam tenants{ArrayParam::Type::text};
  ArrayParam endpoints{ArrayParam::Type::text};
  ArrayParam keys{ArrayParam::Type::text};
  void add(const RecordId& id) {
    tenants.add_text(id.tenant);
    endpoints.add_text(id.endpoint);
    keys.add_text(id.key);
  }
};

// Encoded parameters and the buffers they view (kept in the batch's frame; a deque, so
// adding a buffer never moves the earlier ones).
struct Encoded {
  std::deque<std::string> storage;
  std::vector<pg::Param> params;
  void add(const ArrayParam& a) {
    storage.emplace_back();
    params.push_back(a.param(storage.back()));
  }
};

struct ClaimItem {
  ClaimRequest req;  // a copy: a few short strings
};
using ClaimBatcher = detail::Batcher<ClaimItem, result<ClaimResult>>;

// Member indexes in key order (one lock order for every batch: kClaimBatchSql); stable,
// so of a repeated key the member that came first comes first.
template <class Slots, class IdOf>
std::vector<std::size_t> key_order(const Slots& batch, IdOf id_of) {
  std::vector<std::size_t> order(batch.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return key_less(id_of(*batch[a]), id_of(*batch[b]));
  });
  return order;
}

// What one claim batch sends: the INSERT of every distinct key and, when wanted, the read
// of the rows its losers need. Built before the round trip, from the members' copies.
struct ClaimPlan {
  bool read_along = false;
  std::vector<bool> inserts;  // by member: its row is in the INSERT
  Encoded insert, read;
  bool with_read = false;
};

ClaimPlan plan_claims(const PgStore::Core& core, const std::vector<ClaimBatcher::SlotPtr>& batch) {
  ClaimPlan plan;
  plan.read_along = core.read_with_claim();
  plan.inserts.assign(batch.size(), false);
  std::unordered_map<std::string, std::size_t> inserting;  // key -> its inserting member
  std::vector<bool> repeated(batch.size(), false);         // by inserting member
  KeyArrays insert_keys, read_keys;
  ArrayParam fingerprints{ArrayParam::Type::text}, principals{ArrayParam::Type::text};
  ArrayParam leases{ArrayParam::Type::int8}, retentions{ArrayParam::Type::int8};
  for (const std::size_t i : key_order(batch, [](const auto& s) -> const RecordId& { return s.item.req.id; })) {
    const ClaimRequest& req = batch[i]->item.req;
    auto [it, first] = inserting.emplace(full_key(req.id), i);
    if (!first) {
      // A repeat: it needs the key's row (read once per key; with read_along it is
      // already among the reads).
      if (!plan.read_along && !repeated[it->second]) read_keys.add(req.id);
      repeated[it->second] = true;
      continue;
    }
    plan.inserts[i] = true;
    insert_keys.add(req.id);
    fingerprints.add_text(req.fingerprint);
    principals.add_text(req.principal);
    leases.add_int64(req.lease.count());
    retentions.add_int64(req.retention.count());
    if (plan.read_along) read_keys.add(req.id);
  }
  for (const auto* a : {&insert_keys.tenants, &insert_keys.endpoints, &insert_keys.keys,
                        &fingerprints, &principals, &leases, &retentions}) {
    plan.insert.add(*a);
  }
  plan.with_read = read_keys.keys.size() > 0;
  if (plan.with_read) {
    for (const auto* a : {&read_keys.tenants, &read_keys.endpoints, &read_keys.keys}) {
      plan.read.add(*a);
    }
  }
  return plan;
}

// Each member's answer from the batch's results: winners by the key RETURNING names,
// losers with the row read for them (repeats always, others with read_along).
// `won`: the INSERT's rows; `read`: the losers' read (when plan.with_read).
void answer_claims(PgStore::Core& core, const ClaimPlan& plan, const pg::Result& won,
                   const pg::Result* read_rows, std::vector<ClaimBatcher::SlotPtr>& batch) {
  const auto fail_all = [&](error_code ec) {
    for (auto& s : batch) s->out = result<ClaimResult>(ec);
  };
  std::unordered_map<std::string, Ownership> owners;
  for (int row = 0; row < won.rows(); ++row) {
    const auto attempt = won.int64(row, 3);
    const auto fence = won.int64(row, 4);
    const auto created = won.int64(row, 5);
    const auto expires = won.int64(row, 6);
    if (won.columns() != 8 || !attempt || !fence || !created || !expires) return fail_all(bad_row());
    owners.emplace(full_key(won, row, 0), Ownership{*attempt, *fence, *created, *expires});
    if (const auto at = row_address(won.value(row, 7)); at && core.held) core.held->located(*fence, *at);
  }
  std::unordered_map<std::string, Record> rows;
  if (plan.with_read) {
    if (read_rows == nullptr) return fail_all(bad_row());
    const pg::Result& read = *read_rows;
    for (int row = 0; row < read.rows(); ++row) {
      auto rec = decode_record(read, row);
      if (!rec) return fail_all(rec.error());
      rows.emplace(full_key(read, row, kReadColumns), std::move(*rec));
    }
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const std::string key = full_key(batch[i]->item.req.id);
    if (plan.inserts[i]) {
      if (auto it = owners.find(key); it != owners.end()) {
        core.count_claim(false);
        batch[i]->out = ClaimResult{true, it->second};
        continue;
      }
    }
    core.count_claim(true);
    ClaimResult lost;
    if (!plan.inserts[i] || plan.read_along) {
      lost.row_read = true;
      if (auto it = rows.find(key); it != rows.end()) lost.row = it->second;
    }
    batch[i]->out = std::move(lost);
  }
}

// After a failed batch: every member alone (the server refused it) or failed as its own
// call would have.
template <class Slots, class Members, class Out>
void batch_failed(PgStore::Core& core, const error_code& ec, Slots& batch, const Members& members,
                  Out failure) {
  const bool alone = retry_alone(ec);
  if (alone) ++core.stats.batches_refused;
  for (std::size_t i : members) {
    if (alone) {
      batch[i]->alone = true;
    } else {
      batch[i]->out = failure;
    }
  }
}

std::vector<std::size_t> all_members(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Larger answers are completed alone, without a batch: a batch's statement stays a few
// MiB at most, and an answer is copied into the batch only when it is small.
constexpr std::size_t kMaxBatchedBody = 256u << 10;

struct CompleteItem {
  // Copies: the batch may run on another event loop than its caller (batcher.hpp), and
  // outlive a caller whose wait was cancelled. Bodies are at most kMaxBatchedBody.
  RecordId id;
  std::int64_t fence;
  StoredResponse response;
  Millis retention;
};
using CompleteBatcher = detail::Batcher<CompleteItem, result<Completed>>;

// A lone completion, on the batch's side (the slot, which owns the item, outlives it).
asio::awaitable<result<Completed>> complete_alone(std::shared_ptr<PgStore::Core> core,
                                                  const CompleteItem& c) {
  co_return co_await complete_one(std::move(core), c.id, c.fence, c.response, c.retention);
}

// Which members the UPDATE carries: each key once. A repeated key (two callers completing
// one record) is sent alone at once, so that each member is answered by its own write.
std::vector<std::size_t> completion_members(std::vector<CompleteBatcher::SlotPtr>& batch) {
  std::unordered_map<std::string, std::size_t> seen;
  std::vector<std::size_t> members;
  for (std::size_t i : key_order(batch, [](const auto& s) -> const RecordId& { return s.item.id; })) {
    if (!seen.emplace(full_key(batch[i]->item.id), i).second) {
      CompleteBatcher::run_alone(batch[i]);
      continue;
    }
    members.push_back(i);
  }
  return members;
}

// The arrays of kCompleteBatchSql for `members`, and with `rows` (one per member) the
// row addresses of kCompleteByRowBatchSql.
Encoded encode_completions(const std::vector<CompleteBatcher::SlotPtr>& batch,
                           const std::vector<std::size_t>& members,
                           const std::vector<PgStore::HeldClaims::RowAddress>* rows) {
  KeyArrays keys;
  ArrayParam fences{ArrayParam::Type::int8}, statuses{ArrayParam::Type::int4};
  ArrayParam headers{ArrayParam::Type::text}, bodies{ArrayParam::Type::bytea};
  ArrayParam omitted{ArrayParam::Type::boolean}, resources{ArrayParam::Type::text};
  ArrayParam retentions{ArrayParam::Type::int8}, traces{ArrayParam::Type::text};
  ArrayParam addresses{ArrayParam::Type::tid};
  for (std::size_t i : members) {
    const CompleteItem& c = batch[i]->item;
    keys.add(c.id);
    fences.add_int64(c.fence);
    statuses.add_int32(c.response.status);
    headers.add_text(detail::encode_headers_json(c.response.headers));
    // An omitted body is stored as NULL: "no body kept" rather than "an empty body".
    if (c.response.body_omitted) {
      bodies.add_null();
    } else {
      bodies.add_text(c.response.body);
    }
    omitted.add_bool(c.response.body_omitted);
    resources.add_text(c.response.resource_id);
    retentions.add_int64(c.retention.count());
    traces.add_text(c.response.trace_id);
  }
  if (rows != nullptr) {
    for (const auto& at : *rows) addresses.add_tid(at.block, at.offset);
  }
  Encoded update;
  for (const auto* a : {&keys.tenants, &keys.endpoints, &keys.keys, &fences, &statuses, &headers,
                        &bodies, &omitted, &resources, &retentions, &traces}) {
    update.add(*a);
  }
  if (rows != nullptr) update.add(addresses);
  return update;
}

// One batch of completions: an UPDATE for the members whose row address is known
// (kCompleteByRowBatchSql) and one for the others (kCompleteBatchSql), each row guarded
// by its own member's fence. A member the keyed UPDATE did not write to is answered
// `fenced` here; the caller then asks, on its own, whether its answer was already
// recorded (the rare retry path), exactly as the single completion does. A member the
// addressed UPDATE did not write to runs alone, by its key: its row may only have moved.
struct CompletionPlan {
  struct Part {
    std::vector<std::size_t> members;  // slots, in key order
    std::vector<std::string> member_keys;
    Encoded update;
  };
  std::vector<std::size_t> members;  // every slot the cycle carries, in key order
  Part by_row, by_key;
};

// The members first; their arrays only when the cycle sends the batched UPDATE.
CompletionPlan plan_completions(std::vector<CompleteBatcher::SlotPtr>& batch) {
  CompletionPlan plan;
  plan.members = completion_members(batch);
  return plan;
}

void encode_plan(CompletionPlan& plan, const std::vector<CompleteBatcher::SlotPtr>& batch,
                 PgStore::HeldClaims* held) {
  std::vector<std::int64_t> fences;
  fences.reserve(plan.members.size());
  for (std::size_t i : plan.members) fences.push_back(batch[i]->item.fence);
  std::vector<std::optional<PgStore::HeldClaims::RowAddress>> rows;
  if (held != nullptr) rows = held->rows_of(fences);
  std::vector<PgStore::HeldClaims::RowAddress> addresses;
  for (std::size_t m = 0; m < plan.members.size(); ++m) {
    const bool known = m < rows.size() && rows[m];
    auto& part = known ? plan.by_row : plan.by_key;
    part.members.push_back(plan.members[m]);
    part.member_keys.push_back(full_key(batch[plan.members[m]]->item.id));
    if (known) addresses.push_back(*rows[m]);
  }
  if (!plan.by_row.members.empty()) {
    plan.by_row.update = encode_completions(batch, plan.by_row.members, &addresses);
  }
  if (!plan.by_key.members.empty()) {
    plan.by_key.update = encode_completions(batch, plan.by_key.members, nullptr);
  }
}

// Each member learns whether its own write matched. A member the UPDATE did not return
// was fenced (by_key: the caller then asks whether its very answer is recorded already)
// or, with an address, perhaps only moved (by_row: it runs again alone, by its key).
// Returns how many by_row members were not found at their address.
std::size_t answer_completions(const CompletionPlan::Part& part, bool by_row, const pg::Result& r,
                               std::vector<CompleteBatcher::SlotPtr>& batch,
                               PgStore::HeldClaims* held) {
  std::unordered_map<std::string, Completed> written;
  for (int row = 0; row < r.rows(); ++row) {
    auto done = completed_at(r, row, 3, Completion::recorded);
    if (r.columns() != 4 || !done) {
      for (std::size_t i : part.members) batch[i]->out = result<Completed>(bad_row());
      return 0;
    }
    written.emplace(full_key(r, row, 0), *done);
  }
  std::size_t moved = 0;
  for (std::size_t m = 0; m < part.members.size(); ++m) {
    auto& slot = batch[part.members[m]];
    if (auto it = written.find(part.member_keys[m]); it != written.end()) {
      slot->out = it->second;
    } else if (by_row) {
      ++moved;
      // Alone, it goes by its key (complete_one), not to the same address again.
      if (held != nullptr) held->forget_row(slot->item.fence);
      CompleteBatcher::run_alone(slot);
    } else {
      slot->out = Completed{Completion::fenced, 0};
    }
  }
  return moved;
}

// One write cycle: the claims and the completions that are ready at the same moment go
// in one pipeline with one sync, so in one transaction, one commit and one WAL flush
// (docs/performance.md, "One commit per cycle"), before any member is answered. The
// completions go first, so that a claim that loses to a record completed in this very
// cycle reads it completed. Each member keeps its own condition (the claim's ON
// CONFLICT, the completion's fence), so a member that matches nothing is answered alone
// and the others are not affected; a statement the server refuses (an SQL error) aborts
// the transaction, and then every member runs again on its own, as after a refused batch
// of one kind: nothing of the cycle was committed. Either list may be empty. A key
// claimed twice is inserted once, for the member that came first; the later ones lose
// and get the row read after the insert, in the same transaction (a statement of its own,
// with its own READ COMMITTED snapshot).
asio::awaitable<void> run_cycle(std::shared_ptr<PgStore::Core> core,
                                std::vector<ClaimBatcher::SlotPtr>& claims,
                                std::vector<CompleteBatcher::SlotPtr>& completions) {
  if (!core) co_return;  // the home store is gone: its members fail (batcher.hpp)
  CompletionPlan update = plan_completions(completions);  // repeated keys go alone at once
  const std::size_t members = claims.size() + update.members.size();
  if (members == 0) co_return;
  if (members == 1 && !core->lone_calls_batched) {
    // A lone call goes out as its own statement (no arrays to build or unpack).
    if (!claims.empty()) {
      claims[0]->out = co_await claim_one(core, claims[0]->item.req);
    } else {
      auto& slot = completions[update.members[0]];
      slot->out = co_await complete_alone(core, slot->item);
    }
    co_return;
  }
  // A lone call above needs no arrays: encoded only now.
  encode_plan(update, completions, core->held.get());
  std::vector<pg::Pool::Batched> statements;
  if (!update.members.empty()) {
    ++core->stats.completion_batches;
    core->stats.completions_batched += update.members.size();
    core->stats.completions_by_row += update.by_row.members.size();
    if (core->on_batch) core->on_batch("complete", update.members.size());
  }
  if (!update.by_row.members.empty()) {
    statements.push_back({kCompleteByRowBatch, std::move(update.by_row.update.params)});
  }
  if (!update.by_key.members.empty()) {
    statements.push_back({kCompleteBatch, std::move(update.by_key.update.params)});
  }
  ClaimPlan plan;
  if (!claims.empty()) {
    plan = plan_claims(*core, claims);
    ++core->stats.claim_batches;
    core->stats.claims_batched += claims.size();
    if (core->on_batch) core->on_batch("claim", claims.size());
    statements.push_back({kClaimBatch, std::move(plan.insert.params)});
    if (plan.with_read) statements.push_back({kReadBatch, std::move(plan.read.params)});
  }
  if (!claims.empty() && !update.members.empty()) ++core->stats.combined_cycles;
  auto r = co_await core->pool->execute_pipeline(std::move(statements));
  if (!r) {
    if (!claims.empty()) {
      batch_failed(*core, r.error(), claims, all_members(claims.size()), failed<ClaimResult>(r.error()));
    }
    if (!update.members.empty()) {
      batch_failed(*core, r.error(), completions, update.members, failed<Completed>(r.error()));
    }
    co_return;
  }
  std::size_t next = 0;
  if (!update.by_row.members.empty()) {
    core->stats.completions_moved += answer_completions(update.by_row, true, (*r)[next++], completions,
                                                       core->held.get());
  }
  if (!update.by_key.members.empty()) {
    answer_completions(update.by_key, false, (*r)[next++], completions, nullptr);
  }
  if (!claims.empty()) {
    const pg::Result& won = (*r)[next++];
    answer_claims(*core, plan, won, plan.with_read ? &(*r)[next] : nullptr, claims);
  }
}

// Releases and renewals: the owner writes that carry nothing but the key, the fence and
// (renewals) the lease, and answer whether they matched.
enum class FencedWrite { release, renew };

struct FencedItem {
  RecordId id;  // a copy: a few short strings
  std::int64_t fence;
  Millis lease{0};  // renewals only
};
using FencedBatcher = detail::Batcher<FencedItem, result<bool>>;

asio::awaitable<result<bool>> fenced_one(std::shared_ptr<pg::Pool> pool, FencedWrite kind,
                                         const FencedItem& w) {
  const std::string token = std::to_string(w.fence);
  const std::string lease_ms = millis(w.lease);
  auto params = key_params(w.id, {pg::Param::text(token)});
  if (kind == FencedWrite::renew) params.push_back(pg::Param::text(lease_ms));
  const char* statement = kind == FencedWrite::release ? kRelease : kRenew;
  auto r = co_await pool->execute(statement, std::move(params));
  if (!r) co_return failed<bool>(r.error());
  co_return r->affected_rows() == 1;
}

// One batch of releases or of renewals: one statement, each row guarded by its own
// member's fence; a member its statement did not match is answered false. A key that
// repeats within the batch (two callers writing one record) goes alone, so that each
// member is answered by its own write.
asio::awaitable<void> run_fenced_batch(std::shared_ptr<PgStore::Core> core, FencedWrite kind,
                                       std::vector<FencedBatcher::SlotPtr>& batch) {
  if (!core) co_return;  // the home store is gone: its members fail (batcher.hpp)
  std::unordered_map<std::string, std::size_t> seen;
  std::vector<std::size_t> members;
  for (std::size_t i : key_order(batch, [](const auto& s) -> const RecordId& { return s.item.id; })) {
    if (!seen.emplace(full_key(batch[i]->item.id), i).second) {
      FencedBatcher::run_alone(batch[i]);
      continue;
    }
    members.push_back(i);
  }
  if (members.empty()) co_return;
  if (members.size() == 1 && !core->lone_calls_batched) {
    batch[members[0]]->out = co_await fenced_one(core->pool, kind, batch[members[0]]->item);
    co_return;
  }
  KeyArrays keys;
  ArrayParam fences{ArrayParam::Type::int8}, leases{ArrayParam::Type::int8};
  for (std::size_t i : members) {
    keys.add(batch[i]->item.id);
    fences.add_int64(batch[i]->item.fence);
    leases.add_int64(batch[i]->item.lease.count());
  }
  Encoded statement;
  for (const auto* a : {&keys.tenants, &keys.endpoints, &keys.keys, &fences}) statement.add(*a);
  if (kind == FencedWrite::renew) statement.add(leases);
  const bool release = kind == FencedWrite::release;
  auto& stats = core->stats;
  ++(release ? stats.release_batches : stats.renewal_batches);
  (release ? stats.releases_batched : stats.renewals_batched) += members.size();
  if (core->on_batch) core->on_batch(release ? "release" : "renew", members.size());

  const char* name = release ? kReleaseBatch : kRenewBatch;
  auto r = co_await core->pool->execute(name, std::move(statement.params));
  if (!r) {
    batch_failed(*core, r.error(), batch, members, failed<bool>(r.error()));
    co_return;
  }
  if (r->columns() != 3) {
    for (std::size_t i : members) batch[i]->out = result<bool>(boost::system::in_place_error, bad_row());
    co_return;
  }
  std::unordered_map<std::string, bool> matched;
  for (int row = 0; row < r->rows(); ++row) matched.emplace(full_key(*r, row, 0), true);
  // Slots stay alive while the batch runs (batcher.hpp): their ids may be read again here.
  for (std::size_t i : members) {
    batch[i]->out = result<bool>(matched.count(full_key(batch[i]->item.id)) == 1);
  }
}

}  // namespace

struct PgStore::Batchers {
  std::shared_ptr<ClaimBatcher> claims;
  std::shared_ptr<CompleteBatcher> completions;
  std::shared_ptr<FencedBatcher> releases;
  std::shared_ptr<FencedBatcher> renewals;
};

namespace {

// A batch of claims takes along the completions queued at that moment, and a batch of
// completions the claims (run_cycle): both batchers are of the same home loop, so the
// other's queue is read on its own thread. What is taken is answered by this batch and
// settled by its own batcher (a slot left undecided gets that batcher's failure).
template <class Partner, class Slots>
asio::awaitable<void> run_with_partner(std::weak_ptr<PgStore::Core> core,
                                       std::shared_ptr<Partner> partner, std::size_t max_size,
                                       Slots& own) {
  auto taken = partner ? partner->take(max_size) : decltype(partner->take(0)){};
  try {
    if constexpr (std::is_same_v<Slots, std::vector<ClaimBatcher::SlotPtr>>) {
      co_await run_cycle(core.lock(), own, taken);
    } else {
      co_await run_cycle(core.lock(), taken, own);
    }
  } catch (...) {
    // As in a batch of the partner's own: what it left undecided fails below; this
    // batch's own slots fail in their batcher.
  }
  if (partner) partner->settle(taken);
}

}  // namespace

PgStore::PgStore(std::shared_ptr<pg::Pool> pool, ClaimRead claim_read, Batching batching)
    : core_(std::make_shared<Core>()), held_(std::make_shared<HeldClaims>()) {
  core_->pool = std::move(pool);
  core_->held = held_;
  core_->claim_read = claim_read;
  core_->lone_calls_batched = batching.lone_calls_batched;
  core_->on_batch = std::move(batching.on_batch);
  if (!batching.enabled || (batching.max_size < 2 && !batching.lone_calls_batched)) return;
  batchers_ = make_batchers(core_, batching.max_size);
}

PgStore::PgStore(std::shared_ptr<pg::Pool> pool, ClaimRead claim_read, const PgStore& home)
    : core_(std::make_shared<Core>()), held_(home.held_), batchers_(home.batchers_), remote_(true) {
  core_->pool = std::move(pool);
  core_->held = held_;
  core_->claim_read = claim_read;
  core_->lone_calls_batched = home.core_->lone_calls_batched;
}

// The batches run on the home store's loop with its pool. They hold its Core weakly: the
// batchers may outlive the home store (a remote store keeps them), and the home pool must
// not outlive its event loop; a batch that finds the home gone fails its calls (the
// batcher answers `failure` to every undecided slot).
std::shared_ptr<PgStore::Batchers> PgStore::make_batchers(const std::shared_ptr<Core>& core,
                                                          std::size_t max_size) {
  const auto home = core->pool->executor();
  const std::weak_ptr<Core> weak = core;
  // A batch that threw (it never should) fails its members as a store that broke the
  // protocol.
  const auto broken = make_error_code(errc::store_protocol);
  auto b = std::make_shared<Batchers>();
  // The batchers hold each other weakly through `b` (each takes the other's queue), and
  // the stores hold `b`.
  const std::weak_ptr<Batchers> both = b;
  // One write cycle at a time: a claim batch takes the queued completions along and a
  // completion batch the claims (run_with_partner), and the next cycle, whichever kind
  // starts it, waits for the running one (batcher.hpp, "lane").
  const auto writes = std::make_shared<detail::BatchLane>(1);
  b->claims = std::make_shared<ClaimBatcher>(
      home, ClaimBatcher::Options{max_size, 1, !core->lone_calls_batched},
      [weak, both, max_size](std::vector<ClaimBatcher::SlotPtr>& batch) {
        const auto b = both.lock();
        return run_with_partner(weak, b ? b->completions : nullptr, max_size, batch);
      },
      result<ClaimResult>(broken), writes);
  b->completions = std::make_shared<CompleteBatcher>(
      home, CompleteBatcher::Options{max_size, 1, !core->lone_calls_batched},
      [weak, both, max_size](std::vector<CompleteBatcher::SlotPtr>& batch) {
        const auto b = both.lock();
        return run_with_partner(weak, b ? b->claims : nullptr, max_size, batch);
      },
      result<Completed>(broken), writes);
  for (auto kind : {FencedWrite::release, FencedWrite::renew}) {
    auto batcher = std::make_shared<FencedBatcher>(
        home, FencedBatcher::Options{max_size, 1, !core->lone_calls_batched},
        [weak, kind](std::vector<FencedBatcher::SlotPtr>& batch) {
          return run_fenced_batch(weak.lock(), kind, batch);
        },
        result<bool>(boost::system::in_place_error, broken));
    (kind == FencedWrite::release ? b->releases : b->renewals) = std::move(batcher);
  }
  return b;
}

PgStore::BatchStats PgStore::batch_stats() const noexcept { return core_->stats; }

// A caller whose wait for its batch was cancelled gets what a call cancelled in flight
// gets (its claim may still be committed by the batch, as a cancelled call's may).
asio::awaitable<result<ClaimResult>> PgStore::claim(const ClaimRequest& req) {
  auto core = core_;
  if (batchers_ && !has_nul(req.id.tenant) && !has_nul(req.id.endpoint) &&
      !has_nul(req.id.key) && !has_nul(req.fingerprint) && !has_nul(req.principal)) {
    auto claims = batchers_->claims;
    // Named, not temporaries in the co_await expression: GCC 12 destroys such
    // temporaries twice.
    ClaimItem item{req};
    auto cancelled = failed<ClaimResult>(make_error_code(pg::errc::cancelled));
    auto out = co_await claims->submit(std::move(item), std::move(cancelled), remote_);
    if (out) {
      if (*out && (*out)->won) held_->hold((*out)->owner.fence, req.lease);
      co_return std::move(*out);
    }
  }
  auto out = co_await claim_one(std::move(core), req);
  if (out && out->won) held_->hold(out->owner.fence, req.lease);
  co_return out;
}

asio::awaitable<result<std::optional<Record>>> PgStore::read(const RecordId& id) {
  auto params = key_params(id, {});
  auto r = co_await core_->pool->execute(kRead, std::move(params));
  if (!r) co_return failed<std::optional<Record>>(r.error());
  if (r->rows() == 0) co_return std::optional<Record>{};
  auto rec = decode_record(*r);
  if (!rec) co_return rec.error();
  co_return std::optional<Record>{std::move(*rec)};
}

asio::awaitable<result<std::optional<Ownership>>> PgStore::take_over(
    const RecordId& id, std::int64_t seen_fence, Millis lease) {
  const std::string seen = std::to_string(seen_fence);
  const std::string lease_ms = millis(lease);
  auto params = key_params(id, {pg::Param::text(seen), pg::Param::text(lease_ms)});
  auto r = co_await core_->pool->execute(kTakeOver, std::move(params));
  if (!r) co_return failed<std::optional<Ownership>>(r.error());
  auto owner = returned_ownership(*r);
  if (owner && *owner) held_->hold((*owner)->fence, lease);
  co_return owner;
}

asio::awaitable<result<std::optional<Ownership>>> PgStore::replace_expired(
    const ClaimRequest& req, std::int64_t seen_fence) {
  const std::string lease = millis(req.lease);
  const std::string retention = millis(req.retention);
  const std::string seen = std::to_string(seen_fence);
  auto params = key_params(req.id, {pg::Param::text(req.fingerprint),
                                    pg::Param::text(req.principal), pg::Param::text(lease),
                                    pg::Param::text(retention), pg::Param::text(seen)});
  auto r = co_await core_->pool->execute(kReplaceExpired, std::move(params));
  if (!r) co_return failed<std::optional<Ownership>>(r.error());
  auto owner = returned_ownership(*r);
  if (owner && *owner) held_->hold((*owner)->fence, req.lease);
  co_return owner;
}

asio::awaitable<result<Completed>> PgStore::complete(const RecordId& id, std::int64_t fence,
                                                      const StoredResponse& response,
                                                      Millis retention) {
  auto out = co_await complete_held(id, fence, response, retention);
  // Recorded, recorded before, or fenced: this claim is no longer held. A failure leaves
  // it held until its lease runs out (the caller expires or retries it).
  if (out) held_->drop(fence);
  co_return out;
}

asio::awaitable<result<Completed>> PgStore::complete_held(const RecordId& id, std::int64_t fence,
                                                           const StoredResponse& response,
                                                           Millis retention) {
  auto pool = core_->pool;
  const bool small = response.body_omitted || response.body.size() <= kMaxBatchedBody;
  const bool batchable = batchers_ && small && !has_nul(id.tenant) && !has_nul(id.endpoint) &&
                         !has_nul(id.key) && !has_nul(response.resource_id);
  if (batchable) {
    auto completions = batchers_->completions;
    CompleteItem item{id, fence, response, retention};
    auto cancelled = failed<Completed>(make_error_code(pg::errc::cancelled));
    auto out = co_await completions->submit(std::move(item), std::move(cancelled), remote_);
    if (out) {
      // The batch wrote nothing for this member: ask, as the single completion does.
      if (*out && (*out)->outcome == Completion::fenced) {
        co_return co_await completed_already(std::move(pool), id, fence, response);
      }
      co_return std::move(*out);
    }
  }
  co_return co_await complete_one(core_, id, fence, response, retention);
}

// A release or renewal: through its batcher when batching is on (a caller whose wait was
// cancelled gets what a call cancelled in flight gets), else its single statement.
asio::awaitable<result<bool>> fenced_write(std::shared_ptr<PgStore::Core> core,
                                           std::shared_ptr<FencedBatcher> batcher, bool remote,
                                           FencedWrite kind, FencedItem item) {
  if (batcher && !has_nul(item.id.tenant) && !has_nul(item.id.endpoint) && !has_nul(item.id.key)) {
    FencedItem queued = item;
    auto cancelled = failed<bool>(make_error_code(pg::errc::cancelled));
    auto out = co_await batcher->submit(std::move(queued), std::move(cancelled), remote);
    if (out) co_return std::move(*out);
  }
  co_return co_await fenced_one(core->pool, kind, item);
}

// Batcher and item named before the co_await: GCC 12 miscompiles a conditional
// expression or a braced temporary inside one.
asio::awaitable<result<bool>> PgStore::release(const RecordId& id, std::int64_t fence) {
  std::shared_ptr<FencedBatcher> batcher;
  if (batchers_) batcher = batchers_->releases;
  FencedItem item{id, fence, Millis{0}};
  auto out = co_await fenced_write(core_, std::move(batcher), remote_, FencedWrite::release,
                                   std::move(item));
  if (out) held_->drop(fence);
  co_return out;
}

asio::awaitable<result<bool>> PgStore::renew(const RecordId& id, std::int64_t fence,
                                             Millis lease) {
  std::shared_ptr<FencedBatcher> batcher;
  if (batchers_) batcher = batchers_->renewals;
  FencedItem item{id, fence, lease};
  auto out = co_await fenced_write(core_, std::move(batcher), remote_, FencedWrite::renew,
                                   std::move(item));
  if (out && *out) held_->renewed(fence, lease);
  if (out && !*out) held_->drop(fence);  // fenced: another claim owns the record now
  co_return out;
}

asio::awaitable<result<bool>> PgStore::expire_lease(const RecordId& id, std::int64_t fence) {
  const std::string token = std::to_string(fence);
  auto params = key_params(id, {pg::Param::text(token)});
  auto r = co_await core_->pool->execute(kExpireLease, std::move(params));
  if (!r) co_return failed<bool>(r.error());
  held_->drop(fence);
  co_return r->affected_rows() == 1;
}

asio::awaitable<result<bool>> PgStore::purge(const RecordId& id) {
  auto params = key_params(id, {});
  auto r = co_await core_->pool->execute(kPurge, std::move(params));
  if (!r) co_return failed<bool>(r.error());
  co_return r->affected_rows() == 1;
}

asio::awaitable<result<PayloadSeen>> PgStore::note_payload(const PayloadNote& note) {
  const std::string window = millis(note.window);
  std::vector<pg::Param> params{pg::Param::text(note.tenant),       pg::Param::text(note.endpoint),
                                pg::Param::text(note.principal),    pg::Param::text(note.fingerprint),
                                pg::Param::text(note.operation_id), pg::Param::text(note.key_hash),
                                pg::Param::text(window),
                                pg::Param::text(note.keep_earlier ? "true" : "false")};
  auto r = co_await core_->pool->execute(kNotePayload, std::move(params));
  if (!r) co_return failed<PayloadSeen>(r.error());
  if (r->rows() != 1 || r->columns() != 4) co_return bad_row();
  const auto detected = r->boolean(0, 0);
  if (!detected) co_return bad_row();
  PayloadSeen seen;
  seen.detected = *detected;
  if (seen.detected) {
    const auto age = r->int64(0, 3);
    if (!age) co_return bad_row();
    seen.earlier_operation_id = std::string(r->value(0, 1));
    seen.earlier_key_hash = std::string(r->value(0, 2));
    seen.age = Millis{std::max<std::int64_t>(0, *age)};
  }
  co_return seen;
}

asio::awaitable<result<std::size_t>> PgStore::delete_expired(std::size_t batch) {
  if (batch == 0) co_return std::size_t{0};
  const std::string limit = std::to_string(batch);
  std::vector<pg::Param> params{pg::Param::text(limit)};
  auto r = co_await core_->pool->execute(kDeleteExpired, std::move(params));
  if (!r) co_return failed<std::size_t>(r.error());
  co_return static_cast<std::size_t>(r->affected_rows());
}

// The claims this process holds (HeldClaims): no statement, so a scrape costs the
// database nothing.
asio::awaitable<result<std::optional<Millis>>> PgStore::oldest_in_progress_age() {
  co_return held_->oldest();
}

asio::awaitable<result<bool>> PgStore::register_operation(const RecordId& id,
                                                         std::string_view operation_id) {
  auto params = key_params(id, {pg::Param::text(operation_id)});
  auto r = co_await core_->pool->execute(kRegisterOperation, std::move(params));
  if (!r) {
    // The record was deleted between the EXISTS and the insert's key check: nothing to
    // register, as if it had gone a moment earlier.
    if (pg::sqlstate(r.error()) == "23503") co_return false;
    co_return failed<bool>(r.error());
  }
  const auto exists = r->rows() == 1 ? r->boolean(0, 0) : std::nullopt;
  if (!exists) co_return result<bool>(boost::system::in_place_error, bad_row());
  co_return *exists;  // true: inserted, or registered already (ON CONFLICT)
}

asio::awaitable<result<std::optional<OperationRecord>>> PgStore::find_operation(
    std::string_view tenant, std::string_view operation_id) {
  std::vector<pg::Param> params{pg::Param::text(tenant), pg::Param::text(operation_id)};
  auto r = co_await core_->pool->execute(kFindOperation, std::move(params));
  if (!r) co_return failed<std::optional<OperationRecord>>(r.error());
  if (r->rows() == 0) co_return std::optional<OperationRecord>{};
  if (r->columns() != kReadColumns + 2) co_return bad_row();
  auto rec = decode_record(*r);
  if (!rec) co_return rec.error();
  OperationRecord found{RecordId{std::string(tenant), std::string(r->value(0, kReadColumns)),
                                 std::string(r->value(0, kReadColumns + 1))},
                        std::move(*rec)};
  co_return std::optional<OperationRecord>{std::move(found)};
}

}  // namespace idem::store
