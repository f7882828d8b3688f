#include "store/pg_store.hpp"

#include <initializer_list>
#include <string>
#include <utility>

#include "store/header_codec.hpp"

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
constexpr const char* kOldestInProgress = "idem_oldest_in_progress";
constexpr const char* kRegisterOperation = "idem_register_operation";
constexpr const char* kFindOperation = "idem_find_operation";

// The claim is the whole race: the primary key decides, the loser gets no row back and
// reads the winner's committed row in a new statement (a new READ COMMITTED snapshot).
// Every claim draws a fencing token, the loser's is simply never used: a sequence value is
// never handed out twice, which is the whole point (migration 0003).
constexpr const char* kClaimSql = R"sql(
INSERT INTO idempotency_requests
  (tenant_id, endpoint, idempotency_key, request_fingerprint, principal, state,
   attempt_token, lease_expires_at, created_at, expires_at, fencing_token)
VALUES ($1, $2, $3, $4, $5, 'in_progress', 1,
        now() + $6::bigint * interval '1 millisecond', now(),
        GREATEST(now() + $7::bigint * interval '1 millisecond',
                 now() + $6::bigint * interval '1 millisecond'),
        nextval('idempotency_fencing_tokens'))
ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
RETURNING attempt_token, fencing_token,
          (extract(epoch FROM created_at) * 1000000)::bigint,
          (extract(epoch FROM expires_at) * 1000000)::bigint)sql";

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
    expires_at = GREATEST(now() + $7::bigint * interval '1 millisecond',
                          now() + $6::bigint * interval '1 millisecond')
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
    expires_at = now() + $10::bigint * interval '1 millisecond',
    lease_expires_at = NULL,
    trace_id = NULLIF($11, '')
WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
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

// Batched, lock-skipping retention that every replica may run at once. The ctids are
// collected into an array first: "ctid = ANY(ARRAY(...))" runs the sub-select once as an
// InitPlan and always deletes by TID scan, whereas "ctid IN (SELECT ...)" leaves the join
// strategy to the planner (a hash join would scan the whole table). The sub-select walks
// the expires_at index. A ctid names a row only within one table: on a table partitioned
// by tenant (migrations/optional/partition_by_tenant.sql) the same ctid is a row in each
// partition, so the pair (tableoid, ctid) picks the locked rows out of the TID scans;
// without it a batch deletes up to one row per partition for each row it locked. The
// outer predicate is re-checked because it costs nothing and keeps the DELETE correct on
// its own.
constexpr const char* kDeleteExpiredSql = R"sql(
WITH doomed AS MATERIALIZED (
  SELECT tableoid AS rel, ctid AS tid FROM idempotency_requests
  WHERE expires_at <= now()
    AND (state = 'completed' OR lease_expires_at <= now())
  LIMIT $1::bigint
  FOR UPDATE SKIP LOCKED)
DELETE FROM idempotency_requests
WHERE ctid = ANY(ARRAY(SELECT tid FROM doomed))
  AND (tableoid, ctid) IN (SELECT rel, tid FROM doomed)
  AND expires_at <= now()
  AND (state = 'completed' OR lease_expires_at <= now()))sql";

// Matches the partial index on (created_at) WHERE state = 'in_progress'.
constexpr const char* kOldestInProgressSql = R"sql(
SELECT ceil(extract(epoch FROM now() - min(created_at)) * 1000)::bigint
FROM idempotency_requests
WHERE state = 'in_progress')sql";

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

