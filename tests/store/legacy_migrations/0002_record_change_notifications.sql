-- Replicas keep recently replayed records in memory (the replay cache, see
-- docs/architecture.md). A completed record only changes again when it is deleted (purge,
-- an operator's DELETE) or after its retention passed (replacement, cleanup). The first
-- must reach every replica at once, so any change to a completed, unexpired row, whoever
-- makes it, announces the record's operation id on the channel idemproxy_records. Rows
-- past their expiry stay silent: no replica serves them from memory anyway, which keeps
-- retention cleanup free of notifications.

-- The operation id exactly as the sidecar computes it (idempotency/fingerprint.cpp):
-- SHA-256 over length-prefixed items, so a notification names the record without carrying
-- its raw key.
CREATE FUNCTION idemproxy_operation_id(tenant text, endpoint text, key text)
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

CREATE FUNCTION idemproxy_announce_record_change() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
  PERFORM pg_notify('idemproxy_records',
                    idemproxy_operation_id(OLD.tenant_id, OLD.endpoint, OLD.idempotency_key));
  RETURN NULL;
END
$$;

CREATE TRIGGER idempotency_requests_announce_change
  AFTER UPDATE OR DELETE ON idempotency_requests
  FOR EACH ROW
  WHEN (OLD.state = 'completed' AND OLD.expires_at > now())
  EXECUTE FUNCTION idemproxy_announce_record_change();

-- TRUNCATE fires no row triggers: it announces '*', everything.
CREATE FUNCTION idemproxy_announce_truncate() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
  PERFORM pg_notify('idemproxy_records', '*');
  RETURN NULL;
END
$$;

CREATE TRIGGER idempotency_requests_announce_truncate
  AFTER TRUNCATE ON idempotency_requests
  FOR EACH STATEMENT
  EXECUTE FUNCTION idemproxy_announce_truncate();
