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
CREATE SEQUENCE idempotency_fencing_tokens AS bigint NO CYCLE;

-- The default gives every existing row a token of its own as the column is added (the
-- table is rewritten once) and covers inserts by replicas still running the previous
-- version during a rolling upgrade; this version always draws the token explicitly.
ALTER TABLE idempotency_requests
  ADD COLUMN fencing_token bigint NOT NULL DEFAULT nextval('idempotency_fencing_tokens');

ALTER SEQUENCE idempotency_fencing_tokens OWNED BY idempotency_requests.fencing_token;
