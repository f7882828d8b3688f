-- A test migration of scripts/upgrade-check only (built in with IDEM_EXTRA_MIGRATIONS,
-- never part of a release): it stands for a contract step that removes what this
-- checkout's binaries still use, so it declares that only binaries of its own schema may
-- serve. The replicas of this checkout must turn unready with a reason of their own
-- (schema_incompatible).
-- What it changes is harmless: a comment.
-- idemproxy:compatible-from 9001
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- idemproxy:step transaction
BEGIN;
COMMENT ON COLUMN idempotency_requests.trace_id IS 'upgrade-check: a contract migration stands here';
COMMIT;
