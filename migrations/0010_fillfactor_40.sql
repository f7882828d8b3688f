-- More room on each page for the completions of the claims on it (docs/performance.md,
-- "HOT completions at every concurrency").
--
-- 0008's fillfactor 50 left half of each new page for the completions of its claims, but
-- a write cycle completes the claims of the cycle before it, and those sit together on
-- the page that was being filled: the more claims a cycle carries, the more of one page's
-- rows grow in one transaction, whose old versions no prune can remove until it commits.
-- When the page runs out, the completion goes to another page (not HOT), usually the page
-- now being filled with claims, which then has less room for its own completions. Under
-- scripts/bench's new keys (2026-12-05, the same table and sidecar, 10 s per setting):
--
--   fillfactor | HOT at 32 connections | at 64  | at 128 | pages per 1 000 records
--   50         | 89.3 %, 91.7, 91.9    | 77, 79 | 75     | 52-76
--   40         | 98.0 %, 98.6, 98.2    | 94-95  | 92-93  | 72-87
--   35         | 100 %                 | 100 %  | 100 %  | 73-100
--
-- At 64 connections and more the table is no larger at 40 than at 50 (there the
-- non-HOT completions' new versions filled other pages); at 32 it is larger by up to a
-- sixth. It applies to pages filled from now on; nothing is rewritten.
--
-- A storage parameter changes nothing any binary reads or writes: replicas of 0.2.0
-- (schema 7) and of 0.3.0 at schema 8 or 9 keep serving.
-- idemproxy:compatible-from 7
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- SHARE UPDATE EXCLUSIVE, as in 0008: it conflicts with no claim, read or completion;
-- on a table partitioned by tenant the migrator sets it on each partition.
-- idemproxy:step storage idempotency_requests
SET lock_timeout = '5s';
-- One statement that runs again to the same end, in a transaction of its own.
-- squawk-ignore prefer-robust-stmts
ALTER TABLE idempotency_requests SET (fillfactor = 40);
