-- The operation status resource of long operations (routes with `async`, docs/http.md):
-- a client that got 202 Accepted reads GET <status_path with the operation id>. The
-- operation id is a SHA-256 of (tenant, endpoint, key) (idemproxy_operation_id, 0002), so
-- it names a record without carrying its raw key, and cannot be turned back into one.
--
-- This table is the way back: operation id -> record, written only when a 202 is about to
-- go out (the slow path), never on a claim, so new keys on other routes pay nothing for it.
-- The lookup is by (tenant_id, operation_id): a request of another tenant finds nothing,
-- exactly as for an unknown id. Because the id is derived from the record's own key, an
-- entry can never point to the wrong record; it goes with its record (ON DELETE CASCADE:
-- release, purge, retention cleanup), and a later claim of the same key registers it again.
CREATE TABLE idempotency_operations (
  tenant_id        text NOT NULL,
  operation_id     text NOT NULL,
  endpoint         text NOT NULL,
  idempotency_key  text NOT NULL,
  PRIMARY KEY (tenant_id, operation_id),
  FOREIGN KEY (tenant_id, endpoint, idempotency_key)
    REFERENCES idempotency_requests (tenant_id, endpoint, idempotency_key) ON DELETE CASCADE
);

-- The cascade looks entries up by their record: without this index every delete of a
-- record (cleanup deletes many) would scan the table.
CREATE INDEX idempotency_operations_record
  ON idempotency_operations (tenant_id, endpoint, idempotency_key);
