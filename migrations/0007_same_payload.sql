-- A new key for the payload of a recent request (routes with same_payload_new_key,
-- docs/configuration.md): a client that makes a new idempotency key for every retry gets a
-- second operation, and this table is how the sidecar notices.
--
-- One row per (tenant, endpoint, principal, fingerprint): the operation id (a SHA-256 of
-- tenant, endpoint and key, never the key) and log hash of the latest key that carried the
-- payload, and when. A won claim on such a route upserts it in one statement, which also
-- returns what the row held before under the row's lock, so two concurrent new keys cannot
-- both miss each other. Only routes with the feature write here: the record table gets no
-- column and no index, and routes without it pay nothing. Rows live for the route's window
-- (expires_at) and go with the retention cleanup, by the index below.
--
-- Binaries at schema 6 never use this table, so they may keep serving a database that has
-- it (compatible-from 6). Written to run again harmlessly (IF NOT EXISTS); everything is
-- on a table this migration creates, so nothing waits on the record table.
-- idemproxy:compatible-from 6
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- idemproxy:step transaction
BEGIN;
CREATE TABLE IF NOT EXISTS idempotency_same_payload (
  tenant_id             text        NOT NULL,
  endpoint              text        NOT NULL,
  principal             text        NOT NULL,  -- the record's principal hash; '' when not checked
  fingerprint           text        NOT NULL,
  operation_id          text        NOT NULL,
  key_hash              text        NOT NULL,
  seen_at               timestamptz NOT NULL,
  expires_at            timestamptz NOT NULL,
  -- What the row held before its last upsert, while that was within its window: the
  -- earlier key a detection names. NULL after an insert, or when the earlier had expired.
  previous_operation_id text,
  previous_key_hash     text,
  previous_seen_at      timestamptz,
  PRIMARY KEY (tenant_id, endpoint, principal, fingerprint)
);

CREATE INDEX IF NOT EXISTS idempotency_same_payload_expires
  ON idempotency_same_payload (expires_at);
COMMIT;
