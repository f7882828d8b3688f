-- The lean record (docs/architecture.md, "The record"; docs/performance.md, "The lean
-- record"): a completion changes no indexed column, so PostgreSQL writes it as a HOT
-- update (in the row's own page, no new index entries, a fifth less WAL per key).
--
-- Two things made every completion a non-HOT update: it moved expires_at (indexed, for
-- retention) and it changed state (the predicate of the partial in-progress index).
-- From this release on, a claim fixes expires_at at retention plus one lease, and a
-- completion keeps it whenever that still leaves `retention` after the completion (any
-- completion within the first lease), so expires_at does not change; the stuck-work gauge
-- reads the claims each replica holds instead of the index. The index itself goes in
-- 0009, a contract migration, once no replica of 0.2.0 (which reads it) is left.
--
-- A completion also grows the row (the answer's status, headers and body): a HOT update
-- needs that room in the row's own page, and a page filled to the brim by claims has none.
-- fillfactor 50 keeps half of each new page for the completions of the claims on it.
-- tests/store/test_hot_updates.cpp measured, for batches of 8 claims then their 8
-- completions with a 320-byte body, 69 % of completions HOT at fillfactor 100, 88 % at 85,
-- 98 % at 75; but the more claims are in flight at once, the more of them share the page
-- being filled: scripts/bench's new keys were 81 % HOT at 32 connections and 55 % at 64
-- with fillfactor 75, 92 % and 89 % with 50, for a table about a quarter larger per
-- record (docs/performance.md, "The lean record"). It applies to pages filled from now
-- on; nothing is rewritten.
--
-- Here: the backend's own completion (migration 0004) keeps expires_at the same way.
-- Replicas of 0.2.0 (schema 7) keep serving: their statements set expires_at at
-- completion as before (their rows are simply not HOT), and their backends' calls to this
-- function keep a record at least as long as before.
-- idemproxy:compatible-from 7
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- idemproxy:step transaction
BEGIN;
-- As in 0004, but for expires_at: kept when it already lies `retention` or more ahead.
CREATE OR REPLACE FUNCTION idemproxy_complete(p_tenant text, p_record text, p_status integer,
                                   p_headers jsonb, p_body bytea, p_resource_id text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
  ref record := idemproxy_parse_record(p_record);
BEGIN
  IF p_status IS NULL OR p_status < 100 OR p_status > 599 THEN
    RAISE EXCEPTION 'idemproxy: the status must be an HTTP status (100-599)'
      USING ERRCODE = '22023';
  END IF;
  IF p_headers IS NOT NULL AND jsonb_typeof(p_headers) <> 'array' THEN
    RAISE EXCEPTION 'idemproxy: the headers must be a jsonb array of [name, value] pairs'
      USING ERRCODE = '22023';
  END IF;
  UPDATE idempotency_requests r
  SET state = 'completed',
      response_status = p_status,
      response_headers = coalesce(p_headers, '[]'::jsonb),
      response_body = coalesce(p_body, '\x'::bytea),
      response_body_omitted = false,
      resource_id = NULLIF(p_resource_id, ''),
      completed_at = now(),
      expires_at = GREATEST(r.expires_at, now() + ref.retention_ms * interval '1 millisecond'),
      lease_expires_at = NULL
  WHERE r.tenant_id = p_tenant AND r.endpoint = ref.endpoint
    AND r.idempotency_key = ref.idempotency_key
    AND r.fencing_token = ref.fencing_token AND r.state = 'in_progress';
  IF NOT FOUND THEN
    RAISE EXCEPTION 'idemproxy: this attempt no longer owns the idempotency record'
      USING ERRCODE = 'IP001',
            HINT = 'a newer attempt of the operation owns it; roll back';
  END IF;
  RETURN idemproxy_answer_digest(p_status, NULLIF(p_resource_id, ''), coalesce(p_body, '\x'::bytea));
END
$$;
COMMIT;

-- SHARE UPDATE EXCLUSIVE: it conflicts with no claim, read or completion (only with
-- VACUUM, ANALYZE and other DDL), so waiting for it blocks no request; the longer
-- lock_timeout lets a running autovacuum of the table be cancelled in its favour (after
-- deadlock_timeout) instead of retrying behind it. On a table partitioned by tenant
-- (migrations/optional/partition_by_tenant.sql) the migrator sets it on each partition.
-- idemproxy:step storage idempotency_requests
SET lock_timeout = '5s';
-- Setting a storage parameter is one statement that runs again to the same end: the
-- migrator runs it in a transaction of its own (on each partition, where partitioned).
-- squawk-ignore prefer-robust-stmts
ALTER TABLE idempotency_requests SET (fillfactor = 50);
