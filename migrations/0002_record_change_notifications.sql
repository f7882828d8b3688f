-- Replicas keep recently replayed records in memory (the replay cache, see
-- docs/architecture.md). A completed record only changes again when it is deleted (purge,
-- an operator's DELETE) or after its retention passed (replacement, cleanup). The first
-- must reach every replica at once, so any change to a completed, unexpired row, whoever
-- makes it, announces the record's operation id on the channel idemproxy_records. Rows
-- past their expiry stay silent: no replica serves them from memory anyway, which keeps
-- retention cleanup free of notifications.

-- idemproxy:compatible-from 1
-- idemproxy:supersedes ee83fa9a87674ea17688c62d59a5886b9425dca7989eb563c9e3099e0018d13d
SET lock_timeout = '100ms';
SET statement_timeout = '10min';

-- idemproxy:step transaction
BEGIN;
-- The operation id exactly as the sidecar computes it (idempotency/fingerprint.cpp):
-- SHA-256 over length-prefixed items, so a notification names the record without carrying
-- its raw key.
CREATE OR REPLACE FUNCTION idemproxy_operation_id(tenant text, endpoint text, key text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT encode(sha256(convert_to(
           '24:idemproxy-operation-id/1' || E'\n' ||
           octet_length(tenant)::text || ':' || tenant || E'\n' ||
           octet_length(endpoint)::text || ':' || endpoint || E'\n' ||
           octet_length(key)::text || ':' || key || E'\n',
           current_setting('server_encoding'))), 'hex')
$$;

CREATE OR REPLACE FUNCTION idemproxy_announce_record_change() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
  PERFORM pg_notify('idemproxy_records',
                    idemproxy_operation_id(OLD.tenant_id, OLD.endpoint, OLD.idempotency_key));
  RETURN NULL;
END
$$;

-- A trigger takes SHARE ROW EXCLUSIVE on the table for a moment (writes wait, reads do
-- not): bounded by lock_timeout above, retried by the migrator.
CREATE OR REPLACE TRIGGER idempotency_requests_announce_change
  AFTER UPDATE OR DELETE ON idempotency_requests
  FOR EACH ROW
  WHEN (OLD.state = 'completed' AND OLD.expires_at > now())
  EXECUTE FUNCTION idemproxy_announce_record_change();

-- TRUNCATE fires no row triggers: it announces '*', everything.
CREATE OR REPLACE FUNCTION idemproxy_announce_truncate() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
  PERFORM pg_notify('idemproxy_records', '*');
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER idempotency_requests_announce_truncate
  AFTER TRUNCATE ON idempotency_requests
  FOR EACH STATEMENT
  EXECUTE FUNCTION idemproxy_announce_truncate();
COMMIT;
