-- Contract step of the lean record (0008): drops the partial index of in-progress rows.
-- Its predicate (state = 'in_progress') names a column every completion changes, which
-- alone keeps every completion from being a HOT update. Binaries from schema 8 never read
-- it (the stuck-work gauge counts the claims each replica holds); 0.2.0 (schema 7) reads
-- it on every metrics scrape and would scan the whole table without it.
--
-- So it is a contract migration: `idemproxy migrate` holds it back, and `idemproxy migrate
-- --contract` applies it only while no session of a replica before schema 8 is connected
-- (docs/operations.md, "Upgrading"). Once recorded, replicas of schema 7 are incompatible
-- (compatible-from 8) and turn unready.
-- idemproxy:compatible-from 8
-- idemproxy:contract
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- Concurrently: waits for the transactions using the index, blocks no claim meanwhile.
-- idemproxy:step drop-index idempotency_requests_in_progress_idx
SET lock_timeout = '10min';
DROP INDEX CONCURRENTLY IF EXISTS idempotency_requests_in_progress_idx;
