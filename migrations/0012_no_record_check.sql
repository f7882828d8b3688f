-- The record table without a CHECK constraint: the sidecar checks each record it reads
-- (docs/performance.md, "No CHECK on the record").
--
-- PostgreSQL 15 keeps no prepared form of a CHECK constraint between statements: every
-- INSERT and UPDATE of the table reads the constraint's tree back from its text, simplifies
-- and compiles it before its first row. For 0011's one constraint that is about 110 000
-- instructions per statement, a claim's and a completion's in every write cycle: a fifth
-- of a one-key cycle, the 8-connection case, and 7 % of an 8-key one
-- (integration/bench/cycle-instructions); as a PL/pgSQL function the constraint still
-- costs 0.6 x that, its calls per row added. Issue 26 named it among the costs of the
-- record's design.
--
-- Every writer of the table is the sidecar's own statements and 0004's completion
-- function, and each writes whole records by construction (the claim its lease and a
-- positive attempt, the completion its status and completion time, trace_id from the
-- sidecar's own 32 hex digits or NULL). What the constraint also guarded, a row written by
-- hand or by a damaged writer, the store now refuses when it reads it: a record with a
-- state it does not know, an in-progress record without a lease, a completed one without
-- its status or completion time, an attempt below 1 or a trace_id that is not 32 lower-
-- case hex digits is answered as a store error, never replayed and never taken over
-- (proxy/store/pg_store.cpp, decode_record; tests/store/test_record_check.cpp).
--
-- Online (docs/operations.md, "Upgrading"): one DROP CONSTRAINT, a moment of ACCESS
-- EXCLUSIVE under 100 ms of lock_timeout (the migrator tries again), nothing scanned or
-- rewritten. No binary names the constraint and every one writes whole records: replicas
-- of 0.2.0 (schema 7) and of 0.3.0 at schema 8 to 11 keep serving. On a table
-- partitioned by tenant the drop recurses to every partition.
-- idemproxy:compatible-from 7
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- idemproxy:step transaction
BEGIN;
ALTER TABLE idempotency_requests
  DROP CONSTRAINT IF EXISTS idempotency_requests_record_check;
COMMIT;
