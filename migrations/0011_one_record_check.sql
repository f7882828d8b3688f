-- The record's rules in one CHECK constraint, without a regular expression
-- (docs/performance.md, "One CHECK per record").
--
-- PostgreSQL prepares every CHECK constraint of a table anew for each statement that
-- writes it (it reads the expression's stored tree back from text, then simplifies and
-- compiles it), and evaluates each per row. The five of 0001 and 0006 took 11 % of
-- PostgreSQL's CPU under scripts/bench's new keys (a claim's INSERT and a completion's
-- UPDATE per key, each checking every constraint), and 15 % of its instructions per write
-- cycle: half of it the trace_id regular expression, run per row, most of the rest
-- reading the five trees back per statement. One constraint says the same: the state is
-- one of the two and the columns each state needs are set, the attempt is positive, and
-- trace_id, when set, is 32 lower-case hex digits: 32 bytes, and nothing but hex digits,
-- which PostgreSQL's regular expressions answer for less than 0006's ^[0-9a-f]{32}$
-- (its bounded repetition compiles to 32 copies of the character class; ltrim() of the
-- hex digits, the other way to say it, costs more still: it splits both strings into
-- characters first). The one costs 0.49 x the instructions of the five (0.92 x the whole
-- cycle's: integration/bench/cycle-instructions).
-- tests/store/test_record_check.cpp evaluates the five and the one side by side over
-- every combination that matters, and shows the table refusing each broken record.
--
-- Online (docs/operations.md, "Upgrading"): the new constraint is added NOT VALID and
-- the five dropped in one moment of ACCESS EXCLUSIVE (no scan: every row written from
-- then on is checked, by the new one), then validated under SHARE UPDATE EXCLUSIVE,
-- which lets claims and completions go on while it reads the table. Every existing row
-- passed the five, so it passes the one. No binary names a constraint: replicas of 0.2.0
-- (schema 7) and of 0.3.0 at schema 8 to 10 keep serving; their writes satisfy it. On a
-- table partitioned by tenant both statements recurse to every partition.
-- idemproxy:compatible-from 7
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- idemproxy:step transaction
BEGIN;
-- Dropped first so that a run interrupted after this step can run it again.
ALTER TABLE idempotency_requests
  DROP CONSTRAINT IF EXISTS idempotency_requests_record_check;
ALTER TABLE idempotency_requests
  ADD CONSTRAINT idempotency_requests_record_check CHECK (
    CASE state
      WHEN 'in_progress' THEN lease_expires_at IS NOT NULL
      WHEN 'completed' THEN response_status IS NOT NULL AND completed_at IS NOT NULL
      ELSE false
    END
    AND attempt_token > 0
    -- NULL for a record without a trace id: the constraint is then NULL or false, and a
    -- CHECK refuses only false, so no `trace_id IS NULL OR` is needed (it would only
    -- lengthen the tree read back per statement).
    AND octet_length(trace_id) = 32 AND trace_id ~ '^[0-9a-f]*$'
  ) NOT VALID;
ALTER TABLE idempotency_requests
  DROP CONSTRAINT IF EXISTS idempotency_requests_state_check,
  DROP CONSTRAINT IF EXISTS idempotency_requests_attempt_token_check,
  DROP CONSTRAINT IF EXISTS idempotency_requests_check,
  DROP CONSTRAINT IF EXISTS idempotency_requests_check1,
  DROP CONSTRAINT IF EXISTS idempotency_requests_trace_id_format;
COMMIT;

-- idemproxy:step transaction
BEGIN;
ALTER TABLE idempotency_requests VALIDATE CONSTRAINT idempotency_requests_record_check;
COMMIT;
