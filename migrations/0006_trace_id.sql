-- The W3C trace id of the request whose answer a record holds (docs/http.md, "Trace
-- context"): a replay names the original's trace (X-Idempotency-Trace-Id, the access log's
-- record_trace_id), so the first answer and every replay of it lead to one trace.
--
-- Written by the sidecar's completion; NULL for records completed before this migration
-- and for those a backend completes itself (completion: backend), which know no trace.
--
-- Online (docs/operations.md, "Upgrading"): the first text added the column with its CHECK
-- in one statement, which scanned the whole table under ACCESS EXCLUSIVE (1.3 s on 3
-- million rows). Now the column (a catalog change) and the CHECK (NOT VALID, no scan) are
-- added in a moment of the lock, and the CHECK is validated under SHARE UPDATE EXCLUSIVE,
-- which lets reads and writes go on. Replicas of schema 5 never name the column.
-- idemproxy:compatible-from 5
-- idemproxy:supersedes 07304e3d76f694e2ffb5a959f7e884c1e5a0adae25176cdd68572c4ff5fb1b27
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- idemproxy:step transaction
BEGIN;
ALTER TABLE idempotency_requests ADD COLUMN IF NOT EXISTS trace_id text;
-- Dropped first so that a run interrupted after this step can run it again.
ALTER TABLE idempotency_requests
  DROP CONSTRAINT IF EXISTS idempotency_requests_trace_id_format;
ALTER TABLE idempotency_requests
  ADD CONSTRAINT idempotency_requests_trace_id_format
  CHECK (trace_id ~ '^[0-9a-f]{32}$') NOT VALID;
COMMIT;

-- idemproxy:step transaction
BEGIN;
ALTER TABLE idempotency_requests VALIDATE CONSTRAINT idempotency_requests_trace_id_format;
COMMIT;