// Reads the columns of IDEM_RECORD_COLUMNS, which come first (a lookup may add its own after).
result<Record> decode_record(const pg::Result& r) {
  if (r.columns() < kReadColumns) return bad_row();
  Record rec;
  rec.fingerprint = std::string(r.value(0, kColFingerprint));
  rec.principal = std::string(r.value(0, kColPrincipal));
  const std::string_view state = r.value(0, kColState);
  if (state == "in_progress") {
    rec.state = State::in_progress;
  } else if (state == "completed") {
    rec.state = State::completed;
  } else {
    return bad_row();
  }
  const auto attempt = r.int64(0, kColAttempt);
  const auto fence = r.int64(0, kColFence);
  const auto lease_expired = r.boolean(0, kColLeaseExpired);
  const auto expired = r.boolean(0, kColExpired);
  const auto lease_remaining = r.int64(0, kColLeaseRemaining);
  const auto created = r.int64(0, kColCreatedAt);
  const auto expires = r.int64(0, kColExpiresAt);
  const auto retention_remaining = r.int64(0, kColRetentionRemaining);
  if (!attempt || !fence || !expired || !lease_remaining || !created || !expires ||
      !retention_remaining) {
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
  rec.completed_at_us = r.int64(0, kColCompletedAt).value_or(0);
  rec.lease_expires_at_us = r.int64(0, kColLeaseExpiresAt).value_or(0);

  if (rec.state == State::completed) {
    StoredResponse resp;
    const auto status = r.int64(0, kColStatus);
    const auto omitted = r.boolean(0, kColBodyOmitted);
    if (!status || !omitted) return bad_row();
    resp.status = static_cast<int>(*status);
    resp.body_omitted = *omitted;
    if (!r.is_null(0, kColHeaders)) {
      auto headers = detail::decode_headers_json(r.value(0, kColHeaders));
      if (!headers) return bad_row();
      resp.headers = std::move(*headers);
    }
    if (!r.is_null(0, kColBody)) {
      auto body = r.bytea(0, kColBody);
      if (!body) return bad_row();
      resp.body = std::move(*body);
    }
    resp.resource_id = std::string(r.value(0, kColResourceId));
    resp.trace_id = std::string(r.value(0, kColTraceId));
    rec.response = std::move(resp);
  }
  return rec;
}

// RETURNING attempt_token, fencing_token, created_at, expires_at: one row = the write
// happened.
result<std::optional<Ownership>> returned_ownership(const pg::Result& r) {
  if (r.rows() == 0) return std::optional<Ownership>{};
  const auto attempt = r.int64(0, 0);
  const auto fence = r.int64(0, 1);
  const auto created = r.int64(0, 2);
  const auto expires = r.int64(0, 3);
  if (r.columns() != 4 || !attempt || !fence || !created || !expires) return bad_row();
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
      {kOldestInProgress, kOldestInProgressSql},
      {kRegisterOperation, kRegisterOperationSql},
      {kFindOperation, kFindOperationSql},
  };
  return statements;
}

PgStore::PgStore(std::shared_ptr<pg::Pool> pool, ClaimRead claim_read)
    : pool_(std::move(pool)), claim_read_(claim_read) {}

// Reading along costs every winner a statement it discards (measured at roughly a tenth
// more database CPU per new key) and saves every loser a round trip (roughly a third of a
// duplicate's cost), so it pays once about one claim in eight is lost.
bool PgStore::read_with_claim() const noexcept {
  switch (claim_read_) {
    case ClaimRead::always: return true;
    case ClaimRead::never: return false;
    case ClaimRead::adaptive: break;
  }
  return *lost_share_ >= 1.0 / 8;
}

namespace {

// The statements take the key as $1..$3; `extra` follows from $4. Parameters view their
// strings, which live in the calling coroutine's frame until the call completes.
std::vector<pg::Param> key_params(const RecordId& id, std::initializer_list<pg::Param> extra) {
  std::vector<pg::Param> params{pg::Param::text(id.tenant), pg::Param::text(id.endpoint),
                                pg::Param::text(id.key)};
  params.insert(params.end(), extra.begin(), extra.end());
  return params;
}

}  // namespace

// Note: parameter vectors are built in named variables before co_await; GCC 12 rejects
// an initializer_list temporary inside a co_await expression.

