-- The W3C trace id of the request whose answer a record holds (docs/http.md, "Trace
-- context"): a replay names the original's trace (X-Idempotency-Trace-Id, the access log's
-- record_trace_id), so the first answer and every replay of it lead to one trace.
--
-- Written by the sidecar's completion; NULL for records completed before this migration
-- and for those a backend completes itself (completion: backend), which know no trace.
-- Adding a nullable column without a default rewrites nothing: instant on a large table.
ALTER TABLE idempotency_requests
  ADD COLUMN trace_id text
  CONSTRAINT idempotency_requests_trace_id_format CHECK (trace_id ~ '^[0-9a-f]{32}$');
