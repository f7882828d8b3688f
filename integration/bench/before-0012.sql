-- integration/bench/cycle-instructions variant: the record table as 0011 left it, with
-- its one CHECK constraint (0012 dropped it), to count what the drop saves per write cycle.
ALTER TABLE idempotency_requests
  ADD CONSTRAINT idempotency_requests_record_check CHECK (
    CASE state
      WHEN 'in_progress' THEN lease_expires_at IS NOT NULL
      WHEN 'completed' THEN response_status IS NOT NULL AND completed_at IS NOT NULL
      ELSE false
    END
    AND attempt_token > 0
    AND octet_length(trace_id) = 32 AND trace_id ~ '^[0-9a-f]*$'
  );
