-- Completion in the backend's own transaction (docs/backend.md): the order, its outbox
-- event and the idempotency result commit together, and a stale attempt's business writes
-- roll back with its record write.
--
-- The sidecar forwards, on routes with `completion: backend`, a record reference
-- (X-Idempotency-Record) naming the record and the claim that forwarded the request:
--   v1.<fencing token>.<retention in ms>.<hex of the scope>.<hex of the key>
-- The tenant is not in it: the backend passes the tenant it serves (X-Tenant-Id) itself,
-- and a reference only ever reaches a record of that tenant, so a reference copied from
-- another tenant's request completes nothing.
--
-- Both functions raise SQLSTATE IP001 (idempotency_fenced) when the claim no longer owns
-- the record — a newer attempt took it over, or it was released, replaced or purged — and
-- IP002 for a malformed reference. Raising aborts the backend's transaction: its order and
-- outbox event roll back with it.

-- The digest of an answer, as the sidecar computes it over the response it received
-- (store/answer_digest.cpp): the backend sends it back in X-Idempotency-Recorded, so the
-- sidecar confirms that the record holds this very answer without reading it back.
CREATE FUNCTION idemproxy_answer_digest(p_status integer, p_resource_id text, p_body bytea)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT encode(sha256(
           convert_to('idemproxy-answer/1' || E'\n' || p_status::text || E'\n' ||
                      coalesce(p_resource_id, '') || E'\n', 'UTF8') ||
           coalesce(p_body, '\x'::bytea)), 'hex')
$$;

-- The record and claim a reference names, as (endpoint, key, fence, retention).
CREATE FUNCTION idemproxy_parse_record(p_record text,
                                       OUT endpoint text, OUT idempotency_key text,
                                       OUT fencing_token bigint, OUT retention_ms bigint)
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
  parts text[] := string_to_array(p_record, '.');
BEGIN
  -- coalesce: an empty reference splits into no parts, and every test on them is NULL.
  IF coalesce(array_length(parts, 1), 0) <> 5 OR parts[1] IS DISTINCT FROM 'v1'
     OR parts[2] !~ '^[1-9][0-9]{0,18}$' OR parts[3] !~ '^[0-9]{1,15}$'
     OR parts[4] !~ '^([0-9a-f]{2})+$' OR parts[5] !~ '^([0-9a-f]{2})+$' THEN
    RAISE EXCEPTION 'idemproxy: malformed record reference'
      USING ERRCODE = 'IP002';
  END IF;
  endpoint := convert_from(decode(parts[4], 'hex'), 'UTF8');
  idempotency_key := convert_from(decode(parts[5], 'hex'), 'UTF8');
  fencing_token := parts[2]::bigint;
  retention_ms := parts[3]::bigint;
END
$$;

-- For backends that want the fencing check before their own writes: succeeds only while
-- this claim owns the record, and then locks the row until the transaction ends, so no
-- takeover can slip in between this check and the commit.
CREATE FUNCTION idemproxy_assert_owner(p_tenant text, p_record text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  ref record := idemproxy_parse_record(p_record);
BEGIN
  PERFORM 1 FROM idempotency_requests r
  WHERE r.tenant_id = p_tenant AND r.endpoint = ref.endpoint
    AND r.idempotency_key = ref.idempotency_key
    AND r.fencing_token = ref.fencing_token AND r.state = 'in_progress'
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'idemproxy: this attempt no longer owns the idempotency record'
      USING ERRCODE = 'IP001',
            HINT = 'a newer attempt of the operation owns it; roll back';
  END IF;
END
$$;

-- Completes the record with the answer the backend is about to send, if and only if this
-- claim still owns it; returns the answer's digest for X-Idempotency-Recorded. The same
-- UPDATE the sidecar runs in sidecar mode (store/pg_store.cpp, kCompleteSql): guarded by
-- the fencing token and the in-progress state, retention counted from the completion.
-- Headers are the stored form: a jsonb array of [name, value] pairs
-- (store/header_codec.hpp), replayed as given.
CREATE FUNCTION idemproxy_complete(p_tenant text, p_record text, p_status integer,
                                   p_headers jsonb, p_body bytea, p_resource_id text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
  ref record := idemproxy_parse_record(p_record);
BEGIN
  IF p_status IS NULL OR p_status < 100 OR p_status > 599 THEN
    RAISE EXCEPTION 'idemproxy: the status must be an HTTP status (100-599)'
      USING ERRCODE = '22023';
  END IF;
  IF p_headers IS NOT NULL AND jsonb_typeof(p_headers) <> 'array' THEN
    RAISE EXCEPTION 'idemproxy: the headers must be a jsonb array of [name, value] pairs'
      USING ERRCODE = '22023';
  END IF;
  UPDATE idempotency_requests r
  SET state = 'completed',
      response_status = p_status,
      response_headers = coalesce(p_headers, '[]'::jsonb),
      response_body = coalesce(p_body, '\x'::bytea),
      response_body_omitted = false,
      resource_id = NULLIF(p_resource_id, ''),
      completed_at = now(),
      expires_at = now() + ref.retention_ms * interval '1 millisecond',
      lease_expires_at = NULL
  WHERE r.tenant_id = p_tenant AND r.endpoint = ref.endpoint
    AND r.idempotency_key = ref.idempotency_key
    AND r.fencing_token = ref.fencing_token AND r.state = 'in_progress';
  IF NOT FOUND THEN
    RAISE EXCEPTION 'idemproxy: this attempt no longer owns the idempotency record'
      USING ERRCODE = 'IP001',
            HINT = 'a newer attempt of the operation owns it; roll back';
  END IF;
  RETURN idemproxy_answer_digest(p_status, NULLIF(p_resource_id, ''), coalesce(p_body, '\x'::bytea));
END
$$;
