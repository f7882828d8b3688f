-- The idempotency record: one row per (tenant, endpoint, key). A committed in_progress row
-- with a lease and a fencing token is the claim; completion stores the replayed answer.
--
-- How a migration is written (docs/operations.md, "Writing a migration"): the header says
-- which binaries may serve the database once it is applied, the SETs before the first step
-- bound every wait (the migrator runs them again before each step, and retries a step
-- whose lock was not granted in time), and each step is one of the migrator's kinds.
-- idemproxy:compatible-from 1
-- idemproxy:supersedes 9c27510d48d2fae2bc3a257953957ef1c2e1fb8dc48b72880654d7ad3370e078
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- idemproxy:step transaction
BEGIN;
CREATE TABLE IF NOT EXISTS idempotency_requests (
  tenant_id           text        NOT NULL,
  endpoint            text        NOT NULL,
  idempotency_key     text        NOT NULL,
  request_fingerprint text        NOT NULL,
  -- Hash of the principal that created the record ('' when principals are not checked).
  principal           text        NOT NULL DEFAULT '',
  state               text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
  attempt_token       bigint      NOT NULL CHECK (attempt_token > 0),
  lease_expires_at    timestamptz,
  -- An HTTP status (100-599), never a counter: 32 bits are plenty.
  -- squawk-ignore prefer-bigint-over-int
  response_status     integer,
  response_headers    jsonb,
  response_body       bytea,
  -- true when the response body was larger than max_stored_body and was not kept.
  response_body_omitted boolean   NOT NULL DEFAULT false,
  resource_id         text,
  created_at          timestamptz NOT NULL,
  completed_at        timestamptz,
  expires_at          timestamptz NOT NULL,
  PRIMARY KEY (tenant_id, endpoint, idempotency_key),
  CHECK (state <> 'completed' OR (response_status IS NOT NULL AND completed_at IS NOT NULL)),
  CHECK (state <> 'in_progress' OR lease_expires_at IS NOT NULL)
);

-- Retention cleanup walks rows by expiry.
CREATE INDEX IF NOT EXISTS idempotency_requests_expires_at_idx
  ON idempotency_requests (expires_at);

-- Stuck work: the oldest in_progress rows (metrics, operators).
CREATE INDEX IF NOT EXISTS idempotency_requests_in_progress_idx
  ON idempotency_requests (created_at)
  WHERE state = 'in_progress';

-- Every request inserts and later updates or deletes a row: vacuum this table far more
-- eagerly than the global defaults so dead tuples do not pile up between cleanups.
ALTER TABLE idempotency_requests SET (
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_limit = 2000
);
COMMIT;
