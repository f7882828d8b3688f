-- For integration/bench/cycle-instructions: the record's CHECK constraints as they were
-- before migration 0011 (0001's four and 0006's trace_id format), to count what 0011 saves:
--   integration/bench/cycle-instructions before-0011=integration/bench/before-0011.sql
BEGIN;
ALTER TABLE idempotency_requests DROP CONSTRAINT IF EXISTS idempotency_requests_record_check;
ALTER TABLE idempotency_requests
  ADD CONSTRAINT idempotency_requests_state_check CHECK (state IN ('in_progress', 'completed')),
  ADD CONSTRAINT idempotency_requests_attempt_token_check CHECK (attempt_token > 0),
  ADD CONSTRAINT idempotency_requests_check
    CHECK (state <> 'completed' OR (response_status IS NOT NULL AND completed_at IS NOT NULL)),
  ADD CONSTRAINT idempotency_requests_check1 CHECK (state <> 'in_progress' OR lease_expires_at IS NOT NULL),
  ADD CONSTRAINT idempotency_requests_trace_id_format CHECK (trace_id ~ '^[0-9a-f]{32}$');
COMMIT;