asio::awaitable<result<ClaimResult>> PgStore::claim(const ClaimRequest& req) {
  const std::string lease = millis(req.lease);
  const std::string retention = millis(req.retention);
  auto params = key_params(req.id, {pg::Param::text(req.fingerprint),
                                    pg::Param::text(req.principal), pg::Param::text(lease),
                                    pg::Param::text(retention)});
  // Share of lost claims, weighted over roughly the last 32 (read by read_with_claim).
  const auto count_claim = [share = lost_share_](bool lost) {
    *share += ((lost ? 1.0 : 0.0) - *share) / 32;
  };

  if (!read_with_claim()) {
    auto r = co_await pool_->execute(kClaim, std::move(params));
    if (!r) co_return failed<ClaimResult>(r.error());
    auto owner = returned_ownership(*r);
    if (!owner) co_return owner.error();
    count_claim(!*owner);
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
  auto r = co_await pool_->execute_pipeline(std::move(statements));
  if (!r) co_return failed<ClaimResult>(r.error());
  auto owner = returned_ownership((*r)[0]);
  if (!owner) co_return owner.error();
  count_claim(!*owner);
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

asio::awaitable<result<std::optional<Record>>> PgStore::read(const RecordId& id) {
  auto params = key_params(id, {});
  auto r = co_await pool_->execute(kRead, std::move(params));
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
  auto r = co_await pool_->execute(kTakeOver, std::move(params));
  if (!r) co_return failed<std::optional<Ownership>>(r.error());
  co_return returned_ownership(*r);
}

asio::awaitable<result<std::optional<Ownership>>> PgStore::replace_expired(
    const ClaimRequest& req, std::int64_t seen_fence) {
  const std::string lease = millis(req.lease);
  const std::string retention = millis(req.retention);
  const std::string seen = std::to_string(seen_fence);
  auto params = key_params(req.id, {pg::Param::text(req.fingerprint),
                                    pg::Param::text(req.principal), pg::Param::text(lease),
                                    pg::Param::text(retention), pg::Param::text(seen)});
  auto r = co_await pool_->execute(kReplaceExpired, std::move(params));
  if (!r) co_return failed<std::optional<Ownership>>(r.error());
  co_return returned_ownership(*r);
}

asio::awaitable<result<Completed>> PgStore::complete(const RecordId& id, std::int64_t fence,
                                                      const StoredResponse& response,
                                                      Millis retention) {
  const std::string token = std::to_string(fence);
  const std::string status = std::to_string(response.status);
  const std::string headers = detail::encode_headers_json(response.headers);
  const std::string retention_ms = millis(retention);
  // An omitted body is stored as NULL: "no body kept" rather than "an empty body".
  const pg::Param body =
      response.body_omitted ? pg::Param::null_value() : pg::Param::bytes(response.body);
  const std::vector<pg::Param> answer{
      pg::Param::text(token), pg::Param::text(status), pg::Param::text(headers), body,
      pg::Param::text(response.body_omitted ? "true" : "false"),
      pg::Param::text(response.resource_id)};
  auto params = key_params(id, {});
  params.insert(params.end(), answer.begin(), answer.end());
  auto check_params = params;  // the same, without the retention
  params.push_back(pg::Param::text(retention_ms));
  params.push_back(pg::Param::text(response.trace_id));
  auto r = co_await pool_->execute(kComplete, std::move(params));
  if (!r) co_return failed<Completed>(r.error());
  const auto expiry = [](const pg::Result& rows) -> result<Completed> {
    const auto us = rows.int64(0, 0);
    if (!us) return bad_row();
    return Completed{Completion::recorded, *us};
  };
  if (r->rows() == 1) co_return expiry(*r);
  auto already = co_await pool_->execute(kCompletedAlready, std::move(check_params));
  if (!already) co_return failed<Completed>(already.error());
  if (already->rows() != 1) co_return Completed{Completion::fenced, 0};
  auto done = expiry(*already);
  if (done) done->outcome = Completion::already_recorded;
  co_return done;
}

asio::awaitable<result<bool>> PgStore::release(const RecordId& id, std::int64_t fence) {
  const std::string token = std::to_string(fence);
  auto params = key_params(id, {pg::Param::text(token)});
  auto r = co_await pool_->execute(kRelease, std::move(params));
  if (!r) co_return failed<bool>(r.error());
  co_return r->affected_rows() == 1;
}

asio::awaitable<result<bool>> PgStore::renew(const RecordId& id, std::int64_t fence,
                                             Millis lease) {
  const std::string token = std::to_string(fence);
  const std::string lease_ms = millis(lease);
  auto params = key_params(id, {pg::Param::text(token), pg::Param::text(lease_ms)});
  auto r = co_await pool_->execute(kRenew, std::move(params));
  if (!r) co_return failed<bool>(r.error());
  co_return r->affected_rows() == 1;
}

asio::awaitable<result<bool>> PgStore::expire_lease(const RecordId& id, std::int64_t fence) {
  const std::string token = std::to_string(fence);
  auto params = key_params(id, {pg::Param::text(token)});
  auto r = co_await pool_->execute(kExpireLease, std::move(params));
  if (!r) co_return failed<bool>(r.error());
  co_return r->affected_rows() == 1;
}

asio::awaitable<result<bool>> PgStore::purge(const RecordId& id) {
  auto params = key_params(id, {});
  auto r = co_await pool_->execute(kPurge, std::move(params));
  if (!r) co_return failed<bool>(r.error());
  co_return r->affected_rows() == 1;
}

asio::awaitable<result<std::size_t>> PgStore::delete_expired(std::size_t batch) {
  if (batch == 0) co_return std::size_t{0};
  const std::string limit = std::to_string(batch);
  std::vector<pg::Param> params{pg::Param::text(limit)};
  auto r = co_await pool_->execute(kDeleteExpired, std::move(params));
  if (!r) co_return failed<std::size_t>(r.error());
  co_return static_cast<std::size_t>(r->affected_rows());
}

asio::awaitable<result<std::optional<Millis>>> PgStore::oldest_in_progress_age() {
  auto r = co_await pool_->execute(kOldestInProgress, std::vector<pg::Param>{});
  if (!r) co_return failed<std::optional<Millis>>(r.error());
  if (r->rows() != 1) co_return bad_row();
  if (r->is_null(0, 0)) co_return std::optional<Millis>{};
  const auto ms = r->int64(0, 0);
  if (!ms) co_return bad_row();
  co_return std::optional<Millis>{Millis{*ms}};
}

asio::awaitable<result<bool>> PgStore::register_operation(const RecordId& id,
                                                         std::string_view operation_id) {
  auto params = key_params(id, {pg::Param::text(operation_id)});
  auto r = co_await pool_->execute(kRegisterOperation, std::move(params));
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
  auto r = co_await pool_->execute(kFindOperation, std::move(params));
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
