-- A test migration of scripts/upgrade-check only (built in with IDEM_EXTRA_MIGRATIONS,
-- never part of a release): an expand step as a real release would ship one, a column and
-- an index added to the filled record table. Binaries of this checkout's schema never name
-- either, so they keep serving: they are fenced by the same fencing_token as before.
-- Numbered far above any release's migrations; compatible-from is this checkout's newest
-- migration (tests/store/test_migration_script.cpp fails when a new one is added and this
-- line is not moved with it).
-- idemproxy:compatible-from 12
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- idemproxy:step transaction
BEGIN;
ALTER TABLE idempotency_requests ADD COLUMN IF NOT EXISTS upgrade_check_note text;
COMMIT;

-- The index waits for older transactions (lock waits too), under a lock that no claim
-- conflicts with: a long lock_timeout here makes no claim wait.
-- idemproxy:step index idempotency_requests_upgrade_check_idx
SET lock_timeout = '10min';
SET statement_timeout = '1h';
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_requests_upgrade_check_idx
  ON idempotency_requests (created_at, upgrade_check_note);
