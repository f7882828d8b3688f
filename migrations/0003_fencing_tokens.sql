-- Fencing tokens that never repeat for a key (docs/architecture.md, "Fencing").
--
-- attempt_token counts the attempts of one operation (1 on a claim, +1 per takeover) and
-- is what backends see as X-Idempotency-Attempt. It cannot fence on its own: a release
-- deletes the row, so the next claim of the key starts at 1 again, and a stale owner of
-- the earlier claim (paused past its lease, then resumed) would hold a matching token.
-- The same happens after a purge or retention cleanup.
--
-- fencing_token is drawn from one sequence by every claim, takeover and replacement, and
-- every owner write is conditioned on it. A sequence never hands out a value twice
-- (NO CYCLE; nextval is not rolled back), across deletes of the row, so no two claims of
-- a key, whatever happened in between, carry the same token. It survives what the row
-- does not: restarts, physical failover (sequence WAL is replicated ahead of the values
-- handed out) and pg_dump/restore (setval). Never reset it.
--
-- Online (docs/operations.md, "Upgrading"): the first text of this migration added the
-- column with DEFAULT nextval(...), which rewrote the whole table under ACCESS EXCLUSIVE
-- (27.7 s on 3 million rows, every claim waiting). Now the column is added empty, the
-- default covers new rows from then on, the existing rows are numbered in small committed
-- batches, and NOT NULL is proven by a CHECK validated without blocking writes. The end
-- state is the first text's, which databases migrated with it keep (supersedes below).
-- Replicas of the release before (schema 2) keep serving throughout: they never name
-- the column, and their inserts take the default.
-- idemproxy:compatible-from 2
-- idemproxy:supersedes e2f08006359e3f343b37c3e96a4e1b43ae39321b3d12b829f3fb23d7d1981120
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- idemproxy:step transaction
BEGIN;
CREATE SEQUENCE IF NOT EXISTS idempotency_fencing_tokens AS bigint NO CYCLE;
-- No default in ADD COLUMN: a volatile default would rewrite the table. Both ALTERs only
-- touch the catalog (a moment of ACCESS EXCLUSIVE, bounded by lock_timeout).
ALTER TABLE idempotency_requests ADD COLUMN IF NOT EXISTS fencing_token bigint;
ALTER TABLE idempotency_requests
  ALTER COLUMN fencing_token SET DEFAULT nextval('idempotency_fencing_tokens');
ALTER SEQUENCE idempotency_fencing_tokens OWNED BY idempotency_requests.fencing_token;
COMMIT;

-- The rows from before the default: numbered a range of pages at a time ($1, $2: the
-- first and the end ctid of the range), each batch its own transaction, so a row is
-- locked only for the moment its batch takes; the migrator rests between batches, so
-- the batches' WAL never crowds out the claims' commits.
-- The number is no part of what a replay answers: migration 0002's trigger need not
-- announce it, and a NOTIFY in every batch's commit would queue every claim's commit
-- behind the notification lock. Replica mode keeps this session's row triggers quiet
-- (it needs a superuser; without one the migrator goes on with them firing).
-- idemproxy:step backfill idempotency_requests 64
SET session_replication_role = replica;
UPDATE idempotency_requests
SET fencing_token = nextval('idempotency_fencing_tokens')
WHERE ctid >= $1::tid AND ctid < $2::tid AND fencing_token IS NULL;

-- NOT NULL without a scan under ACCESS EXCLUSIVE: a CHECK added NOT VALID (a moment of
-- the lock, no scan), validated under SHARE UPDATE EXCLUSIVE (reads and writes go on),
-- then SET NOT NULL, which PostgreSQL proves from the valid CHECK instead of scanning.
-- idemproxy:step transaction
BEGIN;
ALTER TABLE idempotency_requests
  DROP CONSTRAINT IF EXISTS idempotency_requests_fencing_token_not_null;
ALTER TABLE idempotency_requests
  ADD CONSTRAINT idempotency_requests_fencing_token_not_null
  CHECK (fencing_token IS NOT NULL) NOT VALID;
COMMIT;

-- idemproxy:step transaction
BEGIN;
ALTER TABLE idempotency_requests
  VALIDATE CONSTRAINT idempotency_requests_fencing_token_not_null;
COMMIT;

-- idemproxy:step transaction
BEGIN;
ALTER TABLE idempotency_requests ALTER COLUMN fencing_token SET NOT NULL;
ALTER TABLE idempotency_requests
  DROP CONSTRAINT IF EXISTS idempotency_requests_fencing_token_not_null;
COMMIT;
