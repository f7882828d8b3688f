-- Opt-in: hash-partition the record table by tenant (docs/scaling.md, "Hash partitioning
-- by tenant").
--
-- Not a migration: `idemproxy migrate` never runs it, and the default schema stays one
-- table. It rebuilds idempotency_requests, in one transaction, as a table partitioned by
-- HASH (tenant_id) with the same columns, constraints, defaults, indexes and triggers, the
-- rows copied over, the old table dropped, and idempotency_operations' foreign key (ON
-- DELETE CASCADE) pointed at the new table. Every request-path statement names the
-- whole primary key, tenant_id first, so each touches one partition; only retention
-- cleanup reads them all.
--
-- Run it once, on schema version 8 to 12 (it refuses any other: a later migration may
-- need it updated), with the sidecars stopped or expecting a pause: it holds an ACCESS EXCLUSIVE
-- lock on the table while it copies (roughly a second per few hundred thousand rows).
--
--   PGOPTIONS='-c idemproxy.partitions=16' psql "$DATABASE_URL" -v ON_ERROR_STOP=1 \
--     -f migrations/optional/partition_by_tenant.sql
--
-- idemproxy.partitions (default 16, from 2 to 1024) is the number of partitions; it cannot
-- be changed later without running a conversion like this one again. Grants on the old
-- table are not carried over: grant again what you had granted. Running it on a table
-- that is already partitioned changes nothing.
BEGIN;

DO $convert$
DECLARE
  partitions int := coalesce(nullif(current_setting('idemproxy.partitions', true), ''), '16')::int;
  version int;
  i int;
  operations_fk name;
BEGIN
  IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('idempotency_requests')) = 'p' THEN
    RAISE NOTICE 'idempotency_requests is partitioned already; nothing to do';
    RETURN;
  END IF;
  SELECT max(m.version) INTO version FROM idemproxy_schema_migrations m;
  -- 8, 9 once the contract migration 0009 dropped the in-progress index, 10 after 0010's
  -- fillfactor (with or without 0009: the index is carried over only where it exists), 11
  -- after 0011's one CHECK constraint, 12 once 0012 dropped it.
  IF version IS NULL OR version NOT IN (8, 9, 10, 11, 12) THEN
    RAISE EXCEPTION 'partition_by_tenant.sql knows schema versions 8 to 12, the database is at %', version
      USING HINT = 'run `idemproxy migrate` first, or use the version of this script that matches';
  END IF;
  IF partitions < 2 OR partitions > 1024 THEN
    RAISE EXCEPTION 'idemproxy.partitions must be from 2 to 1024, not %', partitions;
  END IF;

  -- Nobody reads or writes the tables until the transaction ends.
  LOCK TABLE idempotency_requests, idempotency_operations IN ACCESS EXCLUSIVE MODE;
  -- Migration 0005's operation ids reference the record (ON DELETE CASCADE): that key
  -- moves to the new table below, under the same name.
  SELECT c.conname INTO STRICT operations_fk FROM pg_constraint c
  WHERE c.conrelid = 'idempotency_operations'::regclass AND c.contype = 'f'
    AND c.confrelid = 'idempotency_requests'::regclass;
  EXECUTE format('ALTER TABLE idempotency_operations DROP CONSTRAINT %I', operations_fk);
  ALTER TABLE idempotency_requests RENAME TO idempotency_requests_unpartitioned;
  ALTER INDEX idempotency_requests_pkey RENAME TO idempotency_requests_unpartitioned_pkey;
  ALTER INDEX idempotency_requests_expires_at_idx
    RENAME TO idempotency_requests_unpartitioned_expires_at_idx;
  ALTER INDEX IF EXISTS idempotency_requests_in_progress_idx
    RENAME TO idempotency_requests_unpartitioned_in_progress_idx;

  -- Columns (in order), NOT NULLs, defaults (the fencing token's nextval among them) and
  -- CHECK constraints, as migrations 0001, 0003 and 0006 made them (0011: the one that
  -- replaces 0001's and 0006's; 0012: none).
  CREATE TABLE idempotency_requests
    (LIKE idempotency_requests_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY HASH (tenant_id);
  ALTER TABLE idempotency_requests
    ADD CONSTRAINT idempotency_requests_pkey PRIMARY KEY (tenant_id, endpoint, idempotency_key);
  CREATE INDEX idempotency_requests_expires_at_idx ON idempotency_requests (expires_at);
  -- Until 0009 is applied (replicas of schema 7 may still read it).
  IF to_regclass('idempotency_requests_unpartitioned_in_progress_idx') IS NOT NULL THEN
    CREATE INDEX idempotency_requests_in_progress_idx ON idempotency_requests (created_at)
      WHERE state = 'in_progress';
  END IF;
  -- The sequence goes with the table that now draws from it; dropping the old table
  -- would otherwise drop it too.
  ALTER SEQUENCE idempotency_fencing_tokens OWNED BY idempotency_requests.fencing_token;

  -- Storage parameters live on the partitions (a partitioned table has no storage):
  -- migration 0001's eager autovacuum and 0010's room for HOT completions, per partition.
  FOR i IN 0 .. partitions - 1 LOOP
    EXECUTE format(
      'CREATE TABLE %I PARTITION OF idempotency_requests FOR VALUES WITH (MODULUS %s, REMAINDER %s)'
      ' WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,'
      ' autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_limit = 2000,'
      ' fillfactor = 40)',
      'idempotency_requests_p' || i, partitions, i);
  END LOOP;

  INSERT INTO idempotency_requests SELECT * FROM idempotency_requests_unpartitioned;
  DROP TABLE idempotency_requests_unpartitioned;  -- its triggers with it
  EXECUTE format(
    'ALTER TABLE idempotency_operations ADD CONSTRAINT %I FOREIGN KEY'
    ' (tenant_id, endpoint, idempotency_key) REFERENCES idempotency_requests'
    ' (tenant_id, endpoint, idempotency_key) ON DELETE CASCADE', operations_fk);

  -- Migration 0002's triggers. A row trigger on the partitioned table is cloned onto
  -- every partition; a TRUNCATE of one partition fires only that partition's statement
  -- triggers, so each partition announces its own truncation as well.
  CREATE TRIGGER idempotency_requests_announce_change
    AFTER UPDATE OR DELETE ON idempotency_requests
    FOR EACH ROW
    WHEN (OLD.state = 'completed' AND OLD.expires_at > now())
    EXECUTE FUNCTION idemproxy_announce_record_change();
  CREATE TRIGGER idempotency_requests_announce_truncate
    AFTER TRUNCATE ON idempotency_requests
    FOR EACH STATEMENT
    EXECUTE FUNCTION idemproxy_announce_truncate();
  FOR i IN 0 .. partitions - 1 LOOP
    EXECUTE format(
      'CREATE TRIGGER idempotency_requests_announce_truncate AFTER TRUNCATE ON %I'
      ' FOR EACH STATEMENT EXECUTE FUNCTION idemproxy_announce_truncate()',
      'idempotency_requests_p' || i);
  END LOOP;

  EXECUTE format('COMMENT ON TABLE idempotency_requests IS %L',
                 'idemproxy records, hash-partitioned by tenant_id into ' || partitions ||
                 ' partitions (migrations/optional/partition_by_tenant.sql)');
  ANALYZE idempotency_requests;
END
$convert$;

COMMIT;
